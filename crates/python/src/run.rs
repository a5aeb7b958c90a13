//! A started pipeline as Python drives it: `enqueue` with a bound on the inputs in flight,
//! `dequeue` with an exact end, a parent-fed source read epoch by epoch (persistent workers,
//! `workers=0`), and the same errors whatever the backend.
//!
//! Counting: `fed` inputs were enqueued; `left` of them have had all their outputs taken off
//! the pump's queue (by `dequeue`, or by an `enqueue` that makes room, see below);
//! `user_done` of them have had all their outputs returned to the user. `fed - left` is what
//! the processes hold (bounded by `max_in_flight`), `fed - user_done` is `pending`, and an
//! epoch ends when its last input is fed and `user_done == fed`.
//!
//! A full pipeline makes `enqueue` wait for another thread's `dequeue`. When no other thread
//! dequeues (the calling thread is the consumer, or nobody dequeued yet), waiting would never
//! end: `enqueue` then takes outputs off the queue itself and keeps them (`taken`) for the
//! next `dequeue`, in order. Nothing deadlocks; memory then grows with the outputs the caller
//! has not dequeued, never with what the processes hold. Whoever takes a message off the
//! pump's queue appends it to `taken` while it still holds the queue, and `dequeue` returns
//! the front of `taken`: the order holds with any number of threads.
//!
//! The counts come from the workers' group ends: a corrupt worker could report more inputs
//! done than were fed, so they are clamped to `fed` (never an underflow; at worst an epoch
//! that ends before its last outputs, which then come with the next one).
//!
//! Locks: `state` and `input` are held briefly and never across Python code or a wait; the
//! inline pipeline and the source are locked without the GIL (their use runs Python code,
//! which may release it).

use std::collections::VecDeque;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyException, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use shmpipe::{Error, Input, Item, Pipeline, Records};

use crate::channel::SLICE;
use crate::exceptions::PipelineError;
use crate::memory_source::Feed;
use crate::pipeline_errors::{Origin, pipe_err, run_err};
use crate::pump::{Msg, Pump};

/// A source this process reads and feeds to the pipeline, epoch by epoch.
pub(crate) enum Fed {
    /// A file or a named source, read as one emitter would.
    Records(Records),
    /// An in-memory Python source ([`crate::memory_source`]).
    Memory(Feed),
}

/// Largest group of in-memory source items handed to the input thread at once.
const GROUP_ITEMS: usize = 256;
const GROUP_BYTES: usize = 1 << 20;
/// A group is handed on after this long even if short: a slow source (a generator that waits
/// for a sensor, a queue, a socket) streams.
const GROUP_TIME: Duration = Duration::from_millis(5);
/// A top-up returns to deliver outputs once they wait, or after this long.
const TOP_UP_TIME: Duration = Duration::from_millis(20);

/// Who runs the steps.
pub(crate) enum Backend {
    /// Worker processes; outputs come through the pump.
    Pump(Pump),
    /// `workers=0`: the steps run in the thread that dequeues.
    Inline(Box<Mutex<Option<Pipeline>>>),
}

/// How a wait for an output ended.
pub(crate) enum Out {
    Item(Item),
    /// The end of stream.
    End,
    /// `user_done` reached the count asked for.
    Reached,
    Timeout,
}

#[derive(Default)]
struct State {
    fed: u64,
    left: u64,
    user_done: u64,
    /// Messages taken off the pump's queue, not yet returned by `dequeue` (in order).
    taken: VecDeque<Msg>,
    /// The thread that dequeues (the last one that did).
    consumer: Option<ThreadId>,
    /// The pipeline's failure, raised again by every later call.
    failure: Option<PyErr>,
    /// The end of stream was handed out.
    ended: bool,
    /// `close()`, or Ctrl-C, stopped the pipeline.
    closed: bool,
    /// The current epoch of the parent-fed source has been read to its end.
    exhausted: bool,
    /// The word about a forgotten `close_input()` was said.
    warned: bool,
}

