//! The plan every process of a pipeline shares, the wiring between processes, and the
//! emitter and worker roles.
//!
//! Nodes: emitters `0..E` (in enqueue mode the parent plays emitter 0), the workers of each
//! stage, and the consumer (the parent). There is one connection per
//! (producer, consumer) pair between consecutive layers; the producer creates it (an anonymous
//! channel) and the parent hands its descriptor to the consumer (see [`crate::handover`]).
//! Per-connection FIFO order plus one end marker per connection makes the end of stream
//! exact: a node sends its own end markers after it holds end markers from all its inputs and
//! has sent its last output.

use std::os::fd::{AsFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::handover::{Ctrl, CtrlError, Kind};
use crate::item::Item;
use crate::source::{
    JsonLines, ShuffleBuffer, Source, SourceContext, SourceError, derive_seed, epoch_order,
};
use crate::step::{Registry, Step, StepContext, WorkerInfo};
use crate::transport::{SockRx, SockTx, TransportKind};
use crate::wire::{FINISH_E, FINISH_K, Frame, Report, Rx, Stats, TransportError, Tx};
use crate::{Epochs, OnBadRecord, Transfer};

/// Exit code of a child that completed.
pub(crate) const EXIT_OK: i32 = 0;
/// Exit code of a child that reported a failure downstream (the consumer has the details).
pub(crate) const EXIT_REPORTED: i32 = 2;
/// Exit code of a child that could not set itself up (details on stderr).
pub(crate) const EXIT_SETUP: i32 = 3;
/// Exit code of a child that lost a peer (a consequence of another failure).
pub(crate) const EXIT_PEER_LOST: i32 = 4;
/// Exit code of a child whose parent died.
pub(crate) const EXIT_ORPHAN: i32 = 5;
/// Exit code of a child told to stop (a deliberate shutdown by the parent).
pub(crate) const EXIT_STOPPED: i32 = 6;

/// How long the start-up hand-over of channels may take, in the parent and in each child.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the records come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum SourceSpec {
    JsonLines(JsonLines),
    Named {
        name: String,
        args: serde_json::Value,
    },
}

/// One stage: the steps each of its workers runs, in order, and its worker count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StagePlan {
    pub steps: Vec<(String, serde_json::Value)>,
    pub workers: usize,
}

/// Shared-memory channel sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChannelPlan {
    pub slots: u32,
    pub slot_size: u32,
    pub blocks: u32,
    pub block_size: usize,
}

/// Everything a process of the pipeline needs to know.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Plan {
    pub id: String,
    pub parent: u32,
    pub emitters: usize,
    /// `None`: enqueue mode, the parent is emitter 0.
    pub source: Option<SourceSpec>,
    pub stages: Vec<StagePlan>,
    pub ordered: bool,
    pub batch_bytes: usize,
    pub transfer: Transfer,
    pub transport: TransportKind,
    pub channel: ChannelPlan,
    pub seed: u64,
    pub shuffle: bool,
    pub shuffle_buffer: usize,
    pub epochs: Epochs,
    pub rank: usize,
    pub world_size: usize,
    pub on_bad_record: OnBadRecord,
    /// The consumer keeps zero-copy arrays in shared memory.
    pub lease: bool,
}

/// What a child process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Role {
    Emitter(usize),
    Worker { stage: usize, worker: usize },
}

impl Role {
    pub(crate) fn describe(self) -> String {
        match self {
            Role::Emitter(e) => format!("emitter {e}"),
            Role::Worker { stage, worker } => format!("worker {worker} (stage {stage})"),
        }
    }
}

impl Role {
    /// How the child names itself on stderr: role and pid.
    pub(crate) fn log_name(self) -> String {
        let pid = std::process::id();
        match self {
            Role::Emitter(e) => format!("emitter {e} (pid {pid})"),
            Role::Worker { stage, worker } => {
                format!("worker {worker} of stage {stage} (pid {pid})")
            }
        }
    }
}

/// The env var payload of a child.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ChildSpec {
    pub plan: Plan,
    pub role: Role,
    /// The inherited descriptor of the child's end of its control socket.
    pub ctrl_fd: i32,
}

