//! Frequencies, periods and calendar arithmetic, following pandas' `Period`.
//!
//! GluonTS turns every `start` string into a `pandas.Period` of the dataset's
//! frequency. A period is an integer *ordinal* counted in base units of the
//! frequency ("h" counts hours since 1970-01-01 00:00, "M" months since
//! 1970-01); a multiple such as "2h" keeps the base-unit ordinal and steps by 2.
//! The calendar fields pandas reports for a period (hour, day, month, ...) are
//! those of its *start* for sub-daily units and of its *last day* for weekly,
//! monthly, quarterly and yearly units (`Period("2020-01", "M").day == 31`).
//! This module reproduces exactly that, without any date crate.

use std::fmt;
use std::str::FromStr;

use crate::error::TimeError;

/// Base unit of a frequency string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FreqUnit {
    /// `"s"` / `"S"`: seconds.
    Second,
    /// `"min"` / `"T"`: minutes.
    Minute,
    /// `"h"` / `"H"`: hours.
    Hour,
    /// `"D"`: calendar days.
    Day,
    /// `"W"` / `"W-SUN"`, `"W-MON"`, ...: weeks ending on the given weekday
    /// (`0` = Monday ... `6` = Sunday, the default).
    Week(u8),
    /// `"M"` / `"ME"` / `"MS"`: calendar months.
    Month,
    /// `"Q"` / `"QE"` / `"QS"` / `"Q-DEC"`: calendar quarters (ending in December).
    Quarter,
    /// `"Y"` / `"A"` / `"YE"` / `"YS"` / `"A-DEC"`: calendar years.
    Year,
}

/// A frequency: a base unit and a positive multiple (`"15min"`, `"2h"`, `"W"`).
///
/// # Examples
/// ```
/// use shmpipe_timeseries::{Freq, FreqUnit};
/// let f: Freq = "2h".parse().unwrap();
/// assert_eq!(f.unit, FreqUnit::Hour);
/// assert_eq!(f.multiple, 2);
/// assert!("3B".parse::<Freq>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Freq {
    /// Base unit.
    pub unit: FreqUnit,
    /// Step between consecutive periods, in base units (at least 1).
    pub multiple: u32,
}

const WEEKDAYS: [&str; 7] = ["MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"];

impl FromStr for Freq {
    type Err = TimeError;

    fn from_str(s: &str) -> Result<Self, TimeError> {
        let s = s.trim();
        let digits = s.bytes().take_while(u8::is_ascii_digit).count();
        let multiple = if digits == 0 {
            1
        } else {
            s[..digits]
                .parse::<u32>()
                .map_err(|_| TimeError::BadFreq(s.to_owned()))?
        };
        if multiple == 0 {
            return Err(TimeError::BadFreq(s.to_owned()));
        }
        let rest = &s[digits..];
        let (base, anchor) = match rest.split_once('-') {
            Some((b, a)) => (b, Some(a)),
            None => (rest, None),
        };
        let unit = match (base, anchor) {
            ("s" | "S", None) => FreqUnit::Second,
            ("min" | "T", None) => FreqUnit::Minute,
            ("h" | "H", None) => FreqUnit::Hour,
            ("D", None) => FreqUnit::Day,
            ("W", None) => FreqUnit::Week(6),
            ("W", Some(a)) => {
                let a = a.to_ascii_uppercase();
                let day = WEEKDAYS
                    .iter()
                    .position(|d| *d == a)
                    .ok_or_else(|| TimeError::BadFreq(s.to_owned()))?;
                FreqUnit::Week(day as u8)
            }
            ("M" | "ME" | "MS", None) => FreqUnit::Month,
            ("Q" | "QE" | "QS", None | Some("DEC")) => FreqUnit::Quarter,
            ("Y" | "A" | "YE" | "YS" | "AS", None | Some("DEC")) => FreqUnit::Year,
            _ => return Err(TimeError::BadFreq(s.to_owned())),
        };
        Ok(Freq { unit, multiple })
    }
}