/// A running pipeline (see the module doc).
pub(crate) struct Run {
    backend: Backend,
    input: Mutex<Option<Input>>,
    state: Mutex<State>,
    /// Notified when `left` grows or the pipeline fails (for `enqueue`s waiting for room).
    room: Condvar,
    /// Bound of `fed - left` for `enqueue` (`u64::MAX`: none).
    max_in_flight: u64,
    /// Bound of `fed - left` when feeding the parent-fed source: `max_in_flight`, or one
    /// input at a time with `workers=0` (read as late as possible).
    feed_ahead: u64,
    /// The parent-fed source, if any.
    feed: Mutex<Option<Fed>>,
    /// A `dequeue` that waits this long with nothing in the pipeline and the input open says
    /// so on stderr, once (zero: never).
    warn_idle: Duration,
    /// Where the inputs come from (what a step error says of the failing one).
    origin: Origin,
}

/// Inputs of a source read by this process kept in flight, at least.
const FEED_AHEAD: u64 = 4096;

/// Array bytes of a source read by this process waiting in front of the channels, at most.
const FEED_BYTES: usize = 16 << 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The wait before the next look at signals and the deadline.
fn slice(deadline: Option<Instant>) -> Duration {
    deadline.map_or(SLICE, |d| {
        d.saturating_duration_since(Instant::now()).min(SLICE)
    })
}

impl Run {
    /// `input`: the pipeline's input (enqueue mode); `feed`: a source this process reads.
    pub(crate) fn new(
        backend: Backend,
        input: Option<Input>,
        max_in_flight: u64,
        feed: Option<Fed>,
        warn_idle: Duration,
        origin: Origin,
    ) -> Run {
        // A source this process reads keeps the workers busy with many small inputs: at least
        // `FEED_AHEAD` in flight (their bytes are bounded by the channels and `feed_bytes`).
        let feed_ahead = match backend {
            Backend::Pump(_) => max_in_flight.max(FEED_AHEAD),
            Backend::Inline(_) => 1,
        };
        Run {
            origin,
            backend,
            feed_ahead,
            input: Mutex::new(input),
            state: Mutex::new(State {
                exhausted: true,
                ..State::default()
            }),
            room: Condvar::new(),
            max_in_flight,
            feed: Mutex::new(feed),
            warn_idle,
        }
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        match &self.backend {
            Backend::Pump(p) => p.pids(),
            Backend::Inline(_) => Vec::new(),
        }
    }

    /// Inputs enqueued whose outputs have not all been returned yet.
    pub(crate) fn pending(&self) -> u64 {
        let st = lock(&self.state);
        st.fed.saturating_sub(st.user_done)
    }

    /// Inputs fed to the pipeline so far (enqueued, or read from the parent-fed source).
    pub(crate) fn fed(&self) -> u64 {
        lock(&self.state).fed
    }

    /// Stops every process (at once with `grace` zero) and frees the shared memory; later
    /// calls raise `ValueError` (or the failure, if there was one).
    pub(crate) fn close(&self, py: Python<'_>, grace: Duration) {
        lock(&self.state).closed = true;
        lock(&self.input).take();
        match &self.backend {
            Backend::Pump(p) => py.detach(|| p.shutdown(grace)),
            Backend::Inline(m) => drop(py.detach(|| lock(m).take())),
        }
        self.room.notify_all();
    }

    /// The state's sticky outcomes: a failure, or closed.
    fn check_open(&self, py: Python<'_>, st: &State) -> PyResult<()> {
        if let Some(e) = &st.failure {
            return Err(e.clone_ref(py));
        }
        if st.closed {
            return Err(PyValueError::new_err("the pipeline is closed"));
        }
        Ok(())
    }

    /// Records `e` as the pipeline's failure (stopping it) and returns it.
    fn fail(&self, py: Python<'_>, e: PyErr) -> PyErr {
        lock(&self.state).failure = Some(e.clone_ref(py));
        self.close(py, Duration::ZERO);
        e
    }

    /// A pipeline error as the Python exception. With `workers=0` the failing Python step's
    /// own exception is its cause, or is raised itself (`KeyboardInterrupt`, `SystemExit`).
    fn convert(&self, py: Python<'_>, e: Error) -> PyErr {
        let raised = match (&self.backend, &e) {
            (Backend::Inline(_), Error::Step { .. }) => crate::worker::take_raised(),
            _ => None,
        };
        if let Some(r) = raised {
            if !r.is_instance_of::<PyException>(py) {
                return r;
            }
            let err = run_err(py, e, self.origin, true);
            err.set_cause(py, Some(r));
            return err;
        }
        let inline = matches!(self.backend, Backend::Inline(_));
        run_err(py, e, self.origin, inline)
    }

