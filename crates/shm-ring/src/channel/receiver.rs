//! The consumer end of a channel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::errors::{RecvError, RecvTimeoutError, TryRecvError};
use super::{ChannelHeader, Message, ShmRing, WaitConfig, channel_header};
use crate::error::Error;
use crate::message::{self, MessageView, PoolRef};
use crate::ring::bytes::ShmBytes;
use crate::ring::{self, Storage};
use crate::sync::Ordering;
use crate::sys::{self, PeerProcess};

/// The consumer end of a channel of payload `P` (see [`Sender`](crate::Sender)), opened by
/// name or from a descriptor. `Send`, not `Sync`.
pub struct Receiver<P = Message> {
    shared: Arc<RxShared>,
    pub(super) desc: ring::Consumer<ShmRing>,
    producer: PeerProcess,
    pub(super) wait: WaitConfig,
    name: String,
    /// Private copy of the message being read in place (reused).
    scratch: Vec<u64>,
    /// The segment's (device, inode), registered in `OWN_RECEIVERS` while we live.
    ident: (u64, u64),
    /// Slots read (skipped) in this receive call, not yet handed back; see `release_read`.
    pub(super) unreleased: u32,
    /// Where the channel was found by name (`None` from a descriptor): once the producer is
    /// dead, its socket is removed if stale (`remove_stale_name`).
    served: Option<crate::rendezvous::Served>,
    /// The stale socket was looked at already.
    stale_removed: std::sync::atomic::AtomicBool,
    /// A channel of values: every this many values read (a quarter of the ring) the hand-back
    /// is a full `release_read` (fence + waiting-flag check), so a producer that raced into
    /// sleep is woken promptly; the values between go back with one store each.
    pub(super) release_every: u32,
    /// The process that made this receiver (a copy of `shared.owner`, for the values' fast
    /// path).
    pub(super) owner_copy: crate::fork::Owner,
    _payload: std::marker::PhantomData<fn() -> P>,
}

impl<P> std::fmt::Debug for Receiver<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("name", &self.name)
            .field("payload", &std::any::type_name::<P>())
            .field("producer", &self.producer)
            .finish_non_exhaustive()
    }
}

mod open;
mod record_header;
mod records;
mod returns;

use record_header::{Rec, n_of};
pub(super) use returns::RxShared;

impl<P> Receiver<P> {
    /// Sets how blocked calls wait.
    pub fn set_wait(&mut self, wait: WaitConfig) {
        self.wait = wait;
    }

    /// The channel name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Pid of the producer process.
    pub fn producer_pid(&self) -> u32 {
        self.producer.pid()
    }

    /// The producer's pool as read (and validated) at open: (blocks, bytes per block).
    pub fn pool_geometry(&self) -> (u32, usize) {
        (self.shared.pool.blocks, self.shared.pool.block_size)
    }

    pub(super) fn header(&self) -> &ChannelHeader {
        channel_header(&self.shared.seg)
    }

    /// `Err(Forked)` in a forked child, `Err(Corrupt)` once the completion ring broke.
    pub(super) fn check_usable(&self) -> Result<(), Error> {
        self.shared.check()
    }

