//! A running pipeline as a Python iterator.
//!
//! A Rust thread owns the `shmpipe::Pipeline` and moves its outputs, in chunks of what is
//! ready, into a bounded queue; the Python thread takes them with the GIL released, in
//! slices, checking for Ctrl-C between slices, and converts them one by one as they are
//! asked for. With an in-memory source the Python thread also feeds the pipeline
//! ([`crate::source`]) before it looks for an output. Closing drops the queue (the thread
//! then drops the pipeline, which stops every process and removes every segment); a pipeline
//! stuck in a step is killed after a grace.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::Value;
use shmpipe::{Epochs, Input, Item, JsonLines, OnBadRecord, Pipeline, Topology, Transfer};

use crate::channel::SLICE;
use crate::errors::pipe_err;
use crate::source::{Feed, FeedSpec};
use crate::{item, worker};

/// What the pump hands over: a chunk of outputs, or the pipeline's failure.
type Out = Result<Vec<Item>, shmpipe::Error>;

/// Largest chunk of outputs the pump hands over at once (items, array bytes): small enough
/// that outputs waiting in this process never pin many pool blocks of the workers.
const CHUNK_ITEMS: usize = 512;
const CHUNK_BYTES: usize = 256 << 10;

/// An in-memory source and the pipeline input it feeds.
struct Feeding {
    feed: Feed,
    /// Dropped (closing the input) once the source is exhausted.
    input: Option<Input>,
    /// The input queue is topped up to these once it is below half of them.
    max_items: usize,
    max_bytes: usize,
}

/// A started pipeline: iterate it for the outputs.
#[pyclass(module = "shmpipe._native", frozen)]
pub struct PipelineRun {
    rx: Mutex<Option<Receiver<Out>>>,
    /// Outputs received, not yet asked for.
    ready: Mutex<VecDeque<Item>>,
    feeding: Mutex<Option<Feeding>>,
    pump: Mutex<Option<JoinHandle<()>>>,
    done: Arc<AtomicBool>,
    pids: Vec<u32>,
    id: String,
}

