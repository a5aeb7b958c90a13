//! The producer end of a channel.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::errors::{LoanError, SendError, SendTimeoutError, TrySendError};
use super::{ChannelConfig, ChannelHeader, LARGE_KEEP, Message, ShmRing, channel_header};
use crate::dtype::Element;
use crate::error::Error;
use crate::fork::Owner;
use crate::link::segment::Segment;
use crate::link::wait::block_on;
use crate::message::{self, FieldSrc, MessageBuilder, Place};
use crate::pool::alloc::BlockPool;
use crate::pool::{ArrayLoanUninit, LoanToken};
use crate::ring::{self, Storage};
use crate::sync::Ordering;
use crate::sys;

/// Counters of a sender.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Messages sent.
    pub messages: u64,
    /// Arrays that went zero-copy (own pool block).
    pub zero_copy_arrays: u64,
    /// Arrays copied into the message body.
    pub copied_arrays: u64,
    /// Array bytes sent.
    pub array_bytes: u64,
}

/// The producer end of a channel of payload `P`: a [`Message`] of named n-d arrays (the
/// default) or one `bytemuck::Pod` value per message (see [`Payload`](super::Payload)). It
/// creates and owns the segment (and, for a named channel, serves its name). Dropping it
/// closes the channel (the consumer receives everything sent, then
/// [`RecvError::Disconnected`](super::RecvError::Disconnected)) and removes the name; if no consumer has attached yet, the
/// drop first waits up to [`ChannelConfig::linger`] for one, serving the name meanwhile, so a
/// consumer that starts later still finds the channel. `Send`, not `Sync`.
///
/// # Examples
/// ```
/// use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, Sender};
/// let name = format!("doc-chan-{}", std::process::id());
/// let mut tx = Sender::<Message>::create(&name, &ChannelConfig::default())?;
/// let mut rx = Receiver::<Message>::open(&name)?; // usually in another process
/// let loan = tx.loan::<f32>(&[4])?.write_with(|i| i as f32);
/// tx.send(MessageBuilder::new().array_loan("x", loan))?;
/// let msg = rx.recv()?;
/// assert_eq!(msg.record(0)?.array::<f32>("x")?.sum(), 6.0);
/// # Ok::<(), shm_ring::Error>(())
/// ```
pub struct Sender<P = Message> {
    seg: Arc<Segment>,
    pub(super) desc: ring::Producer<ShmRing>,
    /// The block allocator, with the consumer end of the completion ring.
    pool: BlockPool,
    cfg: ChannelConfig,
    /// The segment's (device, inode): a consumer claim naming our own pid is believed only if
    /// a Receiver of this process has this channel open.
    ident: (u64, u64),
    /// The consumer claim word last seen, and what it names.
    consumer: Option<(u64, Watch)>,
    /// Since when the channel has had no consumer (None while one is attached).
    unattached_since: Option<Instant>,
    max_inline: usize,
    /// The process that made this sender: any other (a forked child) is refused.
    pub(super) owner: Owner,
    /// `owner.gate()` until this sender shuts down, then `fork::CLOSED_GATE`: the typed fast
    /// path checks "our process and not shut down" with one compare (`Owner::holds`).
    pub(super) gate: u32,
    /// The name's server, for a named channel: dropped (socket removed) after the linger.
    server: Option<crate::rendezvous::NameServer>,
    pub(super) stats: SenderStats,
    _payload: PhantomData<fn(P)>,
}

impl<P> std::fmt::Debug for Sender<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("name", &self.name())
            .field("payload", &std::any::type_name::<P>())
            .field("cfg", &self.cfg)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

mod create;
mod watch;
mod write;

use crate::link::claim::Watch;

/// The descriptor of the channel's segment: for an anonymous channel, the sealed memfd to hand
/// to the consumer process (`try_clone_to_owned`, then [`Receiver::from_fd`](super::Receiver::from_fd) there).
impl<P> std::os::fd::AsFd for Sender<P> {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.seg.file().as_fd()
    }
}

impl<P> Sender<P> {
    /// The channel's name; `None` if anonymous.
    pub fn name(&self) -> Option<&str> {
        self.server.as_ref().map(|s| s.name())
    }

