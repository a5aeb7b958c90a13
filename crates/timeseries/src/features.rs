//! Time features (`gluonts.time_feature`): calendar fields scaled to `[-0.5, 0.5]`.

use crate::period::{DayFields, Freq, FreqUnit, Period};

/// One calendar feature, scaled as GluonTS scales it: `x / (num - 1) - 0.5`
/// with `x` zero-based (computed in `f64`, then rounded to `f32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

/// Writes features `feats` of the `len` periods starting at `start` into `out`,
/// row-major `(feats.len(), len)`.
///
/// Calendar fields are recomputed only when the day changes, so hourly and
/// finer series cost a few operations per point.
///
/// # Panics
/// If `out.len() != feats.len() * len`.
pub fn fill_time_features(start: Period, len: usize, feats: &[TimeFeature], out: &mut [f32]) {
    assert_eq!(out.len(), feats.len() * len);
    if feats.is_empty() || len == 0 {
        return;
    }
    let mut cached_day = i64::MIN;
    let mut day = DayFields::of(0);
    for t in 0..len {
        let ft = start.add(t as i64).field_time();
        if ft.days != cached_day {
            cached_day = ft.days;
            day = DayFields::of(ft.days);
        }
        for (k, &f) in feats.iter().enumerate() {
            let (x, num) = f.raw(ft.secs, &day);
            out[k * len + t] = (f64::from(x) / f64::from(num - 1) - 0.5) as f32;
        }
    }
}
