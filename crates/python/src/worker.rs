//! The registry shared by the parent and the worker processes: the Python step adapter and
//! the built-in Rust steps (those of `shmpipe-timeseries`).
//!
//! Workers are `python -c "... worker_main()"`, which runs the pipeline child role with the
//! GIL released. A Python step takes the GIL once per received batch and runs every item of
//! it through its callables: consecutive Python steps of a pipeline are one step here
//! ([`PY_STEP`] with `{"steps": [...]}`), so an item passes from one callable to the next as
//! the Python object the previous one returned, converted once on the way in and once out.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyMemoryView, PyString, PyTuple};
use serde_json::Value;
use shmpipe::{Item, Registry, Step, StepContext, StepError};

use crate::item;

/// Step name of Python callables (args: `{"steps": [spec, ...]}` or one spec, a spec being
/// `{"pickle": base64, "main_path": str|null, "name": str}`; see `shmpipe._steps`).
pub const PY_STEP: &str = "python";

/// A Python exception as text: type, message and the worker's traceback.
pub fn describe(py: Python<'_>, e: PyErr) -> String {
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

/// Python callables run in sequence as one step (flat-maps: see [`outputs`]).
struct PyStep {
    /// (callable, its qualified name): a failure is reported under the callable's name
    /// (`StepError::in_step`), the `step` attribute of the Python `StepError`.
    fns: Vec<(Py<PyAny>, String)>,
}

/// Calls `f` on each output of a step's return value `r`: none for `None`, `r` itself for a
/// dict, a string, bytes, a numpy array or scalar or anything not iterable, else each element
/// (a list, a tuple, a generator or any other iterable: flat-map).
fn outputs<'py>(
    r: Bound<'py, PyAny>,
    f: &mut dyn FnMut(Bound<'py, PyAny>) -> Result<(), (usize, PyErr)>,
    at: usize,
) -> Result<(), (usize, PyErr)> {
    if r.is_none() {
        return Ok(());
    }
    if r.is_instance_of::<PyDict>() {
        return f(r);
    }
    if let Ok(l) = r.cast::<PyList>() {
        for o in l.iter() {
            f(o)?;
        }
        return Ok(());
    }
    if let Ok(t) = r.cast::<PyTuple>() {
        for o in t.iter() {
            f(o)?;
        }
        return Ok(());
    }
    if single(&r).map_err(|e| (at, e))? {
        return f(r);
    }
    for o in r.try_iter().map_err(|e| (at, e))? {
        f(o.map_err(|e| (at, e))?)?;
    }
    Ok(())
}

/// One output although iterable: a string, bytes, a numpy array or scalar; or not iterable.
fn single(r: &Bound<'_, PyAny>) -> PyResult<bool> {
    if r.is_instance_of::<PyString>() || r.is_instance_of::<PyBytes>() {
        return Ok(true);
    }
    if r.is_instance_of::<PyByteArray>() || r.is_instance_of::<PyMemoryView>() {
        return Ok(true);
    }
    if !r.hasattr("__iter__")? {
        return Ok(true);
    }
    let module = r.get_type().getattr("__module__")?;
    Ok(module.extract::<String>().is_ok_and(|m| m == "numpy"))
}

impl PyStep {
    /// Runs callables `from..` on `obj`; the final outputs are converted and pushed to `out`.
    /// `input`: the index of the input in the run (each callable's item seed is set for it;
    /// `None` at the end of stream, where the seed is the pseudo-input's).
    /// `Err((index of the callable to blame, error))`.
    fn run_from(
        &self,
        py: Python<'_>,
        from: usize,
        input: Option<usize>,
        obj: Bound<'_, PyAny>,
        out: &mut Vec<Item>,
    ) -> Result<(), (usize, PyErr)> {
        let Some((f, _)) = self.fns.get(from) else {
            let last = self.fns.len().saturating_sub(1);
            let it = item::from_py(py, &obj).map_err(|e| (last, output_error(py, e)))?;
            out.push(it);
            return Ok(());
        };
        if let Some(i) = input {
            // Each fused callable its own seed: what it would be as a step of its own.
            shmpipe::select_input(i, from as u64);
        }
        let r = f.bind(py).call1((obj,)).map_err(|e| (from, e))?;
        outputs(r, &mut |o| self.run_from(py, from + 1, input, o, out), from)
    }

    fn error(&self, py: Python<'_>, (i, e): (usize, PyErr)) -> StepError {
        let name = self.fns.get(i).map_or(PY_STEP, |f| f.1.as_str());
        let msg = describe(py, e.clone_ref(py));
        RAISED.with(|r| *r.borrow_mut() = Some(e));
        StepError::in_step(name, msg)
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

/// A step's output that cannot be converted, as an error saying so.
fn output_error(py: Python<'_>, e: PyErr) -> PyErr {
    let msg = e.value(py).to_string();
    let new = PyErr::from_type(
        e.get_type(py),
        format!("the step's output cannot cross processes: {msg}"),
    );
    new.set_cause(py, Some(e));
    new
}

impl Step for PyStep {
    fn process(&mut self, it: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        let mut items = vec![it];
        self.process_batch(&mut items, out, &mut Vec::new())
    }

    fn process_batch(
        &mut self,
        items: &mut Vec<Item>,
        out: &mut Vec<Item>,
        ends: &mut Vec<usize>,
    ) -> Result<(), StepError> {
        Python::attach(|py| {
            for (i, it) in items.drain(..).enumerate() {
                let obj = item::to_py(py, it).map_err(|e| self.error(py, (0, e)))?;
                self.run_from(py, 0, Some(i), obj, out)
                    .map_err(|e| self.error(py, e))?;
                ends.push(out.len());
            }
            Ok(())
        })
    }

    fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), StepError> {
        Python::attach(|py| {
            for (i, (f, _)) in self.fns.iter().enumerate() {
                let fin = f
                    .bind(py)
                    .getattr("finish")
                    .ok()
                    .filter(|x| x.is_callable());
                let Some(fin) = fin else { continue };
                let r = fin.call0().map_err(|e| self.error(py, (i, e)))?;
                outputs(r, &mut |o| self.run_from(py, i + 1, None, o, out), i)
                    .map_err(|e| self.error(py, e))?;
            }
            Ok(())
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
    let specs: Vec<&Value> = match cx.args.get("steps") {
        Some(Value::Array(a)) => a.iter().collect(),
        _ => vec![cx.args],
    };
    Python::attach(|py| {
        forget_role(py).map_err(|e| StepError::new(describe(py, e)))?;
        let w = cx.worker;
        let m = py
            .import("shmpipe._steps")
            .map_err(|e| StepError::new(describe(py, e)))?;
        let mut fns = Vec::new();
        for spec in specs {
            let name = spec["name"].as_str().unwrap_or("python").to_owned();
            let f = m
                .call_method1("load_step", (spec.to_string(), w.worker, w.workers, w.seed))
                .map_err(|e| StepError::in_step(&name, describe(py, e)))?;
            fns.push((f.unbind(), name));
        }
        Ok(PyStep { fns })
    })
}

/// Every step a Python pipeline can name.
pub fn registry() -> Registry {
    let reg = Registry::new().step(PY_STEP, py_step);
    shmpipe_timeseries::pipeline::register(reg)
}

/// The entry point of the pipeline's child processes: runs the child role and exits.
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
