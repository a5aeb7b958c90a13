//! A started pipeline for Python: the spec that `shmpipe.Pipeline` builds, and the
//! `PipelineRun` object (iteration, `enqueue` / `dequeue` / `close_input`, epochs of a source
//! read by this process). The logic of waiting and counting is in [`crate::run`], the thread
//! that moves outputs out of the worker processes in [`crate::pump`].
//!
//! Items are dicts; any other value `v` travels as the one-entry dict `{VALUE_KEY: v}` and
//! comes back as `v` (the worker's step runner unwraps and wraps it the same way).

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;
use shmpipe::{
    Epochs, Item, JsonLines, OnBadRecord, Pipeline, ReadOrder, Records, Source, SourceContext,
    Topology, Transfer,
};

use crate::errors::pipe_err;
use crate::pump::{GRACE, Pump};
use crate::run::{Backend, Run};
use crate::{item, worker};

/// The key under which a value that is not a dict travels as an item.
pub const VALUE_KEY: &str = "__shmpipe_value__";

/// A Python object as an item: a dict as it is, any other value as `{VALUE_KEY: value}`.
pub fn item_from_py(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Item> {
    if obj.is_instance_of::<PyDict>() {
        return item::from_py(py, obj);
    }
    let d = PyDict::new(py);
    d.set_item(VALUE_KEY, obj)?;
    item::from_py(py, d.as_any())
}

/// An item as a Python object: the value of a `{VALUE_KEY: value}` item, or the dict.
pub fn item_to_py(py: Python<'_>, it: Item) -> PyResult<Bound<'_, PyAny>> {
    let d = item::to_py(py, it)?;
    if d.len() == 1
        && let Some(v) = d.get_item(VALUE_KEY)?
    {
        return Ok(v);
    }
    Ok(d.into_any())
}

/// A started pipeline: iterate it, or enqueue and dequeue.
#[pyclass(module = "shmpipe._native", frozen)]
pub struct PipelineRun {
    run: Run,
    id: String,
}

impl std::fmt::Debug for PipelineRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineRun")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn cfg_err(m: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(m.to_string())
}

/// Shares the pickled source's sealed memfd, descriptor `fd` of this process (held by the
/// calling `shmpipe.Pipeline`), with the emitters: through a duplicate of our own (`os.dup`
/// checks that the number is open), of which `share_fd` makes its read-only reopening.
fn share_source_fd(
    py: Python<'_>,
    b: &mut shmpipe::PipelineBuilder,
    fd: &Value,
) -> PyResult<shmpipe::SharedFd> {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    let fd = fd
        .as_i64()
        .ok_or_else(|| cfg_err("source: no descriptor"))?;
    let dup: i32 = py.import("os")?.call_method1("dup", (fd,))?.extract()?;
    // SAFETY: `os.dup` just returned this new descriptor and nothing else holds it.
    let owned = unsafe { OwnedFd::from_raw_fd(dup) };
    b.share_fd(owned.as_fd()).map_err(cfg_err)
}

fn build(
    py: Python<'_>,
    spec: &Value,
    program: String,
    args: Vec<String>,
) -> PyResult<shmpipe::PipelineBuilder> {
    let reg = worker::registry();
    let u = |k: &str, d: u64| spec[k].as_u64().unwrap_or(d);
    let mut b = Pipeline::builder(&reg)
        .handle_ctrl_c(false)
        // The pump always waits for output: `Run` says when a user's dequeue waits in vain.
        .warn_idle_after(Duration::ZERO)
        .child_program(program, args)
        .workers(u("workers", 2) as usize)
        .emitters(u("emitters", 1) as usize)
        .ordered(spec["ordered"].as_bool().unwrap_or(false))
        .shuffle(spec["shuffle"].as_bool().unwrap_or(false))
        .shuffle_buffer(u("shuffle_buffer", 256) as usize)
        .seed(u("seed", 0))
        .shard(u("rank", 0) as usize, u("world_size", 1) as usize)
        .epochs(match spec["epochs"].as_u64() {
            Some(n) => Epochs::Finite(n),
            None => Epochs::Cycle,
        });
    if let Some(n) = spec["batch_bytes"].as_u64() {
        b = b.batch_bytes(n as usize);
    }
    if spec["skip_bad_records"].as_bool() == Some(true) {
        b = b.on_bad_record(OnBadRecord::Skip);
    }
    if let Some(t) = spec["threshold"].as_u64() {
        b = b.transfer(Transfer::Adaptive {
            threshold: t as usize,
        });
    }
    if let Some(c) = spec["channel"].as_array() {
        let g = |i: usize| c.get(i).and_then(Value::as_u64).unwrap_or(0);
        let d = shmpipe::ChannelGeometry::default();
        b = b.channel(shmpipe::ChannelGeometry {
            slots: g(0) as u32,
            blocks: g(1) as u32,
            block_size: g(2) as usize,
            // A 4th value: the large pool (items over a block); default: any size.
            large_pool: c
                .get(3)
                .and_then(Value::as_u64)
                .map_or(d.large_pool, |v| v as usize),
        });
    }
    if spec["staged"].as_bool() == Some(true) {
        b = b.topology(Topology::Staged { workers: vec![] });
    }
    let src = &spec["source"];
    b = match src["kind"].as_str() {
        Some("jsonl") => b.source(JsonLines::new(src["path"].as_str().unwrap_or_default())),
        Some("named") => b.source_named(
            src["name"].as_str().unwrap_or_default(),
            src["args"].clone(),
        ),
        Some("sequence") => {
            let h = share_source_fd(py, &mut b, &src["fd"])?;
            b.source_named(worker::PY_SOURCE, serde_json::json!({"fd": h}))
        }
        // Enqueue mode: this process feeds the pipeline (or the user does).
        None => b,
        _ => return Err(cfg_err("source: a path, a sequence or a named source")),
    };
    for s in spec["steps"].as_array().into_iter().flatten() {
        let name = s["name"]
            .as_str()
            .ok_or_else(|| cfg_err("step without a name"))?;
        b = b.step_with(name, s["args"].clone());
    }
    Ok(b)
}

/// The source this process reads itself (`spec["feed"]`; `obj`: a Python sequence), read
/// as an emitter of this job's part would read it.
fn feed_records(py: Python<'_>, spec: &Value, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Records> {
    let u = |k: &str, d: u64| spec[k].as_u64().unwrap_or(d) as usize;
    let (rank, world) = (u("rank", 0), u("world_size", 1));
    let f = &spec["feed"];
    let source: Box<dyn Source> = match (f["kind"].as_str(), obj) {
        (Some("jsonl"), _) => {
            let path = f["path"].as_str().unwrap_or_default();
            let part = JsonLines::new(path).open(rank, world);
            Box::new(part.map_err(|e| pipe_err(py, source_err(e)))?)
        }
        (Some("named"), _) => {
            let args = f["args"].clone();
            let cx = SourceContext {
                args: &args,
                part: rank,
                parts: world,
            };
            let name = f["name"].as_str().unwrap_or_default();
            worker::registry()
                .build_source(name, &cx)
                .map_err(|e| pipe_err(py, source_err(e)))?
        }
        (Some("object"), Some(seq)) => Box::new(worker::PySource::over(seq, rank, world)?),
        _ => return Err(cfg_err("feed: a path, a named source or a sequence")),
    };
    let order = ReadOrder {
        seed: spec["seed"].as_u64().unwrap_or(0),
        shuffle: spec["shuffle"].as_bool().unwrap_or(false),
        shuffle_buffer: u("shuffle_buffer", 256),
        rank,
        emitter: 0,
        on_bad_record: if spec["skip_bad_records"].as_bool() == Some(true) {
            OnBadRecord::Skip
        } else {
            OnBadRecord::Fail
        },
    };
    Ok(Records::new(source, order))
}

pub(crate) fn source_err(e: shmpipe::SourceError) -> shmpipe::Error {
    match e {
        shmpipe::SourceError::BadRecord {
            file,
            line,
            field,
            message,
        } => shmpipe::Error::BadRecord {
            file,
            line,
            field,
            message,
        },
        error => shmpipe::Error::Source { emitter: 0, error },
    }
}

use crate::timeout::deadline;

#[pymethods]
impl PipelineRun {
    /// Starts a pipeline described by `spec` (JSON, built by `shmpipe.Pipeline`), its
    /// children being `program args..` (the Python interpreter running `shmpipe._worker`).
    /// Without `spec["source"]` the pipeline takes its input from `enqueue`, or, with
    /// `spec["feed"]`, from that source read here (`feed`: the Python sequence of a feed of
    /// kind `"object"`), epoch by epoch.
    #[staticmethod]
    #[pyo3(signature = (spec, program, args, prefetch=8, feed=None))]
    fn start(
        py: Python<'_>,
        spec: &str,
        program: String,
        args: Vec<String>,
        prefetch: usize,
        feed: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PipelineRun> {
        let spec: Value = serde_json::from_str(spec).map_err(cfg_err)?;
        let records = if spec["feed"].is_object() {
            Some(feed_records(py, &spec, feed)?)
        } else {
            None
        };
        let b = build(py, &spec, program, args)?;
        let mut p = py.detach(|| b.start()).map_err(|e| pipe_err(py, e))?;
        let id = p.id().to_owned();
        let input = if spec["source"].is_object() {
            None
        } else {
            Some(p.input().map_err(|e| pipe_err(py, e))?)
        };
        let inline = spec["workers"].as_u64() == Some(0);
        let max_in_flight = match spec["max_in_flight"].as_u64() {
            _ if inline => u64::MAX,
            Some(n) if n > 0 => n,
            _ => return Err(cfg_err("max_in_flight must be at least 1")),
        };
        let backend = if inline {
            Backend::Inline(Box::new(std::sync::Mutex::new(Some(p))))
        } else {
            Backend::Pump(Pump::start(p, prefetch))
        };
        let warn_idle = spec["warn_idle"].as_f64().unwrap_or(5.0);
        let warn_idle = crate::timeout::seconds(warn_idle, "warn_idle")?.unwrap_or(Duration::MAX);
        Ok(PipelineRun {
            run: Run::new(backend, input, max_in_flight, records, warn_idle),
            id,
        })
    }

    /// Pids of the emitter and worker processes (none with `workers=0`).
    #[getter]
    fn pids(&self) -> Vec<u32> {
        self.run.pids()
    }

    /// The pipeline id (it names the pipeline in messages).
    #[getter]
    fn id(&self) -> String {
        self.id.clone()
    }

    /// Inputs enqueued whose outputs have not all been dequeued.
    #[getter]
    fn pending(&self) -> u64 {
        self.run.pending()
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.run.next(py)?.map(|it| item_to_py(py, it)).transpose()
    }

    /// Feeds one input (a dict, or any value); waits while `max_in_flight` inputs are in
    /// the pipeline, up to `timeout` seconds.
    #[pyo3(signature = (item, timeout=None))]
    fn enqueue(
        &self,
        py: Python<'_>,
        item: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let d = deadline(timeout)?;
        let it = item_from_py(py, item)?;
        self.run.enqueue(py, it, d, timeout)
    }

    /// Ends the input: the stream ends after the outputs of every input enqueued.
    fn close_input(&self) {
        self.run.close_input();
    }

    /// The next output, or `None` after the end of stream; `TimeoutError` after `timeout`
    /// seconds without one.
    #[pyo3(signature = (timeout=None))]
    fn dequeue<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let d = deadline(timeout)?;
        self.run
            .dequeue(py, d, timeout)?
            .map(|it| item_to_py(py, it))
            .transpose()
    }

    /// Starts epoch `epoch` of the source read by this process (what is left of the previous
    /// epoch is dropped).
    fn start_epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<()> {
        self.run.start_epoch(py, epoch)
    }

    /// The next output of the current epoch, `None` at its end.
    fn next_in_epoch<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.run
            .next_in_epoch(py)?
            .map(|it| item_to_py(py, it))
            .transpose()
    }

    /// Stops every process and frees the shared memory (also done when garbage collected).
    fn close(&self, py: Python<'_>) {
        self.run.close(py, GRACE);
    }
}

/// The seed of the input the calling step processes (`None` outside a step call).
#[pyfunction]
pub fn item_seed() -> Option<u64> {
    shmpipe::item_seed()
}
