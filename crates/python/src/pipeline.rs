//! A running pipeline as a Python iterator.
//!
//! A Rust thread owns the `shmpipe::Pipeline` and moves its outputs into a bounded queue; the
//! Python thread takes them with the GIL released, in slices, checking for Ctrl-C between
//! slices. Closing drops the queue (the thread then drops the pipeline, which stops every
//! process and removes every segment); a pipeline stuck in a step is killed after a grace.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;
use shmpipe::{Epochs, Item, JsonLines, OnBadRecord, Pipeline, Topology, Transfer};

use crate::channel::SLICE;
use crate::errors::pipe_err;
use crate::{item, worker};

type Out = Result<Item, shmpipe::Error>;

/// A started pipeline: iterate it for the outputs (flat dicts).
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen)]
pub struct PipelineRun {
    rx: Mutex<Option<Receiver<Out>>>,
    pump: Mutex<Option<JoinHandle<()>>>,
    done: Arc<AtomicBool>,
    pids: Vec<u32>,
    id: String,
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
        Some("sequence") => {
            let h = share_source_fd(py, &mut b, &src["fd"])?;
            b.source_named(worker::PY_SOURCE, serde_json::json!({"fd": h}))
        }
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
    #[staticmethod]
    #[pyo3(signature = (spec, program, args, prefetch=8))]
    fn start(
        py: Python<'_>,
        spec: &str,
        program: String,
        args: Vec<String>,
        prefetch: usize,
    ) -> PyResult<PipelineRun> {
        let spec: Value = serde_json::from_str(spec).map_err(cfg_err)?;
        let b = build(py, &spec, program, args)?;
        let p = py.detach(|| b.start()).map_err(|e| pipe_err(py, e))?;
        let (pids, id) = (p.pids(), p.id().to_owned());
        let (tx, rx) = sync_channel::<Out>(prefetch.max(1));
        let done = Arc::new(AtomicBool::new(false));
        let d = Arc::clone(&done);
        let pump = std::thread::spawn(move || {
            let mut p = p;
            for r in p.by_ref() {
                if tx.send(r).is_err() {
                    break;
                }
            }
            drop(p);
            d.store(true, Ordering::SeqCst);
        });
        Ok(PipelineRun {
            rx: Mutex::new(Some(rx)),
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

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        loop {
            let r = py.detach(|| {
                let g = self.rx.lock().unwrap_or_else(|e| e.into_inner());
                match g.as_ref() {
                    Some(rx) => rx.recv_timeout(SLICE),
                    None => Err(RecvTimeoutError::Disconnected),
                }
            });
            match r {
                Ok(Ok(it)) => return item::to_py(py, it).map(Some),
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

impl PipelineRun {
    fn shutdown(&self, grace: Duration) {
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).take();
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