impl fmt::Display for Freq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.multiple != 1 {
            write!(f, "{}", self.multiple)?;
        }
        match self.unit {
            FreqUnit::Second => f.write_str("s"),
            FreqUnit::Minute => f.write_str("min"),
            FreqUnit::Hour => f.write_str("h"),
            FreqUnit::Day => f.write_str("D"),
            FreqUnit::Week(a) => write!(f, "W-{}", WEEKDAYS[a as usize]),
            FreqUnit::Month => f.write_str("M"),
            FreqUnit::Quarter => f.write_str("Q-DEC"),
            FreqUnit::Year => f.write_str("Y-DEC"),
        }
    }
}

/// A naive (time-zone free) date and time, to the second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DateTime {
    /// Days since 1970-01-01.
    pub days: i64,
    /// Seconds since midnight, in range `0 .. 86400`.
    pub secs: u32,
}

impl DateTime {
    /// Parses `YYYY`, `YYYY-MM`, `YYYY-MM-DD`, optionally followed by `T` or a space
    /// and `HH`, `HH:MM` or `HH:MM:SS[.fff]`, and an optional `Z` or `+00:00`.
    ///
    /// # Errors
    /// [`TimeError::BadTimestamp`] for anything else or an impossible date.
    ///
    /// # Examples
    /// ```
    /// use shmpipe_timeseries::DateTime;
    /// let t = DateTime::parse("1970-01-02 01:00:05").unwrap();
    /// assert_eq!((t.days, t.secs), (1, 3605));
    /// assert_eq!(t.to_string(), "1970-01-02 01:00:05");
    /// ```
    pub fn parse(s: &str) -> Result<DateTime, TimeError> {
        let bad = || TimeError::BadTimestamp(s.to_owned());
        let b = s.trim().as_bytes();
        let mut i = 0;
        let num = |i: &mut usize, n: usize| -> Result<u32, TimeError> {
            if *i + n > b.len() || !b[*i..*i + n].iter().all(u8::is_ascii_digit) {
                return Err(bad());
            }
            let v = b[*i..*i + n]
                .iter()
                .fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0'));
            *i += n;
            Ok(v)
        };
        let year = num(&mut i, 4)? as i64;
        let (mut month, mut day) = (1, 1);
        let (mut h, mut m, mut sec) = (0, 0, 0);
        if i < b.len() && b[i] == b'-' {
            i += 1;
            month = num(&mut i, 2)?;
            if i < b.len() && b[i] == b'-' {
                i += 1;
                day = num(&mut i, 2)?;
                if i < b.len() && (b[i] == b'T' || b[i] == b' ') {
                    i += 1;
                    h = num(&mut i, 2)?;
                    if i < b.len() && b[i] == b':' {
                        i += 1;
                        m = num(&mut i, 2)?;
                        if i < b.len() && b[i] == b':' {
                            i += 1;
                            sec = num(&mut i, 2)?;
                            if i < b.len() && b[i] == b'.' {
                                i += 1;
                                let start = i;
                                while i < b.len() && b[i].is_ascii_digit() {
                                    i += 1;
                                }
                                if i == start {
                                    return Err(bad());
                                }
                            }
                        }
                    }
                }
            }
        }
        match &b[i..] {
            b"" | b"Z" | b"+00:00" | b"+0000" => {}
            _ => return Err(bad()),
        }
        if !(1..=12).contains(&month)
            || day < 1
            || day > days_in_month(year, month)
            || h > 23
            || m > 59
            || sec > 59
        {
            return Err(bad());
        }
        Ok(DateTime {
            days: days_from_civil(year, month, day),
            secs: h * 3600 + m * 60 + sec,
        })
    }

    /// Calendar date `(year, month 1..=12, day 1..=31)`.
    pub fn date(&self) -> (i64, u32, u32) {
        civil_from_days(self.days)
    }
}

impl fmt::Display for DateTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, mo, d) = civil_from_days(self.days);
        write!(
            f,
            "{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}",
            self.secs / 3600,
            self.secs / 60 % 60,
            self.secs % 60
        )
    }
}

/// A pandas-compatible period: a frequency and an ordinal in base units.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::Period;
/// let p = Period::parse("2020-01-15 05:30:12", "h".parse().unwrap()).unwrap();
/// assert_eq!(p.ordinal, 438_629); // hours since the epoch, as in pandas
/// assert_eq!(p.shifted(3).start_time().to_string(), "2020-01-15 08:00:00");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Period {
    /// The frequency.
    pub freq: Freq,
    /// Base units since the epoch, with pandas' convention per unit.
    pub ordinal: i64,
}

