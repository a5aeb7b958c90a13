//! The goals, checked from the figures of one run and printed as met / NOT met (or
//! "not measured" when the run has no data for one, e.g. iceoryx2 not built).

use std::fmt::Write as _;

/// Which side of the target a goal asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `measured >= target` (a rate ratio).
    AtLeast,
    /// `measured <= target` (a latency ratio, a size, a CPU share).
    AtMost,
}

/// One goal and what the run measured for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Goal {
    /// What is asked, e.g. `16 f32: shm-typed msgs/s >= 0.5x ring-min`.
    pub text: String,
    /// The measured figure, `None` when the run has no data for it.
    pub measured: Option<f64>,
    /// The figure asked for.
    pub target: f64,
    /// Above or below the target.
    pub cmp: Cmp,
    /// Unit of `measured` and `target` as printed after the number (`x`, ` MiB`, `%`).
    pub unit: &'static str,
    /// Why there is no measurement (printed when `measured` is `None`).
    pub missing: String,
}

impl Goal {
    /// A goal on a ratio that must reach `target` (`x` unit).
    pub fn at_least(text: impl Into<String>, measured: Option<f64>, target: f64) -> Goal {
        Goal {
            text: text.into(),
            measured,
            target,
            cmp: Cmp::AtLeast,
            unit: "x",
            missing: String::new(),
        }
    }

    /// A goal on a figure that must stay at or below `target` (`x` unit unless changed).
    pub fn at_most(text: impl Into<String>, measured: Option<f64>, target: f64) -> Goal {
        Goal {
            cmp: Cmp::AtMost,
            ..Goal::at_least(text, measured, target)
        }
    }

    /// The same goal with another unit.
    pub fn unit(mut self, unit: &'static str) -> Goal {
        self.unit = unit;
        self
    }

    /// The same goal, saying why it may not be measured.
    pub fn missing(mut self, why: impl Into<String>) -> Goal {
        self.missing = why.into();
        self
    }

    /// `Some(true)` when met, `Some(false)` when not, `None` when not measured.
    pub fn met(&self) -> Option<bool> {
        let m = self.measured.filter(|m| m.is_finite())?;
        Some(match self.cmp {
            Cmp::AtLeast => m >= self.target,
            Cmp::AtMost => m <= self.target,
        })
    }
}

fn number(v: f64, unit: &str) -> String {
    if unit == "x" {
        format!("{v:.3}x")
    } else if v.abs() >= 100.0 {
        format!("{v:.0}{unit}")
    } else {
        format!("{v:.2}{unit}")
    }
}

/// The goals as text, one per line: "met", "NOT met" or "not measured", what is asked, the
/// measured figure and the target.
pub fn goals_text(goals: &[Goal]) -> String {
    let w = goals.iter().map(|g| g.text.len()).max().unwrap_or(0);
    let mut out = String::new();
    for g in goals {
        let verdict = match g.met() {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not measured",
        };
        let op = match g.cmp {
            Cmp::AtLeast => ">=",
            Cmp::AtMost => "<=",
        };
        let measured = match g.measured.filter(|m| m.is_finite()) {
            Some(m) => format!("measured {}", number(m, g.unit)),
            None if g.missing.is_empty() => "no data in this run".to_string(),
            None => g.missing.clone(),
        };
        let _ = writeln!(
            out,
            "  {verdict:<12} {:<w$}  {measured} (target {op} {})",
            g.text,
            number(g.target, g.unit)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_the_direction() {
        assert_eq!(Goal::at_least("a", Some(2.0), 1.0).met(), Some(true));
        assert_eq!(Goal::at_least("a", Some(0.5), 1.0).met(), Some(false));
        assert_eq!(Goal::at_most("a", Some(0.5), 1.0).met(), Some(true));
        assert_eq!(Goal::at_most("a", Some(2.0), 1.0).met(), Some(false));
        assert_eq!(Goal::at_most("a", None, 1.0).met(), None);
        assert_eq!(Goal::at_most("a", Some(f64::NAN), 1.0).met(), None);
    }

    #[test]
    fn text_says_met_not_met_and_not_measured() {
        let t = goals_text(&[
            Goal::at_least("fast", Some(12.0), 10.0),
            Goal::at_most("small", Some(80.0), 64.0).unit(" MiB"),
            Goal::at_least("vs iceoryx2", None, 2.0).missing("not measured: iceoryx2 not built"),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("  met ")
                && lines[0].contains("measured 12.000x (target >= 10.000x)"),
            "{t}"
        );
        assert!(
            lines[1].contains("NOT met") && lines[1].contains("80.00 MiB (target <= 64.00 MiB)"),
            "{t}"
        );
        assert!(
            lines[2].contains("not measured") && lines[2].contains("iceoryx2 not built"),
            "{t}"
        );
    }
}