impl Plan {
    /// Number of producers feeding each worker of stage `stage`.
    pub(crate) fn upstream_count(&self, stage: usize) -> usize {
        if stage == 0 {
            self.emitters
        } else {
            self.stages[stage - 1].workers
        }
    }
    /// Number of connections of the pipeline.
    pub(crate) fn connection_count(&self) -> usize {
        let mut n = 0;
        for s in 0..self.stages.len() {
            n += self.stages[s].workers * self.upstream_count(s);
        }
        n + self.stages.last().map_or(0, |s| s.workers)
    }
    /// Number of connections a role creates (as the producer), in downstream order.
    pub(crate) fn outputs_of(&self, role: Role) -> usize {
        match role {
            Role::Emitter(_) => self.stages[0].workers,
            Role::Worker { stage, .. } if stage + 1 == self.stages.len() => 1,
            Role::Worker { stage, .. } => self.stages[stage + 1].workers,
        }
    }
    /// Number of connections a role consumes, in upstream order.
    pub(crate) fn inputs_of(&self, role: Role) -> usize {
        match role {
            Role::Emitter(_) => 0,
            Role::Worker { stage, .. } => self.upstream_count(stage),
        }
    }
    /// Which worker of stage `stage + 1` gets the outputs of record `(e, k)` after `stage`.
    pub(crate) fn route(&self, stage: usize, e: u32, k: u64) -> usize {
        if stage + 1 == self.stages.len() {
            return 0;
        }
        let n = self.stages[stage + 1].workers as u64;
        (derive_seed(&[stage as u64, u64::from(e), k]) % n) as usize
    }
}

/// The largest encoded batch a socket connection carries: what one shared-memory message
/// could hold (its ring plus its whole pool).
fn socket_limit(plan: &Plan) -> usize {
    let cfg = crate::shm::channel_config(plan);
    (cfg.slots as usize)
        .saturating_mul(cfg.slot_size as usize)
        .saturating_add((cfg.blocks as usize).saturating_mul(cfg.block_size))
}

/// Creates the producer end of a new connection; returns it and the descriptor to hand to the
/// consumer. `cancel`: a flag that makes a blocked send give up (the parent's input thread).
pub(crate) fn create_tx(
    plan: &Plan,
    cancel: Option<Arc<AtomicBool>>,
) -> Result<(Box<dyn Tx>, OwnedFd), String> {
    match plan.transport {
        TransportKind::Socket => SockTx::pair(socket_limit(plan))
            .map(|(t, fd)| (Box::new(t) as Box<dyn Tx>, fd))
            .map_err(|e| format!("cannot create a socket pair: {e}")),
        TransportKind::Shm => crate::shm::create_tx(plan, cancel),
    }
}

/// Opens the consumer end of a connection from the descriptor its producer handed over.
/// `lease`: keep zero-copy arrays of the received items in shared memory (the pipeline's
/// consumer does; workers copy them out).
pub(crate) fn open_rx(plan: &Plan, fd: OwnedFd, lease: bool) -> Result<Box<dyn Rx>, String> {
    match plan.transport {
        TransportKind::Socket => SockRx::from_fd(fd, socket_limit(plan))
            .map(|t| Box::new(t) as Box<dyn Rx>)
            .map_err(|e| format!("cannot open a socket connection: {e}")),
        TransportKind::Shm => {
            let cap = (lease && plan.transfer != Transfer::Copy)
                .then_some(lease_cap(plan.channel.blocks));
            crate::shm::open_rx(fd, cap)
        }
    }
}

/// Pool blocks per channel: a message takes at most `zero_copy_limit` blocks for its arrays
/// plus one for a large body; the consumer's items pin at most `lease_cap`. Together they stay
/// below `blocks`, so a producer never waits for blocks that only its consumer's user can free.
fn zero_copy_limit(blocks: u32) -> usize {
    (blocks as usize / 2).saturating_sub(1).max(1)
}

/// See [`zero_copy_limit`].
fn lease_cap(blocks: u32) -> usize {
    (blocks as usize).saturating_sub(2) / 2
}

/// Rough encoded size of a frame, for byte-sized batches.
fn frame_size(f: &Frame) -> usize {
    match f {
        Frame::Item { item, .. } => 16 + item.wire_size(),
        _ => 32,
    }
}

/// The outgoing connections of a node, each with a pending batch.
pub(crate) struct Outputs {
    pub txs: Vec<Box<dyn Tx>>,
    pending: Vec<Vec<Frame>>,
    bytes: Vec<usize>,
    /// Arrays in each pending batch that will travel zero-copy (one pool block each).
    zero_copy: Vec<usize>,
    batch_bytes: usize,
    transfer: Transfer,
    /// A batch is sent once it holds this many zero-copy arrays, so that one message never
    /// needs more pool blocks than the channel has.
    zero_copy_limit: usize,
}