    /// Removes the dead producer's socket if nobody listens on it any more (once).
    fn remove_stale_name(&self) {
        if let Some(s) = &self.served
            && !self
                .stale_removed
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            s.remove_if_stale();
        }
    }

    /// `Err(PeerDied)` once the producer process is gone.
    pub(super) fn producer_alive(&self) -> Result<(), Error> {
        if self.producer.is_dead() {
            self.remove_stale_name();
            Err(Error::PeerDied {
                pid: self.producer.pid(),
                reclaimed: 0,
            })
        } else {
            Ok(())
        }
    }

    fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Message, Error> {
        self.shared.check()?;
        let rec = self.next_rec(deadline)?;
        let pos = self.desc.position();
        let n_slots = match rec {
            Rec::Inline { n_slots, .. } => n_slots,
            _ => 1,
        };
        // Copy the body out of shared memory: validation then works on private bytes that no
        // other process can change, and the slots (or body block) go back at once. (Not
        // zero-filled first: a pass over every received body, ~4k instructions per 16 KiB
        // batch; only the padding of the last word is.)
        let copied = Self::body_bytes(&self.desc, &self.shared.seg, &rec)
            .map(|src| (src.len(), src.to_words()));
        self.finish(&rec);
        let (body_len, body) = match copied {
            Ok(c) => c,
            Err(e) => {
                self.shared.dropped(pos, n_slots);
                return Err(e);
            }
        };
        let mut blocks: SmallVec<[u32; 4]> = SmallVec::new();
        let mut large_bytes = 0usize;
        let first_extent = self.shared.pool.blocks;
        let parsed = {
            let bytes = &bytemuck::cast_slice::<u64, u8>(&body)[..body_len];
            MessageView::parse(bytes, self.shared.pool()).and_then(|v| {
                // An owned message is validated whole, once, on private bytes.
                v.validate_all(|b, len| {
                    if !blocks.contains(&b) {
                        blocks.push(b);
                        if b >= first_extent {
                            large_bytes = large_bytes.saturating_add(len);
                        }
                    }
                })
                .map(|_| (v.tag(), v.len()))
            })
        };
        match parsed {
            Ok(_) => Ok(Message {
                body,
                body_len,
                blocks,
                large_bytes,
                shared: self.shared.clone(),
            }),
            Err(e) => {
                self.shared.release(&blocks);
                // Blocks named after the failing field go back too.
                self.shared.dropped(pos, n_slots);
                Err(e)
            }
        }
    }

    /// The in-place batch loop of [`Receiver::recv_batch`]:
    /// waits for a record, then for up to `max` messages copies the body's headers into a
    /// private buffer and lets `each(body, data, pool, blocks)` parse, validate and read it
    /// (pushing every pool block the message names onto `blocks`); releases every slot read
    /// with one store and every block once at the end. A message `each` refuses ends the batch
    /// with its error, and every block it named comes back to the producer.
    pub(super) fn read_in_place(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        mut each: impl FnMut(
            &[u8],
            ShmBytes<'_>,
            PoolRef<'_>,
            &mut SmallVec<[u32; 16]>,
        ) -> Result<(), Error>,
    ) -> Result<usize, Error> {
        self.shared.check()?;
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut rec = self.next_rec(deadline)?;
        let mut done = 0usize;
        let mut blocks: SmallVec<[u32; 16]> = SmallVec::new();
        let mut dropped = None;
        let result = loop {
            let (n, block) = match rec {
                Rec::Inline { n_slots, .. } => (n_slots, None),
                Rec::Block { block, .. } => (1, Some(block)),
                Rec::Pad(n) => (n, None),
            };
            if !matches!(rec, Rec::Pad(_)) {
                let ok = match Self::body_bytes(&self.desc, &self.shared.seg, &rec) {
                    Ok(src) => {
                        let len = src.len();
                        if self.scratch.len() < len.div_ceil(8) {
                            self.scratch.resize(len.div_ceil(8), 0);
                        }
                        let body =
                            &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.scratch)[..len];
                        // A producer writing the source meanwhile only changes the bytes we
                        // copy, which are then validated as private data; inline array data
                        // is read through `src`'s checked zero-copy view.
                        message::copy_for_parse(src, body);
                        each(body, src, self.shared.pool(), &mut blocks)
                    }
                    Err(e) => Err(e),
                };
                if let Some(b) = block {
                    blocks.push(b);
                }
                match ok {
                    Ok(()) => done += 1,
                    Err(e) => {
                        dropped = Some(self.desc.position());
                        self.skip(n);
                        break Err(e);
                    }
                }
            }
            // Move past this record without publishing (one store at the end).
            self.skip(n);
            if done >= max {
                break Ok(done);
            }
            match self.peek() {
                Ok(Some(r)) => rec = r,
                Ok(None) => break Ok(done),
                Err(e) => break Err(e),
            }
        };
        self.release_read();
        blocks.sort_unstable();
        blocks.dedup();
        self.shared.release(&blocks);
        if let Some(from) = dropped {
            // A message that failed validation: every block it named comes back, also those
            // after the failing field (after the returns above, so none is returned twice).
            self.shared.dropped(
                from,
                if matches!(rec, Rec::Inline { .. }) {
                    n_of(&rec)
                } else {
                    1
                },
            );
        }
        result
    }
}

impl Receiver<Message> {
    /// Receives the next message, waiting as long as it takes.
    ///
    /// # Errors
    /// [`RecvError::Disconnected`] once the producer closed and everything was received;
    /// [`RecvError::PeerDied`] if the producer process died (seen within
    /// [`WaitConfig::liveness_check`]); [`RecvError::Corrupt`] if the message fails
    /// validation (it is skipped); [`RecvError::Os`].
    pub fn recv(&mut self) -> Result<Message, RecvError> {
        self.recv_deadline(None).map_err(RecvError::from_internal)
    }

    /// [`Receiver::recv`], waiting at most `timeout`.
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`], or [`RecvTimeoutError::Failed`] as [`Receiver::recv`].
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Message, RecvTimeoutError> {
        self.recv_deadline(Some(Instant::now() + timeout))
            .map_err(RecvTimeoutError::from_internal)
    }

    /// Receives a message if one is there.
    ///
    /// # Errors
    /// [`TryRecvError::Empty`], or [`TryRecvError::Failed`] as [`Receiver::recv`].
    pub fn try_recv(&mut self) -> Result<Message, TryRecvError> {
        self.recv_deadline(Some(Instant::now()))
            .map_err(TryRecvError::from_internal)
    }

    /// Waits (at most `timeout`, if given) for at least one message, then lets `f` read up to
    /// `max` messages in place, all handed back together at the end (one index store).
    /// Returns how many were read.
    ///
    /// Names, metadata and shapes are read from a private copy of each message; array data is
    /// read where it lies in shared memory (zero-copy), so a hostile producer can change array
    /// values during `f`, never their bounds.
    ///
    /// # Errors
    /// As [`Receiver::recv_timeout`]; a corrupt message ends the batch with
    /// [`RecvError::Corrupt`] after the messages before it were handed to `f`.
    pub fn recv_batch(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        mut f: impl FnMut(MessageView<'_>),
    ) -> Result<usize, RecvTimeoutError> {
        self.read_in_place(max, timeout, |body, data, pool, blocks| {
            let v = MessageView::parse_with(body, data, pool)?;
            v.for_each_block(|b, _| blocks.push(b))?;
            f(v);
            Ok(())
        })
        .map_err(RecvTimeoutError::from_internal)
    }
}

impl<P> Drop for Receiver<P> {
    fn drop(&mut self) {
        if !self.shared.owner.is_current_strict() {
            return; // a forked child's copy: the parent is still the consumer
        }
        self.release_read();
        super::own_receiver(self.ident, Some(false));
        if self.served.is_some() && self.producer.is_dead() {
            self.remove_stale_name();
        }
        let h = self.header();
        h.consumer_closed.store(1, Ordering::SeqCst);
        // Wake a producer asleep on a full ring or an empty pool.
        sys::futex_wake_all(&self.desc.storage().header().head.0);
        if let Ok(comp) = self.shared.comp.lock() {
            sys::futex_wake_all(&comp.storage().header().tail.0);
        }
    }
}
