//! A plain GluonTS JSON line read natively, for `shmpipe.gluonts`'s workers (which then run
//! `FileDataset`'s own `ProcessDataEntry` and the user's chain on it).

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use shmpipe_timeseries::jsonl::{PlainKey, parse_plain};

/// `json.loads(line)` with its `target` as a float32 array (`numpy.asarray(target,
/// dtype=float32)`), for a line of only `start`, `target` and `item_id` strings and numbers
/// (`shmpipe_timeseries::jsonl::parse_plain`); `None` for any other line.
#[pyfunction]
pub fn parse_plain_line<'py>(py: Python<'py>, line: &[u8]) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(p) = parse_plain(line) else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    let mut target = Some(p.target);
    for k in &p.keys {
        match k {
            PlainKey::Start => d.set_item("start", p.start)?,
            PlainKey::Target => {
                let t = target.take().unwrap_or_default();
                d.set_item("target", PyArray1::from_vec(py, t))?
            }
            PlainKey::ItemId => d.set_item("item_id", p.item_id)?,
        }
    }
    Ok(Some(d))
}
