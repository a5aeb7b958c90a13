//! The registry shared by the parent and the worker processes: the Python step adapter, the
//! Python sequence source and the built-in Rust steps (those of `shmpipe-timeseries`).
//!
//! Workers are `python -m shmpipe._worker`, which calls [`worker_main`]: the pipeline child
//! role runs with the GIL released and takes it for each call into Python.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use shmpipe::{Item, Registry, Source, SourceContext, SourceError, Step, StepContext, StepError};

use crate::item;

/// Step name of a Python callable (args: `{"pickle": base64, "main_path": str|null}`).
pub const PY_STEP: &str = "python";
/// Source name of a pickled Python sequence in a sealed memfd shared with the emitters (args:
/// `{"fd": SharedFd}`, see `shmpipe::PipelineBuilder::share_fd`).
pub const PY_SOURCE: &str = "python_sequence";

/// A Python exception as text: type, message and the worker's traceback.
fn describe(py: Python<'_>, e: PyErr) -> String {
    let tb = py
        .import("traceback")
        .and_then(|t| {
            t.call_method1(
                "format_exception",
                (e.get_type(py), e.value(py), e.traceback(py)),
            )
        })
        .and_then(|l| l.extract::<Vec<String>>())
        .map(|l| l.concat());
    tb.unwrap_or_else(|_| e.to_string())
}

/// A Python callable run as a step (through `shmpipe._steps.Runner`).
struct PyStep {
    runner: Py<PyAny>,
    /// The callable's qualified name: the first line of every error message, which
    /// `errors::pipe_err` turns into the exception's `step` attribute.
    name: String,
}

impl PyStep {
    fn outputs(py: Python<'_>, r: Bound<'_, PyAny>, out: &mut Vec<Item>) -> PyResult<()> {
        let list = r.cast::<PyList>()?;
        for d in list.iter() {
            out.push(item::from_py(py, &d)?);
        }
        Ok(())
    }
}

impl Step for PyStep {
    fn process(&mut self, it: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        Python::attach(|py| {
            let r = item::to_py(py, it)
                .and_then(|d| self.runner.bind(py).call_method1("process", (d,)))
                .and_then(|r| Self::outputs(py, r, out));
            r.map_err(|e| self.failed(py, e))
        })
    }

    fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), StepError> {
        Python::attach(|py| {
            let r = self
                .runner
                .bind(py)
                .call_method0("finish")
                .and_then(|r| Self::outputs(py, r, out));
            r.map_err(|e| self.failed(py, e))
        })
    }
}

thread_local! {
    /// The exception of the last failed Python step call in this thread: with `workers=0`
    /// the caller re-raises it as the `StepError`'s cause (or as itself, for
    /// `KeyboardInterrupt`).
    static RAISED: std::cell::RefCell<Option<PyErr>> = const { std::cell::RefCell::new(None) };
}

/// Takes the exception of the last failed Python step call in this thread.
pub fn take_raised() -> Option<PyErr> {
    RAISED.with(|r| r.borrow_mut().take())
}

impl PyStep {
    fn failed(&self, py: Python<'_>, e: PyErr) -> StepError {
        let msg = format!("{}\n{}", self.name, describe(py, e.clone_ref(py)));
        RAISED.with(|r| *r.borrow_mut() = Some(e));
        StepError::new(msg)
    }
}

/// A pickled Python sequence (`len` + indexing), one contiguous part per emitter.
pub struct PySource {
    seq: Py<PyAny>,
    start: usize,
    len: usize,
}

impl PySource {
    /// Part `part` of `parts` of a sequence of this process (a parent that feeds the
    /// pipeline itself).
    pub fn over(seq: &Bound<'_, PyAny>, part: usize, parts: usize) -> PyResult<PySource> {
        let r = shmpipe::part_range(seq.len()?, part, parts);
        Ok(PySource {
            seq: seq.clone().unbind(),
            start: r.start,
            len: r.len(),
        })
    }
}

impl Source for PySource {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        Python::attach(|py| {
            let d = self.seq.bind(py).get_item(self.start + index);
            d.and_then(|d| crate::pipeline::item_from_py(py, &d))
                .map_err(|e| SourceError::BadRecord {
                    file: "python sequence".into(),
                    line: (self.start + index + 1) as u64,
                    field: None,
                    message: describe(py, e),
                })
        })
    }
}

/// Removes the pipeline role variable from `os.environ` too (`shmpipe::init` removed it from
/// the process environment; Python keeps its own copy, which `subprocess` may pass on).
fn forget_role(py: Python<'_>) -> PyResult<()> {
    py.import("os")?
        .getattr("environ")?
        .call_method1("pop", (shmpipe::ROLE_ENV, py.None()))?;
    Ok(())
}

fn py_step(cx: &StepContext<'_>) -> Result<PyStep, StepError> {
    Python::attach(|py| {
        forget_role(py).map_err(|e| StepError::new(describe(py, e)))?;
        let args = serde_json::to_string(cx.args).unwrap_or_default();
        let w = cx.worker;
        py.import("shmpipe._steps")
            .and_then(|m| m.call_method1("load_step", (args, w.worker, w.workers, w.seed)))
            .map(|r| PyStep {
                runner: r.unbind(),
                name: cx.args["name"].as_str().unwrap_or("python").to_owned(),
            })
            .map_err(|e| StepError::new(describe(py, e)))
    })
}

fn py_source(cx: &SourceContext<'_>) -> Result<PySource, SourceError> {
    use std::os::fd::AsRawFd;
    // Received through the control socket, checked (sealed, read-only) and open until exit.
    let fd = cx.shared_fd("fd")?.as_raw_fd();
    Python::attach(|py| {
        forget_role(py).map_err(|e| SourceError::Other(describe(py, e)))?;
        let seq = py
            .import("shmpipe._steps")
            .and_then(|m| m.call_method1("load_source", (fd,)))
            .map_err(|e| SourceError::Other(describe(py, e)))?;
        let n = seq.len().map_err(|e| SourceError::Other(describe(py, e)))?;
        let r = shmpipe::part_range(n, cx.part, cx.parts);
        Ok(PySource {
            seq: seq.unbind(),
            start: r.start,
            len: r.len(),
        })
    })
}

/// Every step and source a Python pipeline can name.
pub fn registry() -> Registry {
    let reg = Registry::new()
        .step(PY_STEP, py_step)
        .source(PY_SOURCE, py_source);
    shmpipe_timeseries::pipeline::register(reg)
}

/// The entry point of `python -m shmpipe._worker`: runs the pipeline child role and exits.
#[pyfunction]
pub fn worker_main(py: Python<'_>) -> PyResult<()> {
    let reg = registry();
    py.detach(|| shmpipe::init(&reg));
    Err(PyRuntimeError::new_err(
        "shmpipe._worker is started by shmpipe.Pipeline, not by hand",
    ))
}

/// Names of the built-in (Rust) steps.
#[pyfunction]
pub fn builtin_steps() -> Vec<String> {
    let reg = registry();
    [
        shmpipe_timeseries::pipeline::STEP_TRAIN,
        shmpipe_timeseries::pipeline::STEP_PARSE,
        shmpipe_timeseries::pipeline::STEP_TRANSFORM,
        shmpipe_timeseries::pipeline::STEP_BATCH,
    ]
    .iter()
    .filter(|n| reg.has_step(n))
    .map(|s| (*s).to_owned())
    .collect()
}