    /// After a wait without news: Ctrl-C stops the pipeline; past the deadline, `Ok(true)`.
    fn waited(&self, py: Python<'_>, deadline: Option<Instant>) -> PyResult<bool> {
        self.interrupted(py)?;
        Ok(deadline.is_some_and(|d| Instant::now() >= d))
    }

    /// Ctrl-C (any signal handler's exception) stops the pipeline and is raised. Checked after
    /// each wait, and by the binding once it holds an output (a signal that came in the same
    /// wait as the output would otherwise have its handler run right after the return: the
    /// output would be gone while the pipeline ran on).
    pub(crate) fn interrupted(&self, py: Python<'_>) -> PyResult<()> {
        if let Err(e) = py.check_signals() {
            // No grace for a step in progress, the interrupt comes first.
            self.close(py, Duration::ZERO);
            return Err(e);
        }
        Ok(())
    }

    /// A user's `dequeue` has waited since `since`: a forgotten `close_input()` must not be a
    /// silent hang. Said once, when nothing is in the pipeline and the input is open (never
    /// while the caller merely pauses, nor between the epochs of persistent workers).
    fn idle_word(&self, since: Instant) {
        if self.warn_idle.is_zero() || since.elapsed() < self.warn_idle {
            return;
        }
        let open = lock(&self.input).is_some();
        let mut st = lock(&self.state);
        if st.warned || !open || st.fed != st.user_done || !st.taken.is_empty() {
            return;
        }
        st.warned = true;
        eprintln!(
            "shmpipe: a Pipeline without a source has waited {:.1} s for an output (dequeue() \
             and iterating it yield the outputs of enqueue()) while nothing is enqueued or in \
             the pipeline: call enqueue(...), and close_input() once the input is complete \
             (dequeue() then returns None at the end, and iteration stops)",
            since.elapsed().as_secs_f64()
        );
    }

    /// Takes a message off the pump's queue into the counts; returns its output.
    fn take(&self, py: Python<'_>, msg: Msg) -> PyResult<Option<Item>> {
        let mut st = lock(&self.state);
        match msg {
            Msg::Item(it, done) => {
                st.user_done = done.min(st.fed);
                Ok(Some(it))
            }
            Msg::Progress(done) => {
                st.user_done = done.min(st.fed);
                Ok(None)
            }
            Msg::Failed => {
                let known = st.failure.as_ref().map(|e| e.clone_ref(py));
                drop(st);
                Err(match known {
                    Some(e) => e,
                    None => self.pump_failure(py),
                })
            }
        }
    }

    /// The pump's error, as the sticky failure.
    fn pump_failure(&self, py: Python<'_>) -> PyErr {
        let e = match &self.backend {
            Backend::Pump(p) => p.take_failure(),
            Backend::Inline(_) => None,
        };
        let e = match e {
            Some(e) => self.convert(py, e),
            None => match &lock(&self.state).failure {
                Some(e) => return e.clone_ref(py),
                None => PipelineError::new_err("the pipeline stopped"),
            },
        };
        self.fail(py, e)
    }

    /// A chunk of messages left the pump's queue: their inputs are no longer in the
    /// processes; they wait in `taken` for `dequeue` (one lock and one wake-up per chunk).
    fn stash(&self, msgs: Vec<Msg>) {
        let mut st = lock(&self.state);
        for msg in msgs {
            if let Some(d) = msg.done() {
                st.left = st.left.max(d).min(st.fed);
            }
            st.taken.push_back(msg);
        }
        drop(st);
        self.room.notify_all();
    }