impl Outputs {
    pub(crate) fn new(txs: Vec<Box<dyn Tx>>, plan: &Plan) -> Outputs {
        let n = txs.len();
        Outputs {
            txs,
            pending: vec![Vec::new(); n],
            bytes: vec![0; n],
            zero_copy: vec![0; n],
            batch_bytes: plan.batch_bytes.max(1),
            transfer: plan.transfer,
            zero_copy_limit: zero_copy_limit(plan.channel.blocks),
        }
    }
    pub(crate) fn len(&self) -> usize {
        self.txs.len()
    }
    pub(crate) fn push(&mut self, i: usize, f: Frame) -> Result<(), TransportError> {
        self.bytes[i] += frame_size(&f);
        if let Frame::Item { item, .. } = &f {
            self.zero_copy[i] += item
                .arrays()
                .filter(|(_, a)| self.transfer.zero_copy(a.nbytes()))
                .count();
        }
        self.pending[i].push(f);
        if self.bytes[i] >= self.batch_bytes || self.zero_copy[i] >= self.zero_copy_limit {
            self.flush(i)
        } else {
            Ok(())
        }
    }
    pub(crate) fn flush(&mut self, i: usize) -> Result<(), TransportError> {
        if !self.pending[i].is_empty() {
            self.txs[i].send(&self.pending[i])?;
            self.pending[i].clear();
            self.bytes[i] = 0;
            self.zero_copy[i] = 0;
        }
        Ok(())
    }
    pub(crate) fn flush_all(&mut self) -> Result<(), TransportError> {
        (0..self.txs.len()).try_for_each(|i| self.flush(i))
    }
    /// Flushes everything; then the outputs may be closed (every consumer attached before
    /// the pipeline started, so nothing sent is lost).
    pub(crate) fn finish(&mut self) -> Result<(), TransportError> {
        self.flush_all()
    }
    pub(crate) fn broadcast(&mut self, f: &Frame) -> Result<(), TransportError> {
        (0..self.txs.len()).try_for_each(|i| self.push(i, f.clone()))
    }
    /// Sends an error report on output 0 after what is pending there.
    pub(crate) fn report(&mut self, r: Report) {
        if !self.txs.is_empty() {
            let _ = self.push(0, Frame::Error(r)).and_then(|()| self.flush(0));
        }
    }
    pub(crate) fn transfer_counts(&self) -> (u64, u64) {
        self.txs
            .iter()
            .map(|t| t.transfer_counts())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }
}

/// Why [`Inputs::next`] stopped.
#[derive(Debug)]
pub(crate) enum NextError<E> {
    /// Input `i` failed.
    Input(usize, TransportError),
    /// The idle callback failed.
    Idle(E),
}

/// The incoming connections of a node, polled in rotation.
pub(crate) struct Inputs {
    pub rxs: Vec<Box<dyn Rx>>,
    /// Input `i` delivered its end marker.
    pub done: Vec<bool>,
    next: usize,
    /// Calls of [`Inputs::next`] that found a batch without waiting.
    pub ready_polls: u64,
    /// Calls of [`Inputs::next`] that had to wait.
    pub empty_polls: u64,
    /// The first input that failed, and when. The others are still drained for a while: an
    /// error report explaining the failure may be on its way through them.
    lost: Option<(usize, TransportError, Instant)>,
}

/// How long a node keeps draining its other inputs after one failed.
const LOST_GRACE: Duration = Duration::from_millis(500);

impl Inputs {
    pub(crate) fn new(rxs: Vec<Box<dyn Rx>>) -> Inputs {
        let n = rxs.len();
        Inputs {
            rxs,
            done: vec![false; n],
            next: 0,
            ready_polls: 0,
            empty_polls: 0,
            lost: None,
        }
    }

    /// Records that input `i` failed; it is not polled again.
    fn lose(&mut self, i: usize, e: TransportError) {
        self.done[i] = true;
        self.lost.get_or_insert((i, e, Instant::now()));
    }

    pub(crate) fn all_done(&self) -> bool {
        self.done.iter().all(|&d| d)
    }

    fn take(&mut self, i: usize, frames: Vec<Frame>) -> Option<(usize, Vec<Frame>)> {
        if frames.iter().any(|f| matches!(f, Frame::Eos(_))) {
            self.done[i] = true;
        }
        self.next = (i + 1) % self.rxs.len();
        Some((i, frames))
    }