impl Period {
    /// The period of frequency `freq` that contains the timestamp `s`.
    ///
    /// # Errors
    /// [`TimeError::BadTimestamp`] if `s` cannot be parsed.
    pub fn parse(s: &str, freq: Freq) -> Result<Period, TimeError> {
        Ok(Period::containing(DateTime::parse(s)?, freq))
    }

    /// The period of frequency `freq` that contains `t`.
    pub fn containing(t: DateTime, freq: Freq) -> Period {
        let secs = i64::from(t.secs);
        let ordinal = match freq.unit {
            FreqUnit::Second => t.days * 86_400 + secs,
            FreqUnit::Minute => t.days * 1_440 + secs / 60,
            FreqUnit::Hour => t.days * 24 + secs / 3_600,
            FreqUnit::Day => t.days,
            FreqUnit::Week(a) => {
                let end = t.days + (i64::from(a) - weekday(t.days)).rem_euclid(7);
                (end + 4).div_euclid(7)
            }
            FreqUnit::Month | FreqUnit::Quarter | FreqUnit::Year => {
                let (y, m, _) = civil_from_days(t.days);
                let months = (y - 1970) * 12 + i64::from(m) - 1;
                match freq.unit {
                    FreqUnit::Month => months,
                    FreqUnit::Quarter => months.div_euclid(3),
                    _ => y - 1970,
                }
            }
        };
        Period { freq, ordinal }
    }

    /// This period moved by `k` steps of the frequency (`k * multiple` base units),
    /// like `period + k` in pandas (also available as `period + k`).
    pub fn shifted(self, k: i64) -> Period {
        Period {
            freq: self.freq,
            ordinal: self.ordinal + k * i64::from(self.freq.multiple),
        }
    }

    /// First instant of the period (pandas' `start_time`, to the second).
    pub fn start_time(&self) -> DateTime {
        let o = self.ordinal;
        let split = |secs: i64| DateTime {
            days: secs.div_euclid(86_400),
            secs: secs.rem_euclid(86_400) as u32,
        };
        match self.freq.unit {
            FreqUnit::Second => split(o),
            FreqUnit::Minute => split(o * 60),
            FreqUnit::Hour => split(o * 3_600),
            FreqUnit::Day => DateTime { days: o, secs: 0 },
            FreqUnit::Week(a) => DateTime {
                days: week_end_day(o, a) - 6,
                secs: 0,
            },
            FreqUnit::Month => DateTime {
                days: month_start_day(o),
                secs: 0,
            },
            FreqUnit::Quarter => DateTime {
                days: month_start_day(o * 3),
                secs: 0,
            },
            FreqUnit::Year => DateTime {
                days: month_start_day(o * 12),
                secs: 0,
            },
        }
    }

    /// The instant whose calendar fields pandas reports for this period: the
    /// start for sub-daily and daily units, the last day for longer units.
    pub fn field_time(&self) -> DateTime {
        let o = self.ordinal;
        let last_day = |month_ordinal: i64| month_start_day(month_ordinal + 1) - 1;
        match self.freq.unit {
            FreqUnit::Week(a) => DateTime {
                days: week_end_day(o, a),
                secs: 0,
            },
            FreqUnit::Month => DateTime {
                days: last_day(o),
                secs: 0,
            },
            FreqUnit::Quarter => DateTime {
                days: last_day(o * 3 + 2),
                secs: 0,
            },
            FreqUnit::Year => DateTime {
                days: last_day(o * 12 + 11),
                secs: 0,
            },
            _ => self.start_time(),
        }
    }
}

impl std::ops::Add<i64> for Period {
    type Output = Period;

    /// [`Period::shifted`].
    fn add(self, k: i64) -> Period {
        self.shifted(k)
    }
}

impl fmt::Display for Period {
    /// Formats as the period's start time.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.start_time().fmt(f)
    }
}

/// Last day (days since epoch) of weekly period `ordinal` ending on weekday `a`.
fn week_end_day(ordinal: i64, a: u8) -> i64 {
    // Day `7 * ordinal - 4` is a Sunday; the period ends on the first day
    // `>=` it that falls on weekday `a` (pandas' ordinal convention).
    7 * ordinal - 4 + (i64::from(a) - 6).rem_euclid(7)
}

