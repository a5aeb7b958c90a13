//! `Message`: a received message, a mapping of names to numpy views (and metadata).

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// A received message: `msg["x"]` is a numpy view into shared memory (writable: the block is
/// this message's alone until it is released, and the sender never reads it back).
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen, mapping)]
pub struct Message {
    /// name -> numpy array.
    #[pyo3(get)]
    arrays: Py<PyDict>,
    /// name -> int / float / str.
    #[pyo3(get)]
    meta: Py<PyDict>,
    /// Every record (a Rust sender may batch several items into one message); `None` inside.
    records: Option<Py<PyList>>,
    /// The message tag.
    #[pyo3(get)]
    pub(super) tag: u32,
}

impl Message {
    pub(super) fn new(
        arrays: Bound<'_, PyDict>,
        meta: Bound<'_, PyDict>,
        records: Option<Py<PyList>>,
    ) -> Message {
        Message {
            arrays: arrays.unbind(),
            meta: meta.unbind(),
            records,
            tag: 0,
        }
    }
}

#[pymethods]
impl Message {
    fn __getitem__<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        let a = self.arrays.bind(py);
        if let Some(v) = a.get_item(key)? {
            return Ok(v);
        }
        match self.meta.bind(py).get_item(key)? {
            Some(v) => Ok(v),
            None => Err(pyo3::exceptions::PyKeyError::new_err(key.to_owned())),
        }
    }
    fn __contains__(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        Ok(self.arrays.bind(py).contains(key)? || self.meta.bind(py).contains(key)?)
    }
    fn __len__(&self, py: Python<'_>) -> usize {
        self.arrays.bind(py).len()
    }
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.arrays
            .bind(py)
            .as_any()
            .try_iter()
            .map(Bound::into_any)
    }
    /// Array names.
    fn keys<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        self.arrays.bind(py).keys()
    }
    /// (name, array) pairs.
    fn items<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        self.arrays.bind(py).items()
    }
    /// Every record of the message (one, for messages sent from Python).
    #[getter]
    fn records<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        let py = slf.py();
        match &slf.get().records {
            Some(r) => r.bind(py).clone().into_any(),
            None => PyList::new(py, [slf.clone()])
                .map(Bound::into_any)
                .unwrap_or_else(|_| py.None().into_bound(py)),
        }
    }
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let mut parts = Vec::new();
        for (k, v) in self.arrays.bind(py).iter() {
            let a = v.cast::<PyUntypedArray>()?;
            parts.push(format!("{}: {}{:?}", k, a.dtype().str()?, a.shape()));
        }
        Ok(format!(
            "Message({}, meta={})",
            parts.join(", "),
            self.meta.bind(py).repr()?
        ))
    }
}
