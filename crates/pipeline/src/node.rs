//! The plan every process of a pipeline shares and the wiring between processes: creating and
//! opening connections, batching outputs, polling inputs. The roles are in [`crate::roles`].
//!
//! Nodes: emitters `0..E` (in enqueue mode the parent plays emitter 0), the workers of each
//! stage, and the consumer (the parent). There is one connection per
//! (producer, consumer) pair between consecutive layers; the producer creates it (an anonymous
//! channel) and the parent hands its descriptor to the consumer (see [`crate::handover`]).
//! Per-connection FIFO order plus one end marker per connection makes the end of stream
//! exact: a node sends its own end markers after it holds end markers from all its inputs and
//! has sent its last output.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::source::{JsonLines, derive_seed};
use crate::transport::{SockRx, SockTx, TransportKind};
use crate::wire::{Frame, Report, Rx, TransportError, Tx};
use crate::{Epochs, OnBadRecord};
use shm_ring::Transfer;

/// `Transfer` (shm-ring's) in the plan's JSON.
mod transfer_serde {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    enum T {
        Copy,
        ZeroCopy,
        Adaptive { threshold: usize },
    }

    pub(super) fn serialize<S: Serializer>(t: &super::Transfer, s: S) -> Result<S::Ok, S::Error> {
        match *t {
            super::Transfer::Copy => T::Copy,
            super::Transfer::ZeroCopy => T::ZeroCopy,
            super::Transfer::Adaptive { threshold } => T::Adaptive { threshold },
        }
        .serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<super::Transfer, D::Error> {
        Ok(match T::deserialize(d)? {
            T::Copy => super::Transfer::Copy,
            T::ZeroCopy => super::Transfer::ZeroCopy,
            T::Adaptive { threshold } => super::Transfer::Adaptive { threshold },
        })
    }
}

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

/// Shared-memory channel geometry of a pipeline ([`PipelineBuilder::channel`]).
///
/// [`PipelineBuilder::channel`]: crate::PipelineBuilder::channel
///
/// ```
/// use shmpipe::ChannelGeometry;
/// let g = ChannelGeometry { blocks: 4, block_size: 8 << 20, ..ChannelGeometry::default() };
/// assert_eq!(g.slots, 0); // sized from the batch size
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelGeometry {
    /// Descriptor ring slots of 64 bytes (a power of two); 0 (the default): room for eight
    /// batches, so a batch of up to twice `batch_bytes` travels inline in the ring (shm-ring
    /// keeps a message inline up to a quarter of the ring) and small items never take a
    /// pool block.
    pub slots: u32,
    /// Payload pool blocks: one per zero-copy array or per batch too large for the ring.
    pub blocks: u32,
    /// Bytes per pool block (a zero-copy array must fit one).
    pub block_size: usize,
}

impl Default for ChannelGeometry {
    fn default() -> Self {
        ChannelGeometry {
            slots: 0,
            blocks: 8,
            block_size: 1 << 20,
        }
    }
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
    #[serde(with = "transfer_serde")]
    pub transfer: Transfer,
    pub transport: TransportKind,
    pub channel: ChannelGeometry,
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
    /// Processes that move data: emitters, every worker of every stage, and the consumer.
    pub(crate) fn process_count(&self) -> usize {
        self.emitters + self.stages.iter().map(|s| s.workers).sum::<usize>() + 1
    }
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
        // Rough encoded size and pool blocks of the frame: one pass over its fields, no copy.
        let (size, zero_copy) = match &f {
            Frame::Item { item, .. } => item.wire_size(&self.transfer),
            _ => (0, 0),
        };
        self.bytes[i] += 16 + size;
        self.zero_copy[i] += zero_copy;
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

#[cfg(test)]
mod tests {
    use super::*;

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
