//! `Message`: a received message, a mapping of names to numpy views (and metadata).

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use std::sync::OnceLock;

use pyo3::types::{PyDict, PyList};

/// A received message: `msg["x"]` is a numpy view into shared memory (writable: the block is
/// this message's alone until the last view is gone, and the sender never reads it back).
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen, mapping)]
pub struct Message {
    /// name -> numpy array.
    #[pyo3(get)]
    arrays: Py<PyDict>,
    /// name -> int / float / str (made on first use when the message has none).
    meta: OnceLock<Py<PyDict>>,
    /// Every record (a Rust sender may batch several items into one message); `None` inside.
    records: Option<Py<PyList>>,
    /// The message's tag: a number a Rust sender may set (0 from Python senders).
    #[pyo3(get)]
    pub(super) tag: u32,
}

impl Message {
    pub(super) fn new(
        arrays: Bound<'_, PyDict>,
        meta: Option<Bound<'_, PyDict>>,
        records: Option<Py<PyList>>,
    ) -> Message {
        let m = OnceLock::new();
        if let Some(d) = meta {
            let _ = m.set(d.unbind());
        }
        Message {
            arrays: arrays.unbind(),
            meta: m,
            records,
            tag: 0,
        }
    }

    fn meta_dict<'py>(&self, py: Python<'py>) -> &Bound<'py, PyDict> {
        // The GIL is held throughout the init (nothing in it releases it): no other thread
        // can be waiting on the lock meanwhile.
        self.meta.get_or_init(|| PyDict::new(py).unbind()).bind(py)
    }
}

#[pymethods]
impl Message {
    /// name -> int / float / str.
    #[getter]
    fn meta<'py>(&self, py: Python<'py>) -> Bound<'py, PyDict> {
        self.meta_dict(py).clone()
    }
    fn __getitem__<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        if let Some(v) = self.arrays.bind(py).get_item(key)? {
            return Ok(v);
        }
        if let Some(m) = self.meta.get()
            && let Some(v) = m.bind(py).get_item(key)?
        {
            return Ok(v);
        }
        Err(pyo3::exceptions::PyKeyError::new_err(key.to_owned()))
    }
    fn __contains__(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        Ok(self.arrays.bind(py).contains(key)?
            || self
                .meta
                .get()
                .map_or(Ok(false), |m| m.bind(py).contains(key))?)
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
    /// The names of the message's arrays (`msg[name]` is the array).
    fn keys<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        self.arrays.bind(py).keys()
    }
    /// (name, array) pairs.
    fn items<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        self.arrays.bind(py).items()
    }
    /// Every record of the message (one, for messages sent with `send`).
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
            self.meta_dict(py).repr()?
        ))
    }
}