    /// The segment, for tests that look at its memory file. Not a stable API: to pass an
    /// anonymous channel to a child, use the sender's `AsFd`.
    #[cfg(feature = "unstable-internals")]
    #[doc(hidden)]
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// The configuration, as adjusted at creation (for tests). Not a stable API.
    #[cfg(feature = "unstable-internals")]
    #[doc(hidden)]
    pub fn config(&self) -> &ChannelConfig {
        &self.cfg
    }

    /// Counters since creation.
    pub fn stats(&self) -> SenderStats {
        self.stats
    }

    /// Number of pool blocks free right now (after taking back what the consumer returned).
    ///
    /// # Errors
    /// [`SendError::Forked`], or [`SendError::Corrupt`] from the completion ring.
    pub fn free_blocks(&mut self) -> Result<usize, SendError> {
        let mut free = || -> Result<usize, Error> {
            self.owner.check()?;
            self.pool.collect_returns()?;
            Ok(self.pool.available())
        };
        free().map_err(SendError::from_internal)
    }

    /// Number of descriptor slots in use (messages sent and not yet consumed): queue occupancy,
    /// for the harness. Not a stable API.
    ///
    /// # Errors
    /// [`SendError::Corrupt`] for an impossible ring index.
    #[cfg(feature = "unstable-internals")]
    #[doc(hidden)]
    pub fn queued_slots(&mut self) -> Result<u32, SendError> {
        let cap = self.desc.shape().capacity;
        let free = self
            .desc
            .free(cap)
            .map_err(|e| SendError::from_internal(e.into()))?;
        Ok(cap - free)
    }

    pub(super) fn header(&self) -> &ChannelHeader {
        channel_header(&self.seg)
    }

    /// A block from the pool for `len` bytes (their pages committed), waiting (up to
    /// `deadline`) while every block is out.
    pub(super) fn alloc_block(
        &mut self,
        len: usize,
        deadline: Option<Instant>,
    ) -> Result<u32, Error> {
        if let Some(b) = self.pool.try_alloc(len)? {
            return Ok(b);
        }
        if self.cfg.blocks == 0 {
            return Err(Error::TooLarge {
                what: "a zero-copy array (the pool has no blocks)",
                needed: 1,
                limit: 0,
                setting: "ChannelConfig::blocks",
            });
        }
        // Publish what we batched before we wait: the consumer may need it to free blocks.
        self.flush();
        let wait = self.cfg.wait;
        block_on(
            self,
            false,
            &wait,
            deadline,
            |s| s.pool.try_alloc(len),
            |s| s.pool.peer_word(),
            |s| s.pool.begin_wait(),
            |s| s.pool.end_wait(),
            |s| s.consumer_gone(),
        )
    }
}

impl Sender<Message> {
    /// Loans an uninitialised array of `shape` from the pool, to fill in place and send with
    /// [`MessageBuilder::array_loan`] (zero-copy). Waits while the pool is empty.
    ///
    /// # Errors
    /// [`SendError::TooLarge`] (in [`LoanError::Send`]) if the array exceeds a block;
    /// [`SendError::PeerDied`] / [`SendError::Disconnected`] while waiting;
    /// [`SendError::Corrupt`].
    pub fn loan<T: Element>(&mut self, shape: &[usize]) -> Result<ArrayLoanUninit<T>, LoanError> {
        self.loan_deadline(shape, None)
            .map_err(LoanError::from_internal)
    }

    /// [`Sender::loan`] with a timeout ([`LoanError::Timeout`]).
    ///
    /// # Errors
    /// As [`Sender::loan`], and [`LoanError::Timeout`].
    pub fn loan_timeout<T: Element>(
        &mut self,
        shape: &[usize],
        timeout: Duration,
    ) -> Result<ArrayLoanUninit<T>, LoanError> {
        self.loan_deadline(shape, Some(Instant::now() + timeout))
            .map_err(LoanError::from_internal)
    }

