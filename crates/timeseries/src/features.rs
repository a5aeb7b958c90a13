//! Time features (`gluonts.time_feature`): calendar fields scaled to `[-0.5, 0.5]`.

use std::sync::OnceLock;

use crate::period::{DayFields, Freq, FreqUnit, Period};

/// One calendar feature, scaled as GluonTS scales it: `x / (num - 1) - 0.5`
/// with `x` zero-based (computed in `f64`, then rounded to `f32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TimeFeature {
    /// `second / 59 - 0.5`.
    SecondOfMinute,
    /// `minute / 59 - 0.5`.
    MinuteOfHour,
    /// `hour / 23 - 0.5`.
    HourOfDay,
    /// `weekday / 6 - 0.5`, Monday = 0.
    DayOfWeek,
    /// `(day - 1) / 30 - 0.5`.
    DayOfMonth,
    /// `(day_of_year - 1) / 365 - 0.5`.
    DayOfYear,
    /// `(month - 1) / 11 - 0.5`.
    MonthOfYear,
    /// `(iso_week - 1) / 52 - 0.5`.
    WeekOfYear,
}

impl TimeFeature {
    /// GluonTS's function name (`"hour_of_day"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TimeFeature::SecondOfMinute => "second_of_minute",
            TimeFeature::MinuteOfHour => "minute_of_hour",
            TimeFeature::HourOfDay => "hour_of_day",
            TimeFeature::DayOfWeek => "day_of_week",
            TimeFeature::DayOfMonth => "day_of_month",
            TimeFeature::DayOfYear => "day_of_year",
            TimeFeature::MonthOfYear => "month_of_year",
            TimeFeature::WeekOfYear => "week_of_year",
        }
    }

    /// `(zero-based value, num)` for a period with field time `secs` of day and `day` fields.
    fn raw(self, secs: u32, day: &DayFields) -> (u32, u32) {
        match self {
            TimeFeature::SecondOfMinute => (secs % 60, 60),
            TimeFeature::MinuteOfHour => (secs / 60 % 60, 60),
            TimeFeature::HourOfDay => (secs / 3600, 24),
            TimeFeature::DayOfWeek => (day.day_of_week, 7),
            TimeFeature::DayOfMonth => (day.day_of_month - 1, 31),
            TimeFeature::DayOfYear => (day.day_of_year - 1, 366),
            TimeFeature::MonthOfYear => (day.month - 1, 12),
            TimeFeature::WeekOfYear => (day.iso_week - 1, 53),
        }
    }
}

/// GluonTS's `time_features_from_frequency_str`: the features for a frequency.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::features::{time_features_for, TimeFeature::*};
/// assert_eq!(time_features_for("h".parse().unwrap()), [HourOfDay, DayOfWeek, DayOfMonth, DayOfYear]);
/// assert!(time_features_for("Y".parse().unwrap()).is_empty());
/// ```
pub fn time_features_for(freq: Freq) -> Vec<TimeFeature> {
    use TimeFeature::*;
    match freq.unit {
        FreqUnit::Year => vec![],
        FreqUnit::Quarter | FreqUnit::Month => vec![MonthOfYear],
        FreqUnit::Week(_) => vec![DayOfMonth, WeekOfYear],
        FreqUnit::Day => vec![DayOfWeek, DayOfMonth, DayOfYear],
        FreqUnit::Hour => vec![HourOfDay, DayOfWeek, DayOfMonth, DayOfYear],
        FreqUnit::Minute => vec![MinuteOfHour, HourOfDay, DayOfWeek, DayOfMonth, DayOfYear],
        FreqUnit::Second => vec![
            SecondOfMinute,
            MinuteOfHour,
            HourOfDay,
            DayOfWeek,
            DayOfMonth,
            DayOfYear,
        ],
    }
}