/// First day of month `m` counted from 1970-01.
fn month_start_day(m: i64) -> i64 {
    days_from_civil(1970 + m.div_euclid(12), m.rem_euclid(12) as u32 + 1, 1)
}

/// Weekday of a day since the epoch, Monday = 0 (1970-01-01 was a Thursday).
pub fn weekday(days: i64) -> i64 {
    (days + 3).rem_euclid(7)
}

/// Whether `y` is a Gregorian leap year.
pub fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Number of days in month `m` (1..=12) of year `y`.
pub fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's algorithm:
/// count in 400-year eras of 146097 days, with years starting in March).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // 0..=399
    let mp = (i64::from(m) + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1; // 0..=365
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // 0..=146096
    era * 146_097 + doe - 719_468
}

/// Inverse of [`days_from_civil`]: `(year, month, day)`.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Calendar fields of one day, as pandas reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DayFields {
    /// Monday = 0 ... Sunday = 6.
    pub day_of_week: u32,
    /// 1..=31.
    pub day_of_month: u32,
    /// 1..=366.
    pub day_of_year: u32,
    /// 1..=12.
    pub month: u32,
    /// ISO 8601 week number, 1..=53.
    pub iso_week: u32,
}

impl DayFields {
    /// Fields of day `days` since the epoch.
    pub fn of(days: i64) -> DayFields {
        let (y, m, d) = civil_from_days(days);
        let doy = (days - days_from_civil(y, 1, 1)) as u32 + 1;
        let dow = weekday(days) as u32;
        // ISO week: the week (Mon..Sun) containing the year's first Thursday is week 1.
        let w = (doy as i64 - (dow as i64 + 1) + 10) / 7;
        let iso_week = if w < 1 {
            iso_weeks_in_year(y - 1)
        } else if w > i64::from(iso_weeks_in_year(y)) {
            1
        } else {
            w as u32
        };
        DayFields {
            day_of_week: dow,
            day_of_month: d,
            day_of_year: doy,
            month: m,
            iso_week,
        }
    }
}

/// 52 or 53: a year has 53 ISO weeks when it starts on a Thursday, or on a
/// Wednesday in a leap year.
fn iso_weeks_in_year(y: i64) -> u32 {
    let jan1 = weekday(days_from_civil(y, 1, 1));
    if jan1 == 3 || (jan1 == 2 && is_leap(y)) {
        53
    } else {
        52
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_roundtrip_over_centuries() {
        for z in (-800_000..800_000).step_by(97) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
            assert!(d <= days_in_month(y, m));
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn week_ordinals_match_pandas() {
        // pandas: Period("1970-01-01", "W-<a>").ordinal for Mon..Sun.
        let expected = [1, 1, 1, 0, 0, 0, 1];
        let t = DateTime::parse("1970-01-01").unwrap();
        for (a, e) in expected.iter().enumerate() {
            let f = Freq {
                unit: FreqUnit::Week(a as u8),
                multiple: 1,
            };
            let p = Period::containing(t, f);
            assert_eq!(p.ordinal, *e, "anchor {a}");
            assert!(p.start_time().days <= 0 && p.field_time().days >= 0);
            assert_eq!(weekday(p.field_time().days), i64::from(a as u8));
        }
    }

    #[test]
    fn iso_weeks_at_year_boundaries() {
        // 2020-12-31 (Thu) is in week 53; 2021-01-03 (Sun) too; 2021-01-04 week 1.
        let d = |y, m, d| DayFields::of(days_from_civil(y, m, d)).iso_week;
        assert_eq!(d(2020, 12, 31), 53);
        assert_eq!(d(2021, 1, 3), 53);
        assert_eq!(d(2021, 1, 4), 1);
        assert_eq!(d(2019, 12, 30), 1);
        assert_eq!(d(2016, 1, 1), 53);
    }

    #[test]
    fn rejects_bad_inputs() {
        assert!(DateTime::parse("2021-02-29").is_err());
        assert!(DateTime::parse("2021-13-01").is_err());
        assert!(DateTime::parse("2021-01-01 25:00").is_err());
        assert!(DateTime::parse("2021-01-01 10:00+02:00").is_err());
        assert!("0h".parse::<Freq>().is_err());
        assert!("W-XYZ".parse::<Freq>().is_err());
    }
}