    fn loan_deadline<T: Element>(
        &mut self,
        shape: &[usize],
        deadline: Option<Instant>,
    ) -> Result<ArrayLoanUninit<T>, Error> {
        self.owner.check()?;
        let len = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows")))?;
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        if self.cfg.blocks == 0 {
            return Err(Error::TooLarge {
                what: "a loaned array (the pool has no blocks)",
                needed: 1,
                limit: 0,
                setting: "ChannelConfig::blocks",
            });
        }
        let block_size = self.pool.home().geom.block_size;
        if bytes > block_size {
            // An extent of the large size class, if the channel has one that holds it.
            self.large_fits("loaned array", bytes)?;
        }
        self.pool.new_message();
        let block = self.alloc_block(bytes, deadline)?;
        Ok(ArrayLoanUninit::new(LoanToken {
            home: self.pool.home().clone(),
            block,
            dtype: T::DTYPE,
            shape: shape.to_vec(),
            len,
            live: true,
        }))
    }

    /// Sends a message, waiting while the ring is full or the pool is empty.
    ///
    /// # Errors
    /// [`SendError::Disconnected`] if the consumer closed; [`SendError::PeerDied`] if it died
    /// (its blocks are reclaimed); [`SendError::TooLarge`]; [`SendError::Encode`] for a field over the
    /// encoding limits; [`SendError::InvalidArgument`] for a loan from another sender. On error, loans in the
    /// message go back to the pool.
    pub fn send(&mut self, mut msg: MessageBuilder<'_>) -> Result<(), SendError> {
        let r = self.send_inner(&mut msg, None);
        self.flush();
        r.map_err(SendError::from_internal)
    }

    /// Sends several messages and publishes them together: one store of the ring's tail (and
    /// at most one wake-up) for the whole burst, unless the ring fills up on the way (then what
    /// is staged is published before waiting, so the consumer can make room). Returns how many
    /// were sent.
    ///
    /// # Errors
    /// As [`Sender::send`]; the messages before the failing one were sent (and published).
    pub fn send_batch<'m>(
        &mut self,
        msgs: impl IntoIterator<Item = MessageBuilder<'m>>,
    ) -> Result<usize, SendError> {
        let mut n = 0;
        for mut m in msgs {
            if let Err(e) = self.send_inner(&mut m, None) {
                self.flush();
                return Err(SendError::from_internal(e));
            }
            n += 1;
        }
        self.flush();
        Ok(n)
    }

    /// [`Sender::send`], waiting at most `timeout` for room; on [`SendTimeoutError::Timeout`]
    /// and every other failure the message comes back, loans and all, so a caller can wait in
    /// slices (checking for signals between them) without losing it.
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`], [`SendTimeoutError::Disconnected`],
    /// [`SendTimeoutError::Failed`] (as [`Sender::send`]).
    // The message comes back by value, as crossbeam's errors do: boxing it would allocate on
    // every refused send of a loop that retries.
    #[allow(clippy::result_large_err)]
    pub fn send_timeout<'m>(
        &mut self,
        mut msg: MessageBuilder<'m>,
        timeout: Duration,
    ) -> Result<(), SendTimeoutError<MessageBuilder<'m>>> {
        let r = self.send_inner(&mut msg, Some(Instant::now() + timeout));
        self.flush();
        r.map_err(|e| SendTimeoutError::from_internal(e, msg))
    }

    /// Sends without waiting; on [`TrySendError::Full`] (the ring or pool has no room right
    /// now) and every other failure the message comes back, loans and all, to retry or drop.
    ///
    /// # Errors
    /// [`TrySendError::Full`], [`TrySendError::Disconnected`], [`TrySendError::Failed`] (as
    /// [`Sender::send`]).
    ///
    /// # Examples
    /// ```
    /// use shm_ring::{ChannelConfig, Message, MessageBuilder, Sender, TrySendError};
    /// let cfg = ChannelConfig { slots: 2, ..ChannelConfig::default() };
    /// let mut tx = Sender::<Message>::anonymous(&cfg)?;
    /// let data = [1.0f32; 4];
    /// let mut sent = 0;
    /// let back = loop {
    ///     match tx.try_send(MessageBuilder::new().array_slice("x", &[4], &data)?) {
    ///         Ok(()) => sent += 1,
    ///         Err(TrySendError::Full(msg)) => break msg, // nobody reads: the ring fills up
    ///         Err(e) => return Err(e.into()),
    ///     }
    /// };
    /// assert_eq!(sent, 2);
    /// let _unsent: MessageBuilder<'_> = back; // the message that did not fit, whole
    /// # Ok::<(), shm_ring::Error>(())
    /// ```
    #[allow(clippy::result_large_err)]
    pub fn try_send<'m>(
        &mut self,
        mut msg: MessageBuilder<'m>,
    ) -> Result<(), TrySendError<MessageBuilder<'m>>> {
        let r = self.send_inner(&mut msg, Some(Instant::now()));
        self.flush();
        r.map_err(|e| TrySendError::from_internal(e, msg))
    }
}

