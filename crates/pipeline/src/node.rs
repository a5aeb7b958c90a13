//! The wiring between processes: creating and opening connections, batching outputs, polling
//! inputs. The plan they share is in [`crate::plan`]. The roles are in [`crate::roles`].
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

use shm_ring::Transfer;

use crate::plan::TransportKind;
pub(crate) use crate::plan::*;
use crate::socket::{SockRx, SockTx};
use crate::wire::{Frame, Report, Rx, TransportError, Tx};

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
) -> Result<(Box<dyn Tx>, OwnedFd), crate::Error> {
    match plan.transport {
        TransportKind::Socket => SockTx::pair(socket_limit(plan), cancel)
            .map(|(t, fd)| (Box::new(t) as Box<dyn Tx>, fd))
            .map_err(|e| crate::Error::transport_from("cannot create a socket pair", e)),
        TransportKind::Shm => crate::shm::create_tx(plan, cancel),
    }
}

/// Opens the consumer end of a connection from the descriptor its producer handed over.
/// `lease`: keep zero-copy arrays of the received items in shared memory (the pipeline's
/// consumer does; workers copy them out).
pub(crate) fn open_rx(plan: &Plan, fd: OwnedFd, lease: bool) -> Result<Box<dyn Rx>, crate::Error> {
    match plan.transport {
        TransportKind::Socket => SockRx::from_fd(fd, socket_limit(plan))
            .map(|t| Box::new(t) as Box<dyn Rx>)
            .map_err(|e| crate::Error::transport(format!("cannot open a socket connection: {e}"))),
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
        if self.pending[i].is_empty() {
            return Ok(());
        }
        // Sent or failed, the batch is done with: a failed one is not sent again with the
        // error report that follows it.
        let r = self.txs[i].send(&self.pending[i]);
        self.pending[i].clear();
        self.bytes[i] = 0;
        self.zero_copy[i] = 0;
        r
    }
    pub(crate) fn flush_all(&mut self) -> Result<(), TransportError> {
        (0..self.txs.len()).try_for_each(|i| self.flush(i))
    }
    /// The node waits for input: flushes, and lets every connection give back memory held
    /// for large items that stopped coming.
    pub(crate) fn idle(&mut self) -> Result<(), TransportError> {
        self.flush_all()?;
        self.txs.iter_mut().for_each(|t| t.idle());
        Ok(())
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
