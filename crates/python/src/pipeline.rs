//! A started pipeline for Python: the spec that `shmpipe.Pipeline` builds, and the
//! `PipelineRun` object (iteration, `enqueue` / `dequeue` / `close_input`, epochs of a source
//! read by this process). The logic of waiting and counting is in [`crate::run`], the thread
//! that moves outputs out of the worker processes in [`crate::pump`].
//!
//! Items are dicts, or any other value (see [`crate::item`]).
//!
//! A run belongs to the process that started it. In a process forked from it (`os.fork`,
//! `multiprocessing`'s fork start method) the copy does nothing when closed or collected: the
//! pump thread, the input thread and the worker processes are the parent's, a lock of the run
//! may have been held by a parent's thread at the fork, and queued outputs lease the parent's
//! pool blocks. Everything else it is asked (iterate, enqueue, dequeue, `pending`, ...) raises
//! `PipelineError` naming the fork, before it takes a lock.

use std::mem::ManuallyDrop;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::Value;
use shmpipe::{
    Epochs, Item, JsonLines, OnBadRecord, Pipeline, ReadOrder, Records, Source, SourceContext,
    Topology, Transfer,
};

use crate::errors::pipe_err;
use crate::pump::{GRACE, Pump};
use crate::run::{Backend, Fed, Run};
use crate::source::{Feed, FeedSpec};
use crate::{item, worker};

/// A Python object as an item (a dict, or any other value: see [`item::from_py`]).
pub fn item_from_py(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Item> {
    item::from_py(py, obj)
}

/// An item as the Python object it stands for.
pub fn item_to_py(py: Python<'_>, it: Item) -> PyResult<Bound<'_, PyAny>> {
    item::to_py(py, it)
}

/// A started pipeline: iterate it, or enqueue and dequeue.
#[pyclass(module = "shmpipe._native", frozen)]
pub struct PipelineRun {
    /// Dropped only in the process that started the run (see the `Drop` impl).
    run: ManuallyDrop<Run>,
    id: String,
    /// The process that started the run: the only one in which it acts.
    owner: shm_ring::Owner,
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

fn build(spec: &Value, program: String, args: Vec<String>) -> PyResult<shmpipe::PipelineBuilder> {
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
        // Enqueue mode: this process feeds the pipeline (or the user does).
        None => b,
        _ => return Err(cfg_err("source: a path or a named source")),
    };
    for s in spec["steps"].as_array().into_iter().flatten() {
        let name = s["name"]
            .as_str()
            .ok_or_else(|| cfg_err("step without a name"))?;
        b = b.step_with(name, s["args"].clone());
    }
    Ok(b)
}

/// The source this process reads itself (`spec["feed"]`; `obj`: the in-memory source of a
/// feed of kind `"object"`), read as an emitter of this job's part would read it.
fn feed_records(py: Python<'_>, spec: &Value, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Fed> {
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
        (Some("object"), Some(obj)) => return Ok(Fed::Memory(Feed::new(obj, feed_spec(spec))?)),
        _ => {
            return Err(cfg_err(
                "feed: a path, a named source or an in-memory source",
            ));
        }
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
    Ok(Fed::Records(Records::new(source, order)))
}

/// The settings of `spec` that concern an in-memory source.
fn feed_spec(spec: &Value) -> FeedSpec {
    let u = |k: &str, d: u64| spec[k].as_u64().unwrap_or(d);
    FeedSpec {
        seed: u("seed", 0),
        shuffle: spec["shuffle"].as_bool().unwrap_or(false),
        shuffle_buffer: u("shuffle_buffer", 256) as usize,
        epochs: spec["epochs"].as_u64(),
        rank: u("rank", 0) as usize,
        world_size: u("world_size", 1) as usize,
    }
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
        let b = build(&spec, program, args)?;
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
        // `null`: never (Python sends `None` for infinity, which JSON cannot hold).
        let warn_idle = match spec.get("warn_idle") {
            None => Some(5.0),
            Some(v) => v.as_f64(),
        };
        let warn_idle = match warn_idle {
            Some(s) => crate::timeout::seconds(s, "warn_idle")?.unwrap_or(Duration::MAX),
            None => Duration::MAX,
        };
        Ok(PipelineRun {
            run: ManuallyDrop::new(Run::new(backend, input, max_in_flight, records, warn_idle)),
            id,
            owner: shm_ring::Owner::current(),
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
    fn pending(&self, py: Python<'_>) -> PyResult<u64> {
        self.mine(py)?;
        Ok(self.run.pending())
    }

    /// Inputs fed so far (enqueued, or read from the source read by this process): an
    /// epoch whose source gave nothing leaves it unchanged.
    #[getter]
    fn fed(&self, py: Python<'_>) -> PyResult<u64> {
        self.mine(py)?;
        Ok(self.run.fed())
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.mine(py)?;
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
        self.mine(py)?;
        let d = deadline(timeout)?;
        let it = item_from_py(py, item)?;
        self.run.enqueue(py, it, d, timeout)
    }

    /// Ends the input: the stream ends after the outputs of every input enqueued.
    fn close_input(&self, py: Python<'_>) -> PyResult<()> {
        self.mine(py)?;
        self.run.close_input();
        Ok(())
    }

    /// The next output, or `None` after the end of stream; `TimeoutError` after `timeout`
    /// seconds without one.
    #[pyo3(signature = (timeout=None))]
    fn dequeue<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.mine(py)?;
        let d = deadline(timeout)?;
        self.run
            .dequeue(py, d, timeout)?
            .map(|it| item_to_py(py, it))
            .transpose()
    }

    /// Starts epoch `epoch` of the source read by this process (what is left of the previous
    /// epoch is dropped).
    fn start_epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<()> {
        self.mine(py)?;
        self.run.start_epoch(py, epoch)
    }

    /// The next output of the current epoch, `None` at its end.
    fn next_in_epoch<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.mine(py)?;
        self.run
            .next_in_epoch(py)?
            .map(|it| item_to_py(py, it))
            .transpose()
    }

    /// Stops every process and frees the shared memory (also done when garbage collected).
    /// Does nothing in a process forked from the one that started the run.
    fn close(&self, py: Python<'_>) {
        if self.owner.is_current_strict() {
            self.run.close(py, GRACE);
        }
    }
}

impl PipelineRun {
    /// `PipelineError` in a process forked from the one that started the run (one load and
    /// one compare; checked before any lock of the run is taken).
    fn mine(&self, py: Python<'_>) -> PyResult<()> {
        if self.owner.is_current() {
            return Ok(());
        }
        let e = shmpipe::Error::Forked {
            owner: self.owner.pid(),
            caller: std::process::id(),
        };
        Err(pipe_err(py, e))
    }
}

impl Drop for PipelineRun {
    fn drop(&mut self) {
        if self.owner.is_current_strict() {
            // SAFETY: `run` is dropped here, once (this is the drop of its only holder), and
            // nothing reads it afterwards.
            unsafe { ManuallyDrop::drop(&mut self.run) };
        }
        // Otherwise a forked child's copy: it is left undropped. Its drop would stop (and
        // after a grace SIGKILL) the parent's processes, wait for a pump thread the child does
        // not have, take locks a parent's thread may have held at the fork, and hand back
        // pool blocks the parent's outputs lease. What it holds is the child's copy of the
        // parent's memory and descriptors, which go with the child.
    }
}

/// The seed of the input the calling step processes (`None` outside a step call).
#[pyfunction]
pub fn item_seed() -> Option<u64> {
    shmpipe::item_seed()
}