    /// The next batch from any input: spins briefly, then calls `idle` and sleeps on one
    /// input at a time (1 ms each), calling `idle` after every sleep. `Ok(None)`: every input
    /// has delivered its end marker.
    pub(crate) fn next<E>(
        &mut self,
        idle: &mut dyn FnMut() -> Result<(), E>,
    ) -> Result<Option<(usize, Vec<Frame>)>, NextError<E>> {
        let n = self.rxs.len();
        let mut round = 0u32;
        loop {
            if let Some((_, _, at)) = &self.lost
                && (self.all_done() || at.elapsed() > LOST_GRACE)
            {
                let (i, e, _) = self.lost.take().expect("checked");
                return Err(NextError::Input(i, e));
            }
            if self.all_done() {
                return Ok(None);
            }
            for j in 0..n {
                let i = (self.next + j) % n;
                if self.done[i] {
                    continue;
                }
                match self.rxs[i].recv(None) {
                    Ok(Some(frames)) => {
                        if round == 0 {
                            self.ready_polls += 1;
                        } else {
                            self.empty_polls += 1;
                        }
                        return Ok(self.take(i, frames));
                    }
                    Ok(None) => {}
                    Err(e) => self.lose(i, e),
                }
            }
            round += 1;
            if round < 64 {
                std::hint::spin_loop();
            } else if round < 96 {
                std::thread::yield_now();
            } else {
                idle().map_err(NextError::Idle)?;
                let i = (0..n).map(|j| (self.next + j) % n).find(|&i| !self.done[i]);
                let Some(i) = i else { continue };
                self.next = (i + 1) % n;
                match self.rxs[i].recv(Some(Duration::from_millis(1))) {
                    Ok(Some(frames)) => {
                        self.empty_polls += 1;
                        return Ok(self.take(i, frames));
                    }
                    Ok(None) => {}
                    Err(e) => self.lose(i, e),
                }
            }
        }
    }
}

/// The child's control socket and how it names itself (set once in [`run_child`]).
static CHILD: OnceLock<(Arc<Ctrl>, String)> = OnceLock::new();

/// Whether the parent is shutting the pipeline down on purpose (or is gone): then a lost peer
/// is no news and the child exits quietly.
fn stopping() -> bool {
    CHILD.get().is_some_and(|(c, _)| c.stop_or_eof_pending())
}

/// Logs a real problem of this child on stderr, named by role and pid.
fn log(msg: &str) {
    let me = CHILD.get().map_or("child", |(_, m)| m.as_str());
    eprintln!("shmpipe {me}: {msg}");
}

/// The start-up hand-over of a child: creates its outputs and sends their descriptors, gets
/// its inputs, attaches, and waits for the parent's go. `Err(code)`: exit with it.
fn hand_over(plan: &Plan, role: Role, ctrl: &Ctrl) -> Result<(Outputs, Vec<Box<dyn Rx>>), i32> {
    let setup = |m: String| {
        log(&m);
        EXIT_SETUP
    };
    let quiet = |e: CtrlError| match e {
        // The parent is gone or gave up on us: nothing to say.
        CtrlError::Eof => EXIT_ORPHAN,
        e => setup(format!("start-up: {e}")),
    };
    let mut txs = Vec::new();
    let mut fds = Vec::new();
    for _ in 0..plan.outputs_of(role) {
        let (tx, fd) = create_tx(plan, None).map_err(setup)?;
        txs.push(tx);
        fds.push(fd);
    }
    let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
    ctrl.send(Kind::Outputs, &borrowed)
        .map_err(|e| setup(format!("cannot hand over its channels: {e}")))?;
    drop(borrowed);
    drop(fds);
    let (kind, fds) = ctrl.recv(Some(START_TIMEOUT)).map_err(quiet)?;
    match kind {
        Kind::Inputs if fds.len() == plan.inputs_of(role) => {}
        Kind::Stop => return Err(EXIT_STOPPED),
        k => {
            return Err(setup(format!(
                "expected {} input descriptors, got {k:?} with {}",
                plan.inputs_of(role),
                fds.len()
            )));
        }
    }
    let rxs = fds
        .into_iter()
        .map(|fd| open_rx(plan, fd, true))
        .collect::<Result<Vec<_>, _>>()
        .map_err(setup)?;
    ctrl.send(Kind::Attached, &[])
        .map_err(|e| setup(format!("control socket: {e}")))?;
    match ctrl.recv(Some(START_TIMEOUT)).map_err(quiet)? {
        (Kind::Go, _) => Ok((Outputs::new(txs, plan), rxs)),
        (Kind::Stop, _) => Err(EXIT_STOPPED),
        (k, _) => Err(setup(format!("expected go, got {k:?}"))),
    }
}

