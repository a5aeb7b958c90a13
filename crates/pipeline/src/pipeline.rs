//! The consumer side of a pipeline (the parent process): `Pipeline` and its consumer loop.
//! Settings types are in [`crate::config`], the ordered mode's buffer in [`crate::reorder`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub(crate) use crate::config::interrupt_flag;
pub use crate::config::{
    DEFAULT_BATCH_BYTES, DEFAULT_PIPELINE_THRESHOLD, DEFAULT_WARN_IDLE, Epochs, Metrics,
    OnBadRecord, Topology,
};
use crate::error::Error;
use crate::inline::{Inline, Progress};
use crate::input::{Feeder, Input, InputState};
use crate::item::Item;
use crate::node::{Inputs, NextError, Plan};
use crate::ready::Ready;
pub(crate) use crate::reorder::Reorder;
use crate::supervisor::Shared;
use crate::wire::{Frame, Stats, TransportError};

/// A running pipeline: the consumer end. Iterate it (or call [`Pipeline::dequeue`]) to get
/// the outputs; dropping it shuts every process down.
///
/// # Fork
/// A pipeline belongs to the process that started it. A child made by `fork()` (a forked
/// helper, `multiprocessing`'s fork start method) inherits a copy of the handle, and that copy
/// does nothing: dropping it neither stops nor kills the pipeline's processes, and
/// [`Pipeline::dequeue`], [`Pipeline::enqueue`] and [`Input::send`] in the child return
/// [`Error::Forked`] (they would take outputs and pool blocks meant for the parent). The
/// pipeline's processes watch their parent's process, not its descriptors, so they exit when
/// the parent dies even while a fork of it lives. A child that needs a pipeline starts its
/// own. Forks are noticed through `pthread_atfork` ([`shm_ring::Owner`]): forks made behind
/// the C library's back (a raw `clone` system call) are not seen, except by the drop, which
/// also compares the pid.
///
/// # Examples
/// ```no_run
/// use shmpipe::{map, Item, Pipeline, Registry};
/// let reg = Registry::new().step("inc", |_| Ok(map(|it: Item| {
///     let n = it.i64("n").unwrap_or(0);
///     Ok(it.with_meta("n", n + 1))
/// })));
/// shmpipe::init(&reg); // first thing in main: child processes divert here
/// let mut p = Pipeline::builder(&reg).step("inc").step("inc").workers(2).start()?;
/// p.enqueue(Item::new().with_meta("n", 3))?;
/// p.close_input();
/// assert_eq!(p.dequeue()?.unwrap().i64("n"), Some(5));
/// assert!(p.dequeue()?.is_none());
/// # Ok::<(), shmpipe::Error>(())
/// ```
pub struct Pipeline {
    pub(crate) plan: Plan,
    pub(crate) inputs: Option<Inputs>,
    pub(crate) feeder: Option<Feeder>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) supervisor: Option<JoinHandle<()>>,
    /// `workers(0)`: the steps, run in [`Pipeline::dequeue`]; no process, no `inputs`.
    pub(crate) inline: Option<Inline>,
    pub(crate) ready: Ready,
    pub(crate) reorder: Option<Reorder>,
    /// The process that started the pipeline: the only one in which the handle acts (a
    /// forked child's copy does nothing, see [`Pipeline`]'s fork section).
    pub(crate) owner: shm_ring::Owner,
    pub(crate) finished: bool,
    pub(crate) failed: bool,
    pub(crate) stats: Stats,
    pub(crate) items: u64,
    pub(crate) bytes: u64,
    pub(crate) started: Instant,
    /// When the consumer last looked for a dead child.
    pub(crate) last_check: Instant,
    pub(crate) ctrl_c: bool,
    /// See [`PipelineBuilder::warn_idle_after`](crate::PipelineBuilder::warn_idle_after).
    pub(crate) warn_idle: Duration,
    /// Since when the consumer has been waiting for an output without getting one.
    pub(crate) waiting_since: Option<Instant>,
    /// The idle warning was given.
    pub(crate) warned: bool,
    /// The descriptors shared with the children ([`PipelineBuilder::share_fd`](crate::PipelineBuilder::share_fd)): held for
    /// the pipeline's whole life.
    pub(crate) _shared: Vec<Arc<std::os::fd::OwnedFd>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("id", &self.plan.id)
            .field("finished", &self.finished)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// The pipeline's id (it names the pipeline in messages; nothing on the system carries
    /// it: channels are anonymous).
    pub fn id(&self) -> &str {
        &self.plan.id
    }

    /// Pids of the child processes (emitters, then workers by stage).
    pub fn pids(&self) -> Vec<u32> {
        let kids = self
            .shared
            .children
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        kids.iter().map(|c| c.child.id()).collect()
    }

    /// Enqueue mode (no source): feeds one item. Never blocks. [`Pipeline::input`] gives a
    /// handle that closes the input when dropped.
    ///
    /// # Errors
    /// [`Error::Closed`] with a source configured, after [`Pipeline::close_input`], after
    /// [`Pipeline::input`], or when the pipeline has failed.
    pub fn enqueue(&mut self, item: Item) -> Result<(), Error> {
        self.check_owner()?;
        let f = self
            .feeder
            .as_mut()
            .ok_or_else(|| Error::Closed("enqueue needs a pipeline without a source".into()))?;
        if self.failed {
            return Err(Error::Closed("the pipeline has failed".into()));
        }
        let Some(input) = f.input.as_mut() else {
            return Err(Error::Closed(
                "input already closed, or handed out by Pipeline::input".into(),
            ));
        };
        // A failed input is reported here and, with the process that explains it when there is
        // one, by `dequeue`: the pipeline is not marked failed yet.
        input.send(item)
    }

    /// Enqueue mode: takes the input as a handle whose drop closes it (like a channel's
    /// sender); it can be moved to another thread. Afterwards [`Pipeline::enqueue`] and
    /// [`Pipeline::close_input`] do nothing useful: the handle is the input.
    ///
    /// # Errors
    /// [`Error::Closed`] with a source configured, or when the input was already handed out or
    /// closed.
    pub fn input(&mut self) -> Result<Input, Error> {
        let f = self
            .feeder
            .as_mut()
            .ok_or_else(|| Error::Closed("input needs a pipeline without a source".into()))?;
        f.input.take().ok_or_else(|| {
            Error::Closed("input already closed, or handed out by Pipeline::input".into())
        })
    }

    /// Enqueue mode: marks the end of the input. The consumer's stream ends after the outputs
    /// of every enqueued item. (Dropping the handle from [`Pipeline::input`] does the same.)
    pub fn close_input(&mut self) {
        if let Some(f) = self.feeder.as_mut() {
            f.input = None;
        }
    }

    /// Enqueue mode, the common case: feeds every item, closes the input and collects every
    /// output (unordered unless [`PipelineBuilder::ordered`](crate::PipelineBuilder::ordered)).
    ///
    /// # Errors
    /// The first failure of the pipeline.
    ///
    /// # Examples
    /// ```no_run
    /// use shmpipe::{map, Item, Pipeline, Registry};
    /// let reg = Registry::new().step("inc", |_| Ok(map(|it: Item| {
    ///     let n = it.i64("n").unwrap_or(0);
    ///     Ok(it.with_meta("n", n + 1))
    /// })));
    /// shmpipe::init(&reg);
    /// let p = Pipeline::builder(&reg).step("inc").start()?;
    /// let out = p.run((0..10).map(|n| Item::new().with_meta("n", n)))?;
    /// assert_eq!(out.len(), 10);
    /// # Ok::<(), shmpipe::Error>(())
    /// ```
    pub fn run<I: IntoIterator<Item = Item>>(mut self, items: I) -> Result<Vec<Item>, Error> {
        for it in items {
            self.enqueue(it)?;
        }
        self.close_input();
        self.collect()
    }

    /// The next output; `Ok(None)` after the end of stream (or after a failure was reported).
    ///
    /// # Errors
    /// The first failure of the pipeline (a step error, a bad record, a dead process, Ctrl-C);
    /// the pipeline is shut down before the error is returned.
    pub fn dequeue(&mut self) -> Result<Option<Item>, Error> {
        self.dequeue_until(None)
    }

    /// [`Pipeline::dequeue`], waiting at most `timeout` for an output.
    ///
    /// # Errors
    /// [`Error::Timeout`] when no output came within `timeout`: the pipeline runs on (call
    /// again). Any other error is a failure, as from [`Pipeline::dequeue`].
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use shmpipe::{map, Error, Item, Pipeline, Registry};
    /// let reg = Registry::new().step("id", |_| Ok(map(Ok)));
    /// shmpipe::init(&reg);
    /// let mut p = Pipeline::builder(&reg).step("id").start()?;
    /// // Nothing enqueued yet: no output within 10 ms, and the pipeline is fine.
    /// assert!(matches!(p.dequeue_timeout(Duration::from_millis(10)), Err(Error::Timeout)));
    /// p.enqueue(Item::new().with_meta("n", 1))?;
    /// assert!(p.dequeue_timeout(Duration::from_secs(10))?.is_some());
    /// # Ok::<(), shmpipe::Error>(())
    /// ```
    pub fn dequeue_timeout(&mut self, timeout: Duration) -> Result<Option<Item>, Error> {
        self.dequeue_until(Some(Instant::now() + timeout))
    }

    /// How many inputs (records of the source, or enqueued items) have had every one of their
    /// outputs returned by [`Pipeline::dequeue`]; an input without outputs counts once the
    /// outputs of the inputs before it in the consumer's stream are out. Outputs made by
    /// [`Step::finish`](crate::Step::finish) belong to no input.
    ///
    /// With [`Pipeline::enqueue`], `enqueued - inputs_done()` inputs are still in the
    /// pipeline: a bound on that is back-pressure that does not depend on how many outputs
    /// each input has.
    pub fn inputs_done(&self) -> u64 {
        self.ready.done()
    }

    fn dequeue_until(&mut self, deadline: Option<Instant>) -> Result<Option<Item>, Error> {
        self.check_owner()?;
        loop {
            if let Some(it) = self.ready.pop() {
                self.waiting_since = None;
                self.items += 1;
                self.bytes += it.nbytes() as u64;
                return Ok(Some(it));
            }
            if self.finished || self.failed {
                return Ok(None);
            }
            if self.inline.is_some() {
                self.next_inline(deadline)?;
                continue;
            }
            // A busy consumer rarely waits (where `idle` checks): look at the supervisor here too.
            if self.last_check.elapsed() > Duration::from_millis(20) {
                self.last_check = Instant::now();
                if let Some(e) = self.shared.take_primary() {
                    return Err(self.fail(e));
                }
            }
            let since = *self.waiting_since.get_or_insert_with(Instant::now);
            let input = self.feeder.as_ref().map(|f| Arc::clone(&f.state));
            let watch = input
                .clone()
                .filter(|_| !self.warned && !self.warn_idle.is_zero());
            let (warn_idle, id) = (self.warn_idle, self.plan.id.as_str());
            let warned = &mut self.warned;
            let Some(inputs) = self.inputs.as_mut() else {
                return Ok(None);
            };
            let shared = Arc::clone(&self.shared);
            let ctrl_c = self.ctrl_c;
            let mut idle = || -> Result<(), Error> {
                // A forgotten `close_input()` must not be a silent hang: say so, once.
                if let Some(st) = &watch
                    && !*warned
                    && since.elapsed() >= warn_idle
                    && !st.closed.load(Ordering::Relaxed)
                    && st.idle_for() >= warn_idle
                {
                    *warned = true;
                    warn_forgotten_close(id, st, since);
                }
                match stop_waiting(ctrl_c, &shared, input.as_deref(), deadline) {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            };
            match inputs.next(&mut idle) {
                Ok(Some((i, frames))) => self.handle(i, frames)?,
                Ok(None) => {
                    self.finished = true;
                    if let Some(r) = self.reorder.as_mut() {
                        r.flush(&mut self.ready);
                    }
                }
                Err(NextError::Idle(Error::Timeout)) => return Err(Error::Timeout),
                Err(NextError::Idle(e)) => return Err(self.fail(e)),
                Err(NextError::Input(i, e)) => {
                    let err = self.connection_lost(i, &e, input.as_deref());
                    return Err(self.fail(err));
                }
            }
        }
    }

    /// The error for the lost connection from worker `i` (of the last stage): a lost
    /// connection is usually the consequence of a dead process, so the supervisor gets a
    /// moment (500 ms) to name it; `e` is the error only when nothing better is known.
    fn connection_lost(
        &mut self,
        i: usize,
        e: &TransportError,
        input: Option<&InputState>,
    ) -> Error {
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            self.shared.poll_children();
            if let Some(err) = self.shared.take_primary() {
                return err;
            }
            // Enqueue mode: the input thread failed (e.g. an item too large for the channels),
            // and the workers it fed lost their peer.
            if let Some((_, m)) = input.and_then(|st| st.failure()) {
                return Error::transport(format!("enqueue: {m}"));
            }
            if Instant::now() > deadline {
                let last = self.plan.stages.len() - 1;
                return self.shared.take_secondary().unwrap_or_else(|| {
                    e.to_error(format!("connection from worker {i} (stage {last})"))
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `workers(0)`: runs the next enqueued item through the steps, here.
    fn next_inline(&mut self, deadline: Option<Instant>) -> Result<(), Error> {
        let ctrl_c = self.ctrl_c;
        let interrupted = || {
            (ctrl_c && interrupt_flag(false).load(Ordering::Relaxed)).then_some(Error::Interrupted)
        };
        let Some(inline) = self.inline.as_mut() else {
            return Ok(());
        };
        match inline.next(&mut self.ready, deadline, &interrupted) {
            Ok(Progress::Input) => Ok(()),
            Ok(Progress::End) => {
                self.finished = true;
                Ok(())
            }
            Err(Error::Timeout) => Err(Error::Timeout),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Takes a batch from input `i` (worker `i` of the last stage).
    fn handle(&mut self, i: usize, frames: Vec<Frame>) -> Result<(), Error> {
        for f in frames {
            // Items are matched first on their own (not in a tuple): an item is a few hundred
            // bytes, and every move of it showed in the consumer's profile.
            let checked = if let Frame::Item { e, k, last, item } = f {
                match self.reorder.as_mut() {
                    None => {
                        self.ready.push(item);
                        if last {
                            self.ready.end_group();
                        }
                        Ok(())
                    }
                    Some(r) => r.add(e, k, Some(item), last),
                }
            } else {
                match (f, self.reorder.as_mut()) {
                    (Frame::GroupEnd { e, k }, Some(r)) => r.add(e, k, None, true),
                    (Frame::GroupEnd { .. }, None) => {
                        self.ready.end_group();
                        Ok(())
                    }
                    (Frame::EmitterDone { e, n }, Some(r)) => r.emitter_done(e, n),
                    (Frame::Eos(s), _) => {
                        self.stats.merge(&s);
                        Ok(())
                    }
                    (Frame::Error(rep), _) => match self.plan.check_report(&rep) {
                        Ok(()) => return Err(self.fail(rep.into())),
                        Err(m) => Err(m),
                    },
                    _ => Ok(()),
                }
            };
            if let Err(m) = checked {
                let last = self.plan.stages.len() - 1;
                return Err(self.fail(Error::transport(format!(
                    "worker {i} (stage {last}) sent {m}: a corrupt or hostile worker"
                ))));
            }
        }
        if let Some(r) = self.reorder.as_mut() {
            r.release(&mut self.ready);
        }
        Ok(())
    }

    /// `Err(Error::Forked)` in any process but the one that started the pipeline (one load and
    /// one compare).
    fn check_owner(&self) -> Result<(), Error> {
        if self.owner.is_current() {
            return Ok(());
        }
        Err(Error::Forked {
            owner: self.owner.pid(),
            caller: std::process::id(),
        })
    }

    /// Marks the pipeline failed and stops its processes; returns `e`.
    fn fail(&mut self, e: Error) -> Error {
        self.failed = true;
        self.ready.clear();
        self.inline = None;
        self.teardown();
        e
    }

    /// Endless mode ([`Epochs::Cycle`]): the next `n` outputs, one training epoch.
    pub fn take_epoch(&mut self, n: usize) -> std::iter::Take<&mut Pipeline> {
        self.by_ref().take(n)
    }

    /// Counters so far.
    pub fn metrics(&self) -> Metrics {
        let (hit, miss) = self
            .inputs
            .as_ref()
            .map_or((0, 0), |i| (i.ready_polls, i.empty_polls));
        Metrics {
            items: self.items,
            bytes: self.bytes,
            elapsed: self.started.elapsed(),
            steps: self
                .stats
                .steps
                .iter()
                .map(|(n, c, ns)| (n.clone(), *c, Duration::from_nanos(*ns)))
                .collect(),
            queue_occupancy: if hit + miss == 0 {
                0.0
            } else {
                hit as f64 / (hit + miss) as f64
            },
            arrays_zero_copy: self.stats.zero_copy,
            arrays_copied: self.stats.copied,
            skipped_records: self.stats.skipped,
        }
    }

    /// How many outputs [`dequeue`](Pipeline::dequeue) returns without waiting: what is left
    /// of the batches received so far. A consumer that hands outputs to another thread can
    /// take them in chunks of this size.
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    /// Whether the end of stream was reached.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Stops every process (also done by `Drop`). There is nothing to remove: channels are
    /// anonymous and go with the last process that maps them.
    fn teardown(&mut self) {
        // Children learn that this is deliberate before anything they use goes away, so that
        // none of them reports the lost peers.
        self.shared.announce_stop();
        if let Some(f) = self.feeder.as_mut() {
            f.cancel.store(true, Ordering::Relaxed);
            f.input = None;
        }
        self.inputs = None;
        let grace = if self.finished {
            Duration::from_secs(1)
        } else {
            Duration::ZERO
        };
        self.shared.stop_children(grace);
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.supervisor.take() {
            let _ = h.join();
        }
        if let Some(h) = self.feeder.as_mut().and_then(|f| f.handle.take()) {
            // Its sends give up within milliseconds of the cancel flag; a thread that still
            // has not ended after a bound is left to end on its own, never waited for.
            let deadline = Instant::now() + Duration::from_secs(2);
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

/// Why a consumer waiting for output must stop waiting, if it must: Ctrl-C (with `ctrl_c`), a
/// primary failure, the input thread stopped, the `deadline` passed.
fn stop_waiting(
    ctrl_c: bool,
    shared: &Shared,
    input: Option<&InputState>,
    deadline: Option<Instant>,
) -> Option<Error> {
    if ctrl_c && interrupt_flag(false).load(Ordering::Relaxed) {
        return Some(Error::Interrupted);
    }
    // Only primary failures here: a secondary one (a child that lost a peer) may race with
    // the error report that explains it, which is still in a ring.
    if let Some(e) = shared.take_primary() {
        return Some(e);
    }
    // The input thread stopped (the first stage cannot take more): after a moment for the
    // supervisor to name a dead process behind it, that is the error.
    if let Some((at, m)) = input.and_then(|st| st.failure())
        && at.elapsed() > Duration::from_millis(500)
    {
        return Some(Error::transport(format!("enqueue: {m}")));
    }
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return Some(Error::Timeout);
    }
    None
}

/// A forgotten `close_input()` must not be a silent hang: says so (once; the caller keeps
/// count) when pipeline `id` has waited for input while its consumer waits for output.
fn warn_forgotten_close(id: &str, st: &InputState, since: Instant) {
    eprintln!(
        "shmpipe: pipeline {id} has been waiting for input for {:.1} s while its consumer \
         waits for output; if the input is complete, call close_input() (or drop the Input \
         handle)",
        st.idle_for().min(since.elapsed()).as_secs_f64()
    );
}

impl Iterator for Pipeline {
    type Item = Result<Item, Error>;
    fn next(&mut self) -> Option<Self::Item> {
        self.dequeue().transpose()
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        if self.owner.is_current_strict() {
            self.teardown();
            return;
        }
        // A forked child's copy: it must not stop, kill or join anything of the parent's, nor
        // touch a lock that a thread of the parent (which the child does not have) may have
        // held at the fork. What holds shared memory or threads is forgotten; the child's copy
        // of the memory goes with the child. The rest (descriptors, plain memory) is the
        // child's own copy and goes with the fields' drops.
        std::mem::forget(self.inputs.take());
        std::mem::forget(self.feeder.take());
        std::mem::forget(self.supervisor.take());
        std::mem::forget(std::mem::take(&mut self.ready));
        std::mem::forget(self.reorder.take());
        std::mem::forget(self.inline.take());
    }
}
