//! GluonTS's calendar time features computed by `shmpipe-timeseries`, for
//! `shmpipe.gluonts`'s workers (which run a user's `AddTimeFeatures` with them).

use numpy::{PyArray2, ndarray::Array2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use shmpipe_timeseries::Period;
use shmpipe_timeseries::features::{TimeFeature, fill_time_features};

const ALL: [TimeFeature; 8] = [
    TimeFeature::SecondOfMinute,
    TimeFeature::MinuteOfHour,
    TimeFeature::HourOfDay,
    TimeFeature::DayOfWeek,
    TimeFeature::DayOfMonth,
    TimeFeature::DayOfYear,
    TimeFeature::MonthOfYear,
    TimeFeature::WeekOfYear,
];

/// `(len(names), length)` float32: feature `names[k]` (GluonTS's function names, e.g.
/// `"hour_of_day"`) of the `length` periods from the period `start` (its ordinal) of
/// frequency `freq` (a pandas frequency string), as `AddTimeFeatures` computes them.
#[pyfunction]
#[pyo3(signature = (freq, start, length, names))]
pub fn time_features<'py>(
    py: Python<'py>,
    freq: &str,
    start: i64,
    length: usize,
    names: Vec<String>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let freq = freq
        .parse()
        .map_err(|e| PyValueError::new_err(format!("freq={freq:?}: {e}")))?;
    let feats = names
        .iter()
        .map(|n| {
            ALL.iter()
                .copied()
                .find(|f| f.name() == n)
                .ok_or_else(|| PyValueError::new_err(format!("no time feature named {n:?}")))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let period = Period {
        freq,
        ordinal: start,
    };
    let mut out = vec![0.0f32; feats.len() * length];
    py.detach(|| fill_time_features(period, length, &feats, &mut out));
    let a = Array2::from_shape_vec((feats.len(), length), out)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(PyArray2::from_owned_array(py, a))
}