    /// The next output; `Out::Reached` as soon as `user_done >= stop_at`.
    pub(crate) fn next_out(
        &self,
        py: Python<'_>,
        deadline: Option<Instant>,
        stop_at: Option<u64>,
    ) -> PyResult<Out> {
        let me = std::thread::current().id();
        let since = Instant::now();
        // With `workers=0` and an epoch to finish, the first wait is a poll: every input
        // enqueued so far is run before it gives up.
        let mut poll = stop_at.is_some();
        loop {
            let queued = {
                let mut st = lock(&self.state);
                st.consumer = Some(me);
                self.check_open(py, &st)?;
                match st.taken.pop_front() {
                    Some(m) => Some(m),
                    None if st.ended => return Ok(Out::End),
                    None if stop_at.is_some_and(|s| st.user_done >= s) => {
                        return Ok(Out::Reached);
                    }
                    None => None,
                }
            };
            if let Some(m) = queued {
                match self.take(py, m) {
                    Ok(Some(it)) => return Ok(Out::Item(it)),
                    Ok(None) => continue,
                    Err(e) => return Err(e),
                }
            }
            let wait = slice(deadline);
            match &self.backend {
                // `taken` is empty here: one wake-up takes what is queued, up to 9 chunks
                // (a bound, or a slow consumer would let the pump run ahead without limit).
                Backend::Pump(p) => match py.detach(|| p.recv_into(wait, 8, |m| self.stash(m))) {
                    Ok(()) => {}
                    Err(RecvTimeoutError::Timeout) => {
                        if self.nothing_came(py, since, deadline, stop_at)? {
                            return Ok(Out::Timeout);
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => lock(&self.state).ended = true,
                },
                Backend::Inline(m) => {
                    let wait = if poll { Duration::ZERO } else { wait };
                    poll = false;
                    if let Some(out) = self.next_inline(py, m, wait, since, deadline, stop_at)? {
                        return Ok(out);
                    }
                }
            }
        }
    }

    /// A wait of `next_out` in which nothing came: the idle word (unless an epoch is being
    /// finished, `stop_at`), then whether the whole wait is over (`deadline`).
    fn nothing_came(
        &self,
        py: Python<'_>,
        since: Instant,
        deadline: Option<Instant>,
        stop_at: Option<u64>,
    ) -> PyResult<bool> {
        if stop_at.is_none() {
            self.idle_word(since);
        }
        self.waited(py, deadline)
    }

    /// `workers=0`: one `wait` of `next_out` for the pipeline run in this thread; `None` when
    /// the wait is to go on.
    fn next_inline(
        &self,
        py: Python<'_>,
        m: &Mutex<Option<Pipeline>>,
        wait: Duration,
        since: Instant,
        deadline: Option<Instant>,
        stop_at: Option<u64>,
    ) -> PyResult<Option<Out>> {
        let (r, done) = py.detach(|| {
            let mut g = lock(m);
            match g.as_mut() {
                Some(p) => (p.dequeue_timeout(wait), p.inputs_done()),
                None => (Ok(None), 0),
            }
        });
        {
            let mut st = lock(&self.state);
            st.user_done = st.user_done.max(done).min(st.fed);
            st.left = st.user_done;
        }
        match r {
            Ok(Some(it)) => Ok(Some(Out::Item(it))),
            Ok(None) => {
                lock(&self.state).ended = true;
                Ok(None)
            }
            Err(Error::Timeout) => Ok(self
                .nothing_came(py, since, deadline, stop_at)?
                .then_some(Out::Timeout)),
            Err(e) => {
                let e = self.convert(py, e);
                if !e.is_instance_of::<PyException>(py) {
                    // Ctrl-C (or `sys.exit`) in a step: stopped, not failed.
                    self.close(py, Duration::ZERO);
                    return Err(e);
                }
                Err(self.fail(py, e))
            }
        }
    }

    /// `dequeue`: the next output, `None` at the end of stream; `TimeoutError` at `deadline`.
    pub(crate) fn dequeue(
        &self,
        py: Python<'_>,
        deadline: Option<Instant>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Item>> {
        match self.next_out(py, deadline, None)? {
            Out::Item(it) => Ok(Some(it)),
            Out::End | Out::Reached => Ok(None),
            Out::Timeout => Err(PyTimeoutError::new_err(format!(
                "no pipeline output within timeout={} s (the pipeline runs on: dequeue again)",
                timeout.unwrap_or(0.0)
            ))),
        }
    }

    /// `enqueue`: feeds one input, waiting for room (see the module doc) until `deadline`.
    pub(crate) fn enqueue(
        &self,
        py: Python<'_>,
        item: Item,
        deadline: Option<Instant>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let me = std::thread::current().id();
        loop {
            let consumer_is_me = {
                let mut st = lock(&self.state);
                self.check_open(py, &st)?;
                if lock(&self.input).is_none() {
                    return Err(PyValueError::new_err(
                        "enqueue after close_input(): the input of this pipeline is closed",
                    ));
                }
                if st.fed.saturating_sub(st.left) < self.max_in_flight {
                    st.fed += 1;
                    drop(st);
                    return self.send(py, item);
                }
                st.consumer.is_none_or(|c| c == me)
            };
            let timed_out = match &self.backend {
                Backend::Pump(p) if consumer_is_me => {
                    // Everything queued: these outputs wait for this thread's dequeue anyway.
                    let all = usize::MAX;
                    match py.detach(|| p.recv_into(slice(deadline), all, |m| self.stash(m))) {
                        Ok(()) => {
                            if p.failure.lock().is_ok_and(|f| f.is_some()) {
                                return Err(self.pump_failure(py));
                            }
                            false
                        }
                        Err(RecvTimeoutError::Timeout) => self.waited(py, deadline)?,
                        Err(RecvTimeoutError::Disconnected) => {
                            return Err(self.pump_failure(py));
                        }
                    }
                }
                Backend::Pump(p) => {
                    py.detach(|| {
                        let st = lock(&self.state);
                        drop(self.room.wait_timeout(st, slice(deadline)));
                    });
                    if p.failure.lock().is_ok_and(|f| f.is_some()) {
                        return Err(self.pump_failure(py));
                    }
                    self.waited(py, deadline)?
                }
                // Never full: `max_in_flight` is unbounded for `workers=0`.
                Backend::Inline(_) => false,
            };
            if timed_out {
                return Err(PyTimeoutError::new_err(format!(
                    "enqueue: max_in_flight={} inputs are in the pipeline and none left within \
                     timeout={} s (dequeue outputs, in this or another thread, to make room)",
                    self.max_in_flight,
                    timeout.unwrap_or(0.0)
                )));
            }
        }
    }

    /// Hands `item` to the pipeline's input (counted in `fed` already).
    fn send(&self, py: Python<'_>, item: Item) -> PyResult<()> {
        self.send_all(py, vec![item])
    }

    /// Hands `items` to the pipeline's input at once (counted in `fed` already).
    fn send_all(&self, py: Python<'_>, mut items: Vec<Item>) -> PyResult<()> {
        let r = match lock(&self.input).as_mut() {
            Some(input) if items.len() == 1 => input.send(items.pop().expect("one item")),
            Some(input) => input.send_batch(items),
            None => {
                return Err(PyValueError::new_err(
                    "the input of this pipeline is closed",
                ));
            }
        };
        let Err(e) = r else { return Ok(()) };
        // The input thread stopped because the pipeline failed: raise that failure (the pump
        // names the dead process within a second), not the lost connection.
        if let Backend::Pump(p) = &self.backend {
            let end = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < end && !p.failure.lock().is_ok_and(|f| f.is_some()) {
                py.detach(|| std::thread::sleep(Duration::from_millis(10)));
            }
            if p.failure.lock().is_ok_and(|f| f.is_some()) {
                return Err(self.pump_failure(py));
            }
        }
        let e = self.convert(py, e);
        Err(self.fail(py, e))
    }

    /// `close_input`: the stream ends after the outputs of everything enqueued.
    pub(crate) fn close_input(&self) {
        lock(&self.input).take();
    }

    /// Starts epoch `epoch` of the parent-fed source; what is left of the previous epoch is
    /// dropped first (its inputs are run and their outputs discarded).
    pub(crate) fn start_epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<()> {
        lock(&self.state).exhausted = true;
        loop {
            let fed = lock(&self.state).fed;
            match self.next_out(py, None, Some(fed))? {
                Out::Item(_) => {}
                Out::Reached | Out::End | Out::Timeout => break,
            }
        }
        let started = self.with_feed(py, |f| match f {
            Fed::Records(r) => {
                r.start_epoch(epoch);
                Ok(())
            }
            Fed::Memory(m) => m.start_epoch_at(py, epoch),
        })?;
        if let Err(e) = started {
            return Err(self.fail(py, e));
        }
        lock(&self.state).exhausted = false;
        Ok(())
    }

    /// Runs `f` on the parent-fed source, locked without blocking while holding the GIL.
    fn with_feed<T>(&self, py: Python<'_>, f: impl FnOnce(&mut Fed) -> T) -> PyResult<T> {
        let mut g = loop {
            match self.feed.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    py.detach(|| std::thread::sleep(Duration::from_millis(1)));
                }
            }
        };
        match g.as_mut() {
            Some(r) => Ok(f(r)),
            None => Err(PyRuntimeError::new_err(
                "this pipeline reads no source itself",
            )),
        }
    }

    /// Feeds records of the current epoch while there is room (in-memory sources in groups:
    /// one wake-up of the input thread per group), until outputs wait or [`TOP_UP_TIME`]
    /// passed: the caller then delivers them, so a slow source streams.
    fn top_up(&self, py: Python<'_>) -> PyResult<()> {
        let room = |st: &State| !st.exhausted && st.fed.saturating_sub(st.left) < self.feed_ahead;
        let start = Instant::now();
        while room(&lock(&self.state)) {
            if start.elapsed() >= TOP_UP_TIME || self.outputs_wait(py) {
                return Ok(());
            }
            let queued = lock(&self.input).as_ref().map_or(0, Input::queued_bytes);
            if queued >= FEED_BYTES {
                return Ok(());
            }
            let room_left = {
                let st = lock(&self.state);
                self.feed_ahead
                    .saturating_sub(st.fed.saturating_sub(st.left))
            };
            let max = GROUP_ITEMS
                .min(room_left.try_into().unwrap_or(usize::MAX))
                .max(1);
            let next = self.with_feed(py, |f| match f {
                Fed::Records(r) => match r.next() {
                    Some(Ok(item)) => Ok(Some(vec![item])),
                    Some(Err(e)) => Err(pipe_err(py, crate::pipeline_errors::source_err(e))),
                    None => Ok(None),
                },
                Fed::Memory(m) => m.next_group(py, max, GROUP_BYTES, Instant::now() + GROUP_TIME),
            })?;
            match next {
                Ok(Some(items)) if !items.is_empty() => {
                    lock(&self.state).fed += items.len() as u64;
                    self.send_all(py, items)?;
                }
                Ok(_) => lock(&self.state).exhausted = true,
                Err(e) => return Err(self.fail(py, e)),
            }
        }
        Ok(())
    }

    /// Whether outputs wait to be delivered (what the pump has queued is moved to `taken`).
    fn outputs_wait(&self, py: Python<'_>) -> bool {
        if let Backend::Pump(p) = &self.backend {
            // A failure or the end is left to `next_out`, which reports it.
            let _ = py.detach(|| p.recv_into(Duration::ZERO, 8, |m| self.stash(m)));
        }
        !lock(&self.state).taken.is_empty()
    }

    /// The next output of the current epoch of the parent-fed source; `None` at its end.
    pub(crate) fn next_in_epoch(&self, py: Python<'_>) -> PyResult<Option<Item>> {
        loop {
            // Ctrl-C between rounds: a round that makes no progress must not spin deaf.
            py.check_signals()?;
            self.top_up(py)?;
            let (fed, end) = {
                let st = lock(&self.state);
                (st.fed, st.exhausted && st.user_done >= st.fed)
            };
            if end {
                return Ok(None);
            }
            match self.next_out(py, None, Some(fed))? {
                Out::Item(it) => return Ok(Some(it)),
                Out::Reached | Out::Timeout => {}
                Out::End => return Ok(None),
            }
        }
    }

    /// The iteration of a pipeline with a source of its own (emitter processes): its outputs
    /// to the end.
    pub(crate) fn next(&self, py: Python<'_>) -> PyResult<Option<Item>> {
        match self.next_out(py, None, None)? {
            Out::Item(it) => Ok(Some(it)),
            Out::End | Out::Reached | Out::Timeout => Ok(None),
        }
    }
}
