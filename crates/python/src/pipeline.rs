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
use shmpipe::{Item, JsonLines, Records, Source, SourceContext};

use crate::memory_source::Feed;
use crate::pipeline_errors::{Origin, pipe_err, source_err};
use crate::pump::{GRACE, Pump};
use crate::run::{Backend, Fed, Run};
use crate::run_spec::{RunSpec, SourceKind, SourceSpec};
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

/// The source this process reads itself (`spec.feed`; `obj`: the in-memory source of a feed
/// of kind `"object"`), read as an emitter of this job's part would read it.
fn feed_records(
    py: Python<'_>,
    spec: &RunSpec,
    feed: &SourceSpec,
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Fed> {
    let (rank, world) = (spec.rank, spec.world_size);
    let source: Box<dyn Source> = match (feed.kind()?, obj) {
        (SourceKind::Jsonl(path), _) => {
            let part = JsonLines::new(path).open(rank, world);
            Box::new(part.map_err(|e| pipe_err(py, source_err(e)))?)
        }
        (SourceKind::Named(name, args), _) => {
            let cx = SourceContext {
                args: &args,
                part: rank,
                parts: world,
            };
            worker::registry()
                .build_source(&name, &cx)
                .map_err(|e| pipe_err(py, source_err(e)))?
        }
        (SourceKind::Object, Some(obj)) => {
            return Ok(Fed::Memory(Feed::new(obj, spec.feed_spec())?));
        }
        (SourceKind::Object, None) => {
            return Err(PyValueError::new_err(
                "an in-memory feed without its source object",
            ));
        }
    };
    Ok(Fed::Records(Records::new(source, spec.read_order())))
}

use crate::timeout::deadline;

#[pymethods]
impl PipelineRun {
    /// Starts a pipeline described by `spec` (a `shmpipe.pipeline.RunSpec`), its children
    /// being `program args..` (the Python interpreter running the worker entry point).
    /// Without `spec.source` the pipeline takes its input from `enqueue`, or, with
    /// `spec.feed`, from that source read here (`feed`: the Python object of a feed of kind
    /// `"object"`), epoch by epoch.
    #[staticmethod]
    #[pyo3(signature = (spec, program, args, feed=None))]
    fn start(
        py: Python<'_>,
        spec: RunSpec,
        program: String,
        args: Vec<String>,
        feed: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PipelineRun> {
        let records = match &spec.feed {
            Some(f) => Some(feed_records(py, &spec, f, feed)?),
            None => None,
        };
        let b = spec.builder(program, args)?;
        let mut p = py.detach(|| b.start()).map_err(|e| pipe_err(py, e))?;
        let id = p.id().to_owned();
        let input = if spec.source.is_some() {
            None
        } else {
            Some(p.input().map_err(|e| pipe_err(py, e))?)
        };
        let inline = spec.workers == 0;
        let max_in_flight = if inline {
            u64::MAX
        } else {
            spec.max_in_flight.max(1)
        };
        let backend = if inline {
            Backend::Inline(Box::new(std::sync::Mutex::new(Some(p))))
        } else {
            Backend::Pump(Pump::start(p, spec.prefetch))
        };
        let warn_idle = match spec.warn_idle {
            Some(s) => crate::timeout::seconds(s, "warn_idle")?.unwrap_or(Duration::MAX),
            None => Duration::MAX,
        };
        let origin = match (&spec.feed, &records) {
            (_, Some(Fed::Memory(_))) => Origin::Fed,
            (Some(_), _) => Origin::FedFile,
            (None, _) if input.is_some() => Origin::Enqueued,
            _ => Origin::Emitters,
        };
        let run = Run::new(backend, input, max_in_flight, records, warn_idle, origin);
        Ok(PipelineRun {
            run: ManuallyDrop::new(run),
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
        let out = self.run.next(py)?;
        self.hand_over(py, out)
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
        let out = self.run.dequeue(py, d, timeout)?;
        self.hand_over(py, out)
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
        let out = self.run.next_in_epoch(py)?;
        self.hand_over(py, out)
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
    /// An output as Python; a signal handler raising now (after the wait that brought the
    /// output, or during its conversion) stops the pipeline, as it does in a wait without
    /// one. Checked before the conversion too, which runs Python code (`_tree.unflatten`),
    /// where the handler would otherwise raise with the pipeline running on.
    fn hand_over<'py>(
        &self,
        py: Python<'py>,
        out: Option<Item>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(it) = out else {
            return Ok(None);
        };
        self.run.interrupted(py)?;
        let obj = item_to_py(py, it)?;
        self.run.interrupted(py)?;
        Ok(Some(obj))
    }

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