/// `x / (num - 1) - 0.5` for every `x` in `0..num`, per feature, computed once.
fn tables() -> &'static [Vec<f32>; 8] {
    static TABLES: OnceLock<[Vec<f32>; 8]> = OnceLock::new();
    TABLES.get_or_init(|| {
        let t = |num: u32| -> Vec<f32> {
            (0..num)
                .map(|x| (f64::from(x) / f64::from(num - 1) - 0.5) as f32)
                .collect()
        };
        [t(60), t(60), t(24), t(7), t(31), t(366), t(12), t(53)]
    })
}

impl TimeFeature {
    fn index(self) -> usize {
        self as usize
    }
}

/// Writes features `feats` of the `len` periods starting at `start` into `out`,
/// row-major `(feats.len(), len)`.
///
/// Values come from tables of `x / (num - 1) - 0.5` computed in `f64` (exactly
/// GluonTS's arithmetic); calendar fields are recomputed only when the day
/// changes, so a point costs a few integer operations.
///
/// # Panics
/// If `out.len() != feats.len() * len`.
pub fn fill_time_features(start: Period, len: usize, feats: &[TimeFeature], out: &mut [f32]) {
    assert_eq!(out.len(), feats.len() * len);
    fill_time_features_strided(start, len, feats, out, len, 1);
}

/// Like [`fill_time_features`], writing feature `k` of period `t` to
/// `out[k * k_stride + t * t_stride]` (so `k_stride = 1`, `t_stride = cols`
/// writes a transposed `(len, cols)` block).
///
/// # Panics
/// If an index falls outside `out`.
pub fn fill_time_features_strided(
    start: Period,
    len: usize,
    feats: &[TimeFeature],
    out: &mut [f32],
    k_stride: usize,
    t_stride: usize,
) {
    if feats.is_empty() || len == 0 {
        return;
    }
    let tables = tables();
    let unit_secs = match start.freq.unit {
        FreqUnit::Second => Some(1),
        FreqUnit::Minute => Some(60),
        FreqUnit::Hour => Some(3_600),
        FreqUnit::Day => Some(86_400),
        _ => None,
    };
    let Some(unit) = unit_secs else {
        // Calendar units: one period at a time.
        let mut cached_day = i64::MIN;
        let mut day = DayFields::of(0);
        for t in 0..len {
            let ft = start.shifted(t as i64).field_time();
            if ft.days != cached_day {
                cached_day = ft.days;
                day = DayFields::of(ft.days);
            }
            for (k, &f) in feats.iter().enumerate() {
                out[k * k_stride + t * t_stride] =
                    tables[f.index()][f.raw(ft.secs, &day).0 as usize];
            }
        }
        return;
    };
    // Fixed-length periods: walk the clock one day segment at a time; day-level
    // features are constant over a segment.
    let step = unit * i64::from(start.freq.multiple);
    let st = start.field_time();
    let (mut days, mut secs) = (st.days, i64::from(st.secs));
    let mut t = 0;
    while t < len {
        let day = DayFields::of(days);
        // Points left in this day: secs, secs + step, ... < 86400.
        let n = (((86_400 - secs) + step - 1) / step).max(1) as usize;
        let n = n.min(len - t);
        for (k, &f) in feats.iter().enumerate() {
            let table = &tables[f.index()];
            let base = k * k_stride;
            match f {
                TimeFeature::SecondOfMinute
                | TimeFeature::MinuteOfHour
                | TimeFeature::HourOfDay => {
                    let mut s = secs;
                    for j in 0..n {
                        out[base + (t + j) * t_stride] = table[f.raw(s as u32, &day).0 as usize];
                        s += step;
                    }
                }
                _ => {
                    let v = table[f.raw(0, &day).0 as usize];
                    for j in 0..n {
                        out[base + (t + j) * t_stride] = v;
                    }
                }
            }
        }
        t += n;
        secs += n as i64 * step;
        days += secs / 86_400;
        secs %= 86_400;
    }
}