impl std::fmt::Debug for PipelineRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineRun")
            .field("id", &self.id)
            .field("pids", &self.pids)
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
        b = b.channel(shmpipe::ChannelGeometry {
            slots: g(0) as u32,
            blocks: g(1) as u32,
            block_size: g(2) as usize,
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
        // Fed by this process (see `crate::source`): enqueue mode, no emitter. The input is
        // closed by the feed itself, never forgotten: no idle warning.
        Some("memory") => b.warn_idle_after(Duration::ZERO),
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

#[pymethods]
impl PipelineRun {
    /// Starts a pipeline described by `spec` (JSON, built by `shmpipe.Pipeline`), its
    /// children being `program args..` (the Python interpreter running `shmpipe._worker`).
    /// `source`: the in-memory source when `spec` says `{"kind": "memory"}`.
    #[staticmethod]
    #[pyo3(signature = (spec, program, args, prefetch=8, source=None))]
    fn start(
        py: Python<'_>,
        spec: &str,
        program: String,
        args: Vec<String>,
        prefetch: usize,
        source: Option<Bound<'_, PyAny>>,
    ) -> PyResult<PipelineRun> {
        let spec: Value = serde_json::from_str(spec).map_err(cfg_err)?;
        let feed = match (&source, spec["source"]["kind"].as_str()) {
            (Some(obj), Some("memory")) => Some(Feed::new(py, obj, feed_spec(&spec))?),
            _ => None,
        };
        let b = build(&spec, program, args)?;
        let mut p = py.detach(|| b.start()).map_err(|e| pipe_err(py, e))?;
        let feeding = match feed {
            Some(feed) => {
                let input = p.input().map_err(|e| pipe_err(py, e))?;
                let workers = spec["workers"].as_u64().unwrap_or(2).max(1) as usize;
                let batch = spec["batch_bytes"]
                    .as_u64()
                    .map_or(shmpipe::DEFAULT_BATCH_BYTES, |n| n as usize);
                Some(Feeding {
                    feed,
                    input: Some(input),
                    max_items: 4096,
                    // Four batches per worker wait in front of the channels.
                    max_bytes: (4 * batch * workers).max(1 << 20),
                })
            }
            None => None,
        };
        let (pids, id) = (p.pids(), p.id().to_owned());
        // Chunks of outputs: `prefetch` items in the old item-by-item terms.
        let (tx, rx) = sync_channel::<Out>(prefetch.div_ceil(4).max(1));
        let done = Arc::new(AtomicBool::new(false));
        let d = Arc::clone(&done);
        let pump = std::thread::spawn(move || {
            pump(p, &tx);
            d.store(true, Ordering::SeqCst);
        });
        Ok(PipelineRun {
            rx: Mutex::new(Some(rx)),
            ready: Mutex::new(VecDeque::new()),
            feeding: Mutex::new(feeding),
            pump: Mutex::new(Some(pump)),
            done,
            pids,
            id,
        })
    }

    /// Pids of the emitter and worker processes.
    #[getter]
    fn pids(&self) -> Vec<u32> {
        self.pids.clone()
    }

    /// The pipeline id (infix of its segment names).
    #[getter]
    fn id(&self) -> String {
        self.id.clone()
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        loop {
            let feeding = self.top_up(py)?;
            let ready = self
                .ready
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            if let Some(it) = ready {
                return item::to_py(py, it).map(Some);
            }
            // While this thread feeds the pipeline, it comes back often to top the input up.
            let slice = if feeding {
                Duration::from_millis(1)
            } else {
                SLICE
            };
            let r = py.detach(|| {
                let g = self.rx.lock().unwrap_or_else(|e| e.into_inner());
                match g.as_ref() {
                    Some(rx) => rx.recv_timeout(slice),
                    None => Err(RecvTimeoutError::Disconnected),
                }
            });
            match r {
                Ok(Ok(chunk)) => self
                    .ready
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(chunk),
                Ok(Err(e)) => {
                    let err = pipe_err(py, e);
                    self.close(py);
                    return Err(err);
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        // Ctrl-C: no grace for a step in progress, the interrupt comes first.
                        py.detach(|| self.shutdown(Duration::ZERO));
                        return Err(e);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
            }
        }
    }

    /// Stops every process and removes every segment (also done when garbage collected).
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.shutdown(GRACE));
    }
}

/// How long a closed pipeline's pump may take to reach its next output before the children
/// are killed.
const GRACE: Duration = Duration::from_secs(1);

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

/// The pump thread: moves the pipeline's outputs to `tx` in chunks of what is ready, then its
/// failure if it fails; drops the pipeline (stopping every process) when done or when the
/// receiver is gone.
fn pump(mut p: Pipeline, tx: &std::sync::mpsc::SyncSender<Out>) {
    while let Some(first) = p.next() {
        let first = match first {
            Ok(it) => it,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        let mut bytes = first.nbytes();
        let mut chunk = vec![first];
        let mut failed = None;
        while p.ready() > 0 && chunk.len() < CHUNK_ITEMS && bytes < CHUNK_BYTES {
            match p.next() {
                Some(Ok(it)) => {
                    bytes += it.nbytes();
                    chunk.push(it);
                }
                Some(Err(e)) => failed = Some(e),
                None => break,
            }
        }
        if tx.send(Ok(chunk)).is_err() {
            return;
        }
        if let Some(e) = failed {
            let _ = tx.send(Err(e));
            return;
        }
    }
}

impl PipelineRun {
    /// Feeds an in-memory source's next items when the input queue runs short; `true` while
    /// the source is not exhausted. Another thread already feeding is left to it (it holds
    /// the lock while it calls into Python, which may let this thread run: waiting for it
    /// with the GIL held would deadlock).
    fn top_up(&self, py: Python<'_>) -> PyResult<bool> {
        let Ok(mut g) = self.feeding.try_lock() else {
            return Ok(true);
        };
        let Some(f) = g.as_mut() else {
            return Ok(false);
        };
        let Some(input) = f.input.as_mut() else {
            return Ok(false);
        };
        if input.queued_items() >= f.max_items / 2 || input.queued_bytes() >= f.max_bytes / 2 {
            return Ok(true);
        }
        match f.feed.top_up(py, input, f.max_items, f.max_bytes) {
            Ok(false) => Ok(true),
            Ok(true) => {
                f.input = None; // end of input
                Ok(false)
            }
            Err(e) => {
                drop(g);
                py.detach(|| self.shutdown(Duration::ZERO));
                Err(e)
            }
        }
    }

    fn shutdown(&self, grace: Duration) {
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Ok(mut f) = self.feeding.try_lock() {
            f.take();
        }
        let Some(h) = self.pump.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        // The pump stops at its next output; one stuck in a step is ended by killing the
        // children (the pump then sees them die and drops the pipeline).
        let wait = |d: Duration| {
            let end = Instant::now() + d;
            while !self.done.load(Ordering::SeqCst) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(2));
            }
            self.done.load(Ordering::SeqCst)
        };
        if !wait(grace) {
            for &p in &self.pids {
                if let Some(pid) = rustix::process::Pid::from_raw(p as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            wait(Duration::from_secs(5));
        }
        if self.done.load(Ordering::SeqCst) {
            let _ = h.join();
        }
    }
}

impl Drop for PipelineRun {
    fn drop(&mut self) {
        self.shutdown(GRACE);
    }
}
