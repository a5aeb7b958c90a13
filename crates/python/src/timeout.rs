//! Seconds given by Python (`timeout=`, `warn_idle=`) as Rust durations and deadlines: the
//! one place they are converted. `float('inf')`, and any time beyond what a `Duration` or the
//! monotonic clock holds, means "no limit"; NaN and negative values are a `ValueError` naming
//! the parameter. (`Duration::from_secs_f64` panics on those, and `Instant + d` on overflow.)

use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// `secs` seconds of parameter `param`: `None` for no limit (infinity, or more than a
/// `Duration` holds).
///
/// # Errors
/// `ValueError` naming `param=` for NaN or a negative value.
pub(crate) fn seconds(secs: f64, param: &str) -> PyResult<Option<Duration>> {
    if secs.is_nan() || secs < 0.0 {
        return Err(PyValueError::new_err(format!(
            "{param}={secs}: seconds, a number >= 0 (float('inf') or None: no limit)"
        )));
    }
    Ok(Duration::try_from_secs_f64(secs).ok())
}

/// `timeout=` in seconds as a deadline from now: `None` (wait as long as it takes) for `None`,
/// infinity, or a time the clock cannot reach.
///
/// # Errors
/// As [`seconds`].
pub(crate) fn deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    let Some(t) = timeout else {
        return Ok(None);
    };
    Ok(seconds(t, "timeout")?.and_then(|d| Instant::now().checked_add(d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_limit_and_refusals() {
        for t in [f64::INFINITY, 1e300, 1e19, f64::MAX] {
            assert_eq!(deadline(Some(t)).unwrap(), None, "{t}");
        }
        assert_eq!(deadline(None).unwrap(), None);
        let d = deadline(Some(0.25)).unwrap().unwrap();
        assert!(d > Instant::now() && d <= Instant::now() + Duration::from_millis(250));
        assert_eq!(seconds(0.0, "timeout").unwrap(), Some(Duration::ZERO));
        assert_eq!(seconds(f64::INFINITY, "warn_idle").unwrap(), None);
    }
}