/// The parent watchdog: exits the child as soon as its control socket says `STOP` (quietly)
/// or reaches its end (the parent is gone, even SIGKILLed).
fn start_watchdog(ctrl: Arc<Ctrl>, parent: u32) {
    std::thread::spawn(move || {
        loop {
            if matches!(ctrl.wait_readable(None), Ok(true)) {
                if ctrl.stop_or_eof_pending() {
                    // Both are deliberate or final; the parent wants no word from us.
                    let ppid = rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32);
                    let orphan = ppid != Some(parent);
                    std::process::exit(if orphan { EXIT_ORPHAN } else { EXIT_STOPPED });
                }
                // Anything else after `GO` is unexpected: take it off and go on.
                let _ = ctrl.recv(Some(Duration::ZERO));
            } else {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    });
}

/// Runs a child role and returns its exit code.
pub(crate) fn run_child(reg: &Registry, spec: &ChildSpec, ctrl: Ctrl) -> i32 {
    let plan = &spec.plan;
    let ctrl = Arc::new(ctrl);
    let _ = CHILD.set((Arc::clone(&ctrl), spec.role.log_name()));
    let (outs, ins) = match hand_over(plan, spec.role, &ctrl) {
        Ok(v) => v,
        Err(code) => return code,
    };
    start_watchdog(ctrl, plan.parent);
    match spec.role {
        Role::Emitter(e) => run_emitter(reg, plan, e, outs),
        Role::Worker { stage, worker } => {
            run_worker(reg, plan, stage, worker, Inputs::new(ins), outs)
        }
    }
}

fn run_emitter(reg: &Registry, plan: &Plan, e: usize, mut out: Outputs) -> i32 {
    let parts = plan.world_size * plan.emitters;
    let part = plan.rank * plan.emitters + e;
    let source: Result<Box<dyn Source>, SourceError> = match &plan.source {
        Some(SourceSpec::JsonLines(j)) => {
            j.open(part, parts).map(|p| Box::new(p) as Box<dyn Source>)
        }
        Some(SourceSpec::Named { name, args }) => {
            reg.build_source(name, &SourceContext { args, part, parts })
        }
        None => Err(SourceError::Other(
            "emitter started without a source".into(),
        )),
    };
    let mut source = match source {
        Ok(s) => s,
        Err(error) => {
            out.report(Report::Source { emitter: e, error });
            return EXIT_REPORTED;
        }
    };
    let workers = out.len() as u64;
    let mut k = 0u64;
    let mut stats = Stats::default();
    let send = |out: &mut Outputs, item: Item, k: &mut u64| {
        let r = out.push(
            (*k % workers) as usize,
            Frame::Item {
                e: e as u32,
                k: *k,
                last: true,
                item,
            },
        );
        *k += 1;
        r
    };
    let len = source.len();
    let mut epoch = 0u64;
    let result: Result<(), i32> = (|| {
        loop {
            match plan.epochs {
                Epochs::Finite(n) if epoch >= n => return Ok(()),
                Epochs::Cycle if len == 0 => return Ok(()),
                _ => {}
            }
            let base = [plan.seed, epoch, plan.rank as u64, e as u64];
            let order = epoch_order(len, plan.shuffle.then(|| derive_seed(&base)));
            let mut buf = (plan.shuffle && plan.shuffle_buffer > 1).then(|| {
                ShuffleBuffer::new(plan.shuffle_buffer, derive_seed(&[derive_seed(&base), 1]))
            });
            for idx in order {
                let item = match source.read(idx) {
                    Ok(item) => item,
                    Err(SourceError::BadRecord { .. })
                        if plan.on_bad_record == OnBadRecord::Skip =>
                    {
                        stats.skipped += 1;
                        continue;
                    }
                    Err(error) => {
                        out.report(Report::Source { emitter: e, error });
                        return Err(EXIT_REPORTED);
                    }
                };
                let item = match buf.as_mut() {
                    Some(b) => b.push(item),
                    None => Some(item),
                };
                if let Some(item) = item {
                    send(&mut out, item, &mut k).map_err(|e| lost("sending", &e))?;
                }
            }
            for item in buf.map(|mut b| b.drain()).unwrap_or_default() {
                send(&mut out, item, &mut k).map_err(|e| lost("sending", &e))?;
            }
            epoch += 1;
        }
    })();
    if let Err(code) = result {
        return code;
    }
    (stats.zero_copy, stats.copied) = out.transfer_counts();
    let end = out
        .broadcast(&Frame::EmitterDone { e: e as u32, n: k })
        .and_then(|()| out.push(0, Frame::Eos(stats)))
        .and_then(|()| (1..out.len()).try_for_each(|i| out.push(i, Frame::Eos(Stats::default()))))
        .and_then(|()| out.finish());
    match end {
        Err(e) => lost("ending", &e),
        Ok(()) => EXIT_OK,
    }
}

/// Logs why a child lost a peer (unless the pipeline is being shut down on purpose) and
/// returns the exit code for it.
fn lost(what: &str, e: &TransportError) -> i32 {
    if stopping() {
        return EXIT_STOPPED;
    }
    log(&format!("{what}: {e}"));
    EXIT_PEER_LOST
}

/// Keeps error messages well under the transport's metadata limit (64 KiB).
fn clip(mut s: String) -> String {
    const MAX: usize = 8192;
    if s.len() > MAX {
        let mut cut = MAX;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_owned()
    }
}

/// The step instances of one worker, run in sequence on every input.
struct Chain {
    steps: Vec<(String, Box<dyn Step>, u64, u64)>,
    stage: usize,
    worker: usize,
}

impl Chain {
    /// Runs all steps on `item`; outputs go to `out`.
    fn run(
        &mut self,
        item: Item,
        input: &dyn Fn() -> String,
        out: &mut Vec<Item>,
    ) -> Result<(), Report> {
        self.run_from(0, vec![item], input, out)
    }

    /// Runs steps `start..` on the items `cur`; outputs go to `out`.
    fn run_from(
        &mut self,
        start: usize,
        mut cur: Vec<Item>,
        input: &dyn Fn() -> String,
        out: &mut Vec<Item>,
    ) -> Result<(), Report> {
        let (stage, worker) = (self.stage, self.worker);
        for (name, step, calls, ns) in self.steps.iter_mut().skip(start) {
            let mut next = Vec::new();
            for it in cur.drain(..) {
                let desc = it.describe();
                let t0 = Instant::now();
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| step.process(it, &mut next)));
                *ns += t0.elapsed().as_nanos() as u64;
                *calls += 1;
                let message = match r {
                    Ok(Ok(())) => continue,
                    Ok(Err(e)) => clip(e.to_string()),
                    Err(p) => clip(panic_message(&*p)),
                };
                let mut input = input();
                if !desc.is_empty() {
                    input = format!("{input} ({desc})");
                }
                return Err(Report::Step {
                    step: name.clone(),
                    stage,
                    worker,
                    input,
                    message,
                });
            }
            cur = next;
        }
        out.append(&mut cur);
        Ok(())
    }

    /// End of stream: finishes the steps in order, passing the outputs of step `i`'s
    /// `finish` through steps `i + 1..` before finishing step `i + 1`; outputs go to `out`.
    fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), Report> {
        let input = || "end of stream".to_owned();
        for i in 0..self.steps.len() {
            let (name, step, _, ns) = &mut self.steps[i];
            let mut made = Vec::new();
            let t0 = Instant::now();
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| step.finish(&mut made)));
            *ns += t0.elapsed().as_nanos() as u64;
            let message = match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(clip(e.to_string())),
                Err(p) => Some(clip(panic_message(&*p))),
            };
            if let Some(message) = message {
                return Err(Report::Step {
                    step: name.clone(),
                    stage: self.stage,
                    worker: self.worker,
                    input: input(),
                    message,
                });
            }
            self.run_from(i + 1, made, &input, out)?;
        }
        Ok(())
    }
}