impl<P> Sender<P> {
    /// Ends the stream without giving up the mapping: the consumer drains what was sent, then
    /// gets [`RecvError::Disconnected`](super::RecvError::Disconnected), exactly as when the
    /// `Sender` is dropped, while memory this process still points into (the arrays of sent
    /// loans, say) stays mapped until the drop. Later sends fail with
    /// [`SendError::Disconnected`]. Dropping does this too.
    ///
    /// # Examples
    /// ```
    /// use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, RecvError, SendError, Sender};
    /// let mut tx = Sender::<Message>::anonymous(&ChannelConfig::default())?;
    /// let mut rx = Receiver::<Message>::from_fd(std::os::fd::AsFd::as_fd(&tx).try_clone_to_owned()?)?;
    /// tx.send(MessageBuilder::new().tag(7))?;
    /// tx.shutdown();
    /// assert_eq!(rx.recv()?.tag(), 7);
    /// assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    /// assert!(matches!(tx.send(MessageBuilder::new()), Err(SendError::Disconnected)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown(&mut self) {
        if !self.owner.is_current() {
            return; // a forked child's copy: the channel is the parent's
        }
        self.gate = crate::fork::CLOSED_GATE;
        self.flush();
        // SYNC POINT: Release (SeqCst) publishes every committed slot before the flag; the
        // consumer reads the flag with Acquire after finding the ring empty.
        self.header().producer_closed.store(1, Ordering::SeqCst);
        // Wake a consumer asleep on the descriptor ring: it will see the flag.
        sys::futex_wake_all(&self.desc.storage().header().tail.0);
    }

    /// Publishes every staged record (one store of the ring's tail; wakes a sleeping consumer).
    /// While extents of the large size class are out or reserved, also takes back what the
    /// consumer returned and gives back the pages of extents free for [`LARGE_KEEP`].
    #[inline]
    pub(super) fn flush(&mut self) {
        self.desc.publish();
        if self.pool.large_active() {
            self.keep_large_memory_small();
        }
    }

    #[cold]
    fn keep_large_memory_small(&mut self) {
        // A corrupt completion ring is reported by the next call that needs a block.
        let _ = self.pool.trim(Some(LARGE_KEEP));
    }

    /// Gives back now the pages of extents of the large size class
    /// ([`ChannelConfig::large_pool`]) that have been free for at least `idle_for`
    /// (`Duration::ZERO`: all free ones), after taking back what the consumer returned.
    /// Sends do this by themselves with [`LARGE_KEEP`]; call it from a producer that may stay
    /// idle after large items. Returns the bytes still reserved for extents (held by the
    /// consumer, in flight, loaned, or free for less than `idle_for`).
    ///
    /// # Errors
    /// [`SendError::Corrupt`] from the completion ring.
    ///
    /// # Examples
    /// ```
    /// use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, Sender};
    /// use std::time::Duration;
    /// let cfg = ChannelConfig { large_pool: 1 << 30, ..ChannelConfig::default() };
    /// let mut tx = Sender::<Message>::anonymous(&cfg)?;
    /// let mut rx = Receiver::<Message>::from_fd(std::os::fd::AsFd::as_fd(&tx).try_clone_to_owned()?)?;
    /// let big = vec![1.0f32; 3 << 20]; // 12 MiB: more than a block (1 MiB)
    /// tx.send(MessageBuilder::new().array_slice("x", &[big.len()], &big)?)?;
    /// let msg = rx.recv()?;
    /// assert_eq!(msg.record(0)?.array::<f32>("x")?.len(), 3 << 20);
    /// assert!(tx.trim_memory(Duration::ZERO)? >= 12 << 20); // the consumer still holds it
    /// drop(msg);
    /// assert_eq!(tx.trim_memory(Duration::ZERO)?, 0); // given back
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn trim_memory(&mut self, idle_for: Duration) -> Result<usize, SendError> {
        self.pool
            .trim(Some(idle_for))
            .map_err(SendError::from_internal)?;
        Ok(self.pool.large_committed())
    }

    /// Where a record of `n` slots goes: the number of pad slots that must come first (to
    /// the end of the slot array, as records never wrap).
    ///
    /// # Errors
    /// [`Error::TooLarge`] if the record (with its pad) can never fit in the ring.
    #[inline]
    pub(super) fn place_record(&self, n: u32) -> Result<u32, Error> {
        let contiguous = self.desc.contiguous(0);
        let pad = if contiguous < n { contiguous } else { 0 };
        if pad + n > self.desc.shape().capacity {
            return Err(Error::TooLarge {
                what: "message record",
                needed: n as usize * self.desc.shape().slot_size as usize,
                limit: self.max_inline,
                setting: "ChannelConfig::slots (or slot_size)",
            });
        }
        Ok(pad)
    }

    /// Waits (up to `deadline`) for room for a record of `n` slots after the staged ones;
    /// returns how many pad slots must come first.
    pub(super) fn reserve_slots(
        &mut self,
        n: u32,
        deadline: Option<Instant>,
    ) -> Result<u32, Error> {
        let pad = self.place_record(n)?;
        if self.desc.free(pad + n)? < pad + n {
            self.wait_for_slots(pad + n, deadline)?;
        }
        Ok(pad)
    }

    /// Waits until `need` slots after the staged ones are free (publishing the staged ones
    /// first: the consumer must see them to make room).
    #[cold]
    pub(super) fn wait_for_slots(
        &mut self,
        need: u32,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        self.flush();
        let wait = self.cfg.wait;
        block_on(
            self,
            false,
            &wait,
            deadline,
            |s| {
                if s.header().consumer_closed.load(Ordering::Relaxed) != 0 {
                    return Err(Error::Disconnected);
                }
                let free = s.desc.free(need)?;
                Ok((free >= need).then_some(()))
            },
            |s| s.desc.peer_word().0,
            |s| s.desc.begin_wait().1,
            |s| s.desc.end_wait(),
            |s| s.consumer_gone(),
        )
    }

    pub(super) fn send_inner(
        &mut self,
        msg: &mut MessageBuilder<'_>,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        self.owner.check()?;
        let h = self.header();
        // Our own flag (`shutdown`) or the consumer's: either way nobody will read this.
        if h.consumer_closed.load(Ordering::Relaxed) != 0
            || h.producer_closed.load(Ordering::Relaxed) != 0
        {
            return Err(Error::Disconnected);
        }
        message::check_limits(msg)?;
        // 1. Where does each array go?
        let mut places: SmallVec<[Place; 8]> = SmallVec::with_capacity(msg.fields.len());
        for f in &msg.fields {
            places.push(match &f.src {
                FieldSrc::Meta(_) => Place::None,
                FieldSrc::Array { data, .. } => {
                    self.place_array(data, &format_args!("'{}'", f.name))?
                }
            });
        }
        if self.cfg.large_pool > 0 {
            self.fit_places(&mut places);
        }
        let body_len = message::body_len(msg, &places);
        let inline = self.check_body(&places, body_len)?;
        // 2.-3. Blocks, slots, the record and its body (see `sender/write.rs`).
        let m: &MessageBuilder<'_> = msg;
        let rec_pos = self.write_record(
            &mut places,
            |i| match &m.fields[i].src {
                FieldSrc::Array { data, .. } => Some(data.bytes()),
                FieldSrc::Meta(_) => None,
            },
            inline,
            body_len,
            deadline,
            |dst, places| message::encode(m, places, dst),
        )?;
        for (f, p) in msg.fields.iter_mut().zip(&places) {
            if let FieldSrc::Array { data, .. } = &mut f.src {
                self.account_array(data, *p, rec_pos);
            }
        }
        self.stats.messages += 1;
        Ok(())
    }
}

impl<P> Drop for Sender<P> {
    fn drop(&mut self) {
        if !self.owner.is_current_strict() {
            return; // a forked child's copy: closing is the parent's business
        }
        self.shutdown();
        self.linger();
    }
}
