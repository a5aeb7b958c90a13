//! The pump: a Rust thread that owns a pipeline with worker processes and moves its outputs
//! into a bounded queue, so that reading the rings and decoding batches happen while Python
//! works on the previous output. Outputs travel in chunks: one wake-up of the consumer per
//! chunk of small outputs ([`CHUNK_ITEMS`], [`CHUNK_BYTES`]). Every message says how many
//! inputs are done after it (`Pipeline::inputs_done`), which is what `pending`, epoch ends
//! and the bound of `enqueue` are counted with.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shmpipe::{Error, Item, Pipeline};

/// What the pump hands over, in the pipeline's output order.
#[derive(Debug)]
pub(crate) enum Msg {
    /// An output; then `done` inputs have had all their outputs handed over.
    Item(Item, u64),
    /// No output, but `done` inputs are done now (inputs without outputs).
    Progress(u64),
    /// The pipeline failed here (the error is in [`Pump::failure`]); nothing follows.
    Failed,
}

impl Msg {
    /// Inputs done once this message is taken (`None`: not a count).
    pub(crate) fn done(&self) -> Option<u64> {
        match self {
            Msg::Item(_, d) | Msg::Progress(d) => Some(*d),
            Msg::Failed => None,
        }
    }
}

/// How long the pump waits for an output before it looks at its stop flag and reports
/// progress.
const PUMP_SLICE: Duration = Duration::from_millis(20);

/// How long a closed pipeline's pump may take to reach its next output before the children
/// are killed.
pub(crate) const GRACE: Duration = Duration::from_secs(1);

/// The consumer side of a pump. The queue's end is disconnected after the end of stream.
#[derive(Debug)]
pub(crate) struct Pump {
    rx: Mutex<Option<Receiver<Vec<Msg>>>>,
    handle: Mutex<Option<JoinHandle<()>>>,
    /// Why the pipeline failed (taken by whoever reports it first).
    pub(crate) failure: Arc<Mutex<Option<Error>>>,
    /// Raised to stop the pump at its next slice.
    stop: Arc<AtomicBool>,
    /// The pump dropped its pipeline (every process is gone).
    done: Arc<AtomicBool>,
    pids: Vec<u32>,
}

/// Most outputs handed over in one message of the pump's queue: one wake-up of the consumer
/// per chunk of small items, not per item.
const CHUNK_ITEMS: usize = 64;

/// A chunk ends once its outputs hold this many array bytes. This is the pipeline's
/// zero-copy threshold (the Python binding never lowers it): an output that keeps a pool
/// block travels alone, as before chunks, so the pump holds no more blocks the workers may
/// wait for.
const CHUNK_BYTES: usize = shmpipe::DEFAULT_PIPELINE_THRESHOLD;

/// The next chunk of messages: waits up to a slice for the first output, then takes what
/// is ready without waiting. `true`: nothing follows the chunk (the end, or a failure).
fn chunk(
    p: &mut Pipeline,
    told: &mut u64,
    out: &mut Vec<Msg>,
    failure: &Mutex<Option<Error>>,
) -> bool {
    let mut bytes = 0usize;
    loop {
        let wait = if out.is_empty() {
            PUMP_SLICE
        } else {
            Duration::ZERO
        };
        match p.dequeue_timeout(wait) {
            Ok(Some(it)) => {
                *told = p.inputs_done();
                bytes = bytes.saturating_add(it.nbytes());
                out.push(Msg::Item(it, *told));
                if out.len() >= CHUNK_ITEMS || bytes >= CHUNK_BYTES {
                    return false;
                }
            }
            Ok(None) => {
                if p.inputs_done() != *told {
                    out.push(Msg::Progress(p.inputs_done()));
                }
                return true; // the end: dropping `tx` disconnects the queue
            }
            Err(Error::Timeout) => {
                if p.inputs_done() != *told {
                    *told = p.inputs_done();
                    out.push(Msg::Progress(*told));
                }
                return false;
            }
            Err(e) => {
                *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                out.push(Msg::Failed);
                return true;
            }
        }
    }
}

fn pump(
    mut p: Pipeline,
    tx: SyncSender<Vec<Msg>>,
    failure: &Mutex<Option<Error>>,
    stop: &AtomicBool,
) {
    let mut told = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let mut out = Vec::new();
        let last = chunk(&mut p, &mut told, &mut out, failure);
        if !out.is_empty() && tx.send(out).is_err() {
            return;
        }
        if last {
            return;
        }
    }
}

/// The most chunks a pump reads ahead (`shmpipe._options.MAX_PREFETCH`).
pub(crate) const MAX_PREFETCH: usize = 1 << 16;

impl Pump {
    /// Starts the pump over `p`, with room for `prefetch` chunks of messages (1 to
    /// [`MAX_PREFETCH`]: the queue takes its room up front).
    pub(crate) fn start(p: Pipeline, prefetch: usize) -> Pump {
        let pids = p.pids();
        // Never sized from an unchecked number (review 18, hole 5): `shmpipe.Pipeline` checks
        // `prefetch=` against the same bound.
        let (tx, rx) = sync_channel::<Vec<Msg>>(prefetch.clamp(1, MAX_PREFETCH));
        let failure = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let (f, s, d) = (Arc::clone(&failure), Arc::clone(&stop), Arc::clone(&done));
        let handle = std::thread::spawn(move || {
            pump(p, tx, &f, &s);
            // `pump` dropped the pipeline: its processes are gone.
            d.store(true, Ordering::SeqCst);
        });
        Pump {
            rx: Mutex::new(Some(rx)),
            handle: Mutex::new(Some(handle)),
            failure,
            stop,
            done,
            pids,
        }
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        self.pids.clone()
    }

    /// Waits up to `wait` for the next chunk of messages and gives it to `sink`, then up to
    /// `more` chunks already queued, before anyone else can take one: messages taken by
    /// several threads stay in order, and a wake-up takes what came meanwhile.
    /// `Disconnected`: the end of stream was handed over (or the pump was shut down).
    pub(crate) fn recv_into(
        &self,
        wait: Duration,
        more: usize,
        mut sink: impl FnMut(Vec<Msg>),
    ) -> Result<(), RecvTimeoutError> {
        let g = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(rx) = g.as_ref() else {
            return Err(RecvTimeoutError::Disconnected);
        };
        sink(rx.recv_timeout(wait)?);
        for m in rx.try_iter().take(more) {
            sink(m);
        }
        Ok(())
    }

    /// Takes the pipeline's error, if it failed and nobody took it yet.
    pub(crate) fn take_failure(&self) -> Option<Error> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Stops the pump; its pipeline stops every process (those stuck in a step are killed
    /// after `grace`).
    pub(crate) fn shutdown(&self, grace: Duration) {
        self.stop.store(true, Ordering::SeqCst);
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(h) = self.handle.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        // The pump stops within a slice, or at its next output; one whose pipeline is stuck
        // in a step is ended by killing the children (the pipeline then sees them die).
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

impl Drop for Pump {
    fn drop(&mut self) {
        self.shutdown(GRACE);
    }
}