fn run_worker(
    reg: &Registry,
    plan: &Plan,
    stage: usize,
    w: usize,
    mut ins: Inputs,
    mut out: Outputs,
) -> i32 {
    let info = WorkerInfo {
        stage,
        worker: w,
        workers: plan.stages[stage].workers,
        rank: plan.rank,
        world_size: plan.world_size,
        seed: derive_seed(&[plan.seed, plan.rank as u64, stage as u64, w as u64]),
    };
    let mut chain = Chain {
        steps: Vec::new(),
        stage,
        worker: w,
    };
    for (name, args) in &plan.stages[stage].steps {
        match reg.build_step(name, &StepContext { args, worker: info }) {
            Ok(s) => chain.steps.push((name.clone(), s, 0, 0)),
            Err(e) => {
                out.report(Report::Step {
                    step: name.clone(),
                    stage,
                    worker: w,
                    input: "(none: building the step)".into(),
                    message: e.to_string(),
                });
                return EXIT_REPORTED;
            }
        }
    }
    let ordered = plan.ordered;
    let mut stats = Stats::default();
    let mut outputs = Vec::new();
    loop {
        let next = ins.next(&mut || out.flush_all());
        let frames = match next {
            Ok(Some((_, frames))) => frames,
            Ok(None) => break,
            Err(NextError::Input(i, e)) => return lost(&format!("input {i}"), &e),
            Err(NextError::Idle(e)) => return lost("output", &e),
        };
        for f in frames {
            let sent = match f {
                Frame::Item { e, k, last, item } => {
                    let input = || {
                        if (e, k) == (FINISH_E, FINISH_K) {
                            format!(
                                "end of stream (finish output of stage {})",
                                stage.saturating_sub(1)
                            )
                        } else {
                            format!("emitter {e}, record {k}")
                        }
                    };
                    if let Err(r) = chain.run(item, &input, &mut outputs) {
                        out.report(r);
                        return EXIT_REPORTED;
                    }
                    let dest = plan.route(stage, e, k);
                    let n = outputs.len();
                    let mut r = Ok(());
                    for (i, item) in outputs.drain(..).enumerate() {
                        let last = ordered && last && i + 1 == n;
                        r = r.and_then(|()| out.push(dest, Frame::Item { e, k, last, item }));
                    }
                    if ordered && last && n == 0 {
                        r = r.and_then(|()| out.push(dest, Frame::GroupEnd { e, k }));
                    }
                    r
                }
                Frame::GroupEnd { e, k } => {
                    out.push(plan.route(stage, e, k), Frame::GroupEnd { e, k })
                }
                f @ Frame::EmitterDone { .. } => out.broadcast(&f),
                Frame::Eos(s) => {
                    stats.merge(&s);
                    Ok(())
                }
                Frame::Error(r) => {
                    out.report(r);
                    return EXIT_REPORTED;
                }
            };
            if let Err(e) = sent {
                return lost("output", &e);
            }
        }
    }
    if let Err(r) = chain.finish(&mut outputs) {
        out.report(r);
        return EXIT_REPORTED;
    }
    let dest = plan.route(stage, FINISH_E, FINISH_K);
    let (e, k) = (FINISH_E, FINISH_K);
    let sent = outputs.drain(..).try_for_each(|item| {
        out.push(
            dest,
            Frame::Item {
                e,
                k,
                last: false,
                item,
            },
        )
    });
    if let Err(e) = sent {
        return lost("output", &e);
    }
    let mut own = Stats {
        steps: chain
            .steps
            .iter()
            .map(|(n, _, c, ns)| (n.clone(), *c, *ns))
            .collect(),
        ..Stats::default()
    };
    (own.zero_copy, own.copied) = out.transfer_counts();
    stats.merge(&own);
    let end = out
        .push(0, Frame::Eos(stats))
        .and_then(|()| (1..out.len()).try_for_each(|i| out.push(i, Frame::Eos(Stats::default()))))
        .and_then(|()| out.finish());
    match end {
        Err(e) => lost("ending", &e),
        Ok(()) => EXIT_OK,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_clipped_on_a_char_boundary() {
        let long = "é".repeat(10_000);
        let c = clip(long.clone());
        assert!(c.len() <= 8192 + 3 && c.ends_with("..."));
        assert!(long.starts_with(c.trim_end_matches("...")));
        assert_eq!(clip("short".into()), "short");
    }

    #[test]
    fn block_budget_leaves_room_for_one_message() {
        for blocks in 2..64u32 {
            // Pinned by the consumer + one message (arrays + a body block) fits the pool.
            assert!(
                lease_cap(blocks) + zero_copy_limit(blocks) < blocks as usize,
                "{blocks}"
            );
            assert!(zero_copy_limit(blocks) >= 1);
        }
    }
}
