//! Medians with spread over rounds.

use std::fmt;

/// Median, minimum and maximum of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Median (mean of the two middle samples for an even count).
    pub median: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Number of samples.
    pub n: usize,
}

impl Summary {
    /// Summarises `samples`; `None` when there is no finite sample. Non-finite samples are
    /// ignored.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let mut xs: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if xs.is_empty() {
            return None;
        }
        xs.sort_by(f64::total_cmp);
        let n = xs.len();
        let median = if n % 2 == 1 {
            xs[n / 2]
        } else {
            (xs[n / 2 - 1] + xs[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: xs[0],
            max: xs[n - 1],
            n,
        })
    }

    /// Spread `(max - min) / median` in percent (0 for a single sample).
    pub fn spread_pct(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / self.median * 100.0
        }
    }
}

/// Ratios of paired samples `num[i] / den[i]` (same round), skipping pairs with a zero or
/// missing denominator.
pub fn paired_ratios(num: &[f64], den: &[f64]) -> Vec<f64> {
    num.iter()
        .zip(den)
        .filter(|(_, d)| **d > 0.0)
        .map(|(n, d)| n / d)
        .collect()
}

/// A rate with an SI suffix: `47.1 M`, `965`, `3.70 k`.
#[derive(Debug, Clone, Copy)]
pub struct Si(pub f64);

impl fmt::Display for Si {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let x = self.0;
        let (v, unit) = if x >= 1e9 {
            (x / 1e9, " G")
        } else if x >= 1e6 {
            (x / 1e6, " M")
        } else if x >= 1e3 {
            (x / 1e3, " k")
        } else {
            (x, "")
        };
        let s = if v >= 100.0 {
            format!("{v:.0}{unit}")
        } else if v >= 10.0 {
            format!("{v:.1}{unit}")
        } else {
            format!("{v:.2}{unit}")
        };
        f.pad(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = Summary::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (3.0, 1.0, 5.0, 3));
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 4.0, 4));
    }

    #[test]
    fn empty_and_non_finite_samples() {
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(Summary::of(&[f64::NAN]), None);
        let s = Summary::of(&[f64::INFINITY, 2.0, f64::NAN]).unwrap();
        assert_eq!((s.median, s.n), (2.0, 1));
    }

    #[test]
    fn spread_is_relative_to_the_median() {
        let s = Summary::of(&[90.0, 100.0, 110.0]).unwrap();
        assert!((s.spread_pct() - 20.0).abs() < 1e-9);
        assert_eq!(Summary::of(&[7.0]).unwrap().spread_pct(), 0.0);
    }

    #[test]
    fn ratios_pair_rounds_and_skip_zero_denominators() {
        assert_eq!(
            paired_ratios(&[10.0, 20.0, 30.0], &[5.0, 0.0, 10.0]),
            vec![2.0, 3.0]
        );
        assert_eq!(paired_ratios(&[1.0, 2.0], &[1.0]), vec![1.0]);
    }

    #[test]
    fn si_formatting() {
        assert_eq!(Si(47_100_000.0).to_string(), "47.1 M");
        assert_eq!(Si(965.0).to_string(), "965");
        assert_eq!(Si(3_700.0).to_string(), "3.70 k");
        assert_eq!(format!("{:>8}", Si(2.0e9)), "  2.00 G");
    }
}
