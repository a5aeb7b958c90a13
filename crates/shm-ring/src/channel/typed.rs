//! The typed path: a channel of fixed-size plain-old-data values, one per ring slot, with no
//! record header and no per-message description. The value type ([`ValueType`]) is written
//! into the segment once at creation and checked once at open.
//!
//! Everything else — liveness, [`SendError::PeerDied`], close and drain, linger — is the
//! [`Sender`]'s and [`Receiver`]'s: a typed end wraps one and uses its ring and wait loop.

use std::marker::PhantomData;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use bytemuck::Pod;

use super::receiver::Expect;
use super::wait::block_on;
use super::{ChannelConfig, Receiver, Sender, WaitConfig};
use crate::error::Error;
use crate::op_error::{RecvError, SendError, TrySendError};
use crate::rendezvous::Rendezvous;
use crate::schema::ValueType;
use crate::sync::{AtomicU32, Ordering};

/// The producer end of a typed channel: every message is one `T`, written straight into a
/// ring slot. Dropping it closes the channel as [`Sender`] does (the consumer receives every
/// value sent, then [`RecvError::Disconnected`]; a named channel lingers for a late consumer).
///
/// The channel's geometry comes from the [`ChannelConfig`] given, except that its slots are
/// sized for `T` (`size_of::<T>()` rounded up to 64 bytes, at most 64 KiB) and it has no pool
/// (`blocks` is ignored).
///
/// # Examples
/// ```
/// use shm_ring::{ChannelConfig, RecvError, TypedReceiver, TypedSender};
/// let name = format!("doc-typed-{}", std::process::id());
/// let mut tx = TypedSender::<[f32; 16]>::create(&name, &ChannelConfig::default())?;
/// let mut rx = TypedReceiver::<[f32; 16]>::open(&name)?; // usually in another process
/// tx.send(&[1.0; 16])?;
/// tx.send_many(&[[2.0; 16], [3.0; 16]])?; // one index publish for both
/// assert_eq!(rx.recv()?[0], 1.0);
/// assert_eq!(rx.recv_with(|x| x.iter().sum::<f32>())?, 32.0);
/// assert_eq!(rx.try_recv()?, Some([3.0; 16]));
/// drop(tx);
/// assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
/// # Ok::<(), shm_ring::Error>(())
/// ```
#[derive(Debug)]
pub struct TypedSender<T> {
    inner: Sender,
    _t: PhantomData<fn(T)>,
}

/// The consumer end of a typed channel (see [`TypedSender`]). Opening a channel of another
/// value type, or a channel of self-describing messages, fails with
/// [`SchemaError::Mismatch`](crate::SchemaError::Mismatch) and leaves the channel untouched.
#[derive(Debug)]
pub struct TypedReceiver<T> {
    inner: Receiver,
    /// Values read since the last full `release` (each was handed back at once by
    /// `publish_head`; the full release adds the fence and the waiting-flag check).
    unreleased: u32,
    /// Every this many values (a quarter of the ring) the hand-back is a full `release`
    /// (fence + waiting-flag check), so a producer that raced into sleep is woken promptly.
    release_every: u32,
    /// The process of the receiver (a copy of its owner, kept here for the fast path).
    owner: crate::fork::Owner,
    _t: PhantomData<fn() -> T>,
}

/// Slot size of a typed channel of `T`.
pub(super) fn typed_config<T>(cfg: &ChannelConfig) -> Result<ChannelConfig, Error> {
    let size = std::mem::size_of::<T>().max(1);
    let slot_size = size.div_ceil(64) * 64;
    if slot_size > 65536 {
        return Err(Error::TooLarge {
            what: "typed value",
            needed: size,
            limit: 65536,
            setting: "the value type (send larger values as messages with a Sender)",
        });
    }
    Ok(ChannelConfig {
        slot_size: slot_size as u32,
        blocks: 0,
        block_size: 64,
        large_pool: 0,
        ..*cfg
    })
}

impl<T: Pod> TypedSender<T> {
    /// Creates the typed channel `name` (served by name as [`Sender::create`] does).
    ///
    /// # Errors
    /// As [`Sender::create`]; [`Error::TooLarge`] for a `T` over 64 KiB.
    pub fn create(name: &str, cfg: &ChannelConfig) -> Result<TypedSender<T>, Error> {
        Self::make(Some(name), cfg)
    }

    /// Creates an anonymous typed channel (a sealed memfd: hand [`AsFd::as_fd`]'s descriptor
    /// to the consumer process and open it with [`TypedReceiver::from_fd`]).
    ///
    /// # Errors
    /// As [`TypedSender::create`].
    pub fn anonymous(cfg: &ChannelConfig) -> Result<TypedSender<T>, Error> {
        Self::make(None, cfg)
    }

    fn make(name: Option<&str>, cfg: &ChannelConfig) -> Result<TypedSender<T>, Error> {
        let cfg = typed_config::<T>(cfg)?;
        let schema = ValueType::of::<T>();
        Ok(TypedSender {
            inner: Sender::create_with(name, &cfg, Some(&schema))?,
            _t: PhantomData,
        })
    }

    /// The channel's name; `None` if anonymous.
    pub fn name(&self) -> Option<&str> {
        self.inner.name()
    }

    /// The configuration (with the slot size and pool the typed channel uses).
    pub fn config(&self) -> &ChannelConfig {
        self.inner.config()
    }

    /// Values sent so far.
    pub fn sent(&self) -> u64 {
        self.inner.stats.messages
    }

    /// Whether this process made the sender, has not shut it down, and the consumer has not
    /// closed (one compare of process-local words, and one load of a line nobody writes while
    /// the channel is open). The producer's own close flag is not read back: only this sender
    /// sets it, and its gate says so.
    #[inline]
    fn is_open(&self) -> bool {
        crate::fork::Owner::holds(self.inner.gate)
            && self.inner.header().consumer_closed.load(Ordering::Relaxed) == 0
    }

    #[inline]
    fn check_open(&self) -> Result<(), SendError> {
        if self.is_open() {
            Ok(())
        } else if !self.inner.owner.is_current() {
            Err(SendError::from_internal(self.inner.owner.refusal()))
        } else {
            Err(SendError::Disconnected)
        }
    }

    /// Writes `vals` into the next free slots and publishes them (one index store).
    /// There must be room for all of them (the caller checked or waited).
    #[inline]
    fn put(&mut self, vals: &[T]) -> Result<(), Error> {
        let s = &mut self.inner;
        let n = vals.len() as u32;
        let mut w = s.desc.write_chunk_uninit(n)?;
        for (i, v) in vals.iter().enumerate() {
            // The slot size was chosen for T at creation; unaligned, no alignment assumed.
            w.write_unaligned(i as u32, *v);
        }
        w.commit(n);
        s.stats.messages += vals.len() as u64;
        Ok(())
    }

    /// Sends one value, waiting (per [`WaitConfig`]) while the ring is full.
    ///
    /// # Errors
    /// [`SendError::Disconnected`] if the consumer closed; [`SendError::PeerDied`] if it died
    /// (seen within [`WaitConfig::liveness_check`] of waiting); [`SendError::NoConsumer`];
    /// [`SendError::Corrupt`].
    #[inline]
    pub fn send(&mut self, value: &T) -> Result<(), SendError> {
        // Fast path: open, and a free slot by the cached index: one chunk of one slot, one
        // commit (no wait-loop set-up).
        if self.is_open() {
            let s = &mut self.inner;
            if let Ok(mut w) = s.desc.write_chunk_uninit(1)
                && w.len() == 1
            {
                // The slot size was chosen for T at creation; unaligned, no alignment assumed.
                w.write_unaligned(0, *value);
                w.commit(1);
                s.stats.messages += 1;
                return Ok(());
            }
        }
        self.send_deadline(value, None)
    }

    /// [`TypedSender::send`] with a timeout ([`SendError::Timeout`]).
    ///
    /// # Errors
    /// As [`TypedSender::send`], and [`SendError::Timeout`].
    pub fn send_timeout(&mut self, value: &T, timeout: Duration) -> Result<(), SendError> {
        self.send_deadline(value, Some(Instant::now() + timeout))
    }

    fn send_deadline(&mut self, value: &T, deadline: Option<Instant>) -> Result<(), SendError> {
        self.check_open()?;
        // One slot: never padded (a single slot is always contiguous).
        self.inner
            .reserve_slots(1, deadline)
            .map_err(SendError::from_internal)?;
        self.put(std::slice::from_ref(value))
            .map_err(SendError::from_internal)
    }

    /// Sends `value` if a slot is free right now; gives it back otherwise.
    ///
    /// # Errors
    /// [`TrySendError::Full`] (the value is inside), [`TrySendError::Disconnected`],
    /// [`TrySendError::Failed`] for a corrupt ring index.
    pub fn try_send(&mut self, value: T) -> Result<(), TrySendError<T>> {
        if let Err(e) = self.check_open() {
            return Err(match e {
                SendError::Disconnected => TrySendError::Disconnected(value),
                e => TrySendError::Failed(e, value),
            });
        }
        match self.inner.desc.free(1) {
            Ok(0) => Err(TrySendError::Full(value)),
            Ok(_) => match self.put(std::slice::from_ref(&value)) {
                Ok(()) => Ok(()),
                Err(e) => Err(TrySendError::Failed(SendError::from_internal(e), value)),
            },
            Err(e) => Err(TrySendError::Failed(
                SendError::from_internal(e.into()),
                value,
            )),
        }
    }

    /// Sends every value of `values` in order, publishing as many as the ring has room for
    /// with one index store (waiting, as [`TypedSender::send`], while it is full).
    ///
    /// # Errors
    /// As [`TypedSender::send`]; the values before the failure were sent.
    pub fn send_many(&mut self, values: &[T]) -> Result<(), SendError> {
        self.check_open()?;
        let mut rest = values;
        while !rest.is_empty() {
            let want = u32::try_from(rest.len()).unwrap_or(u32::MAX);
            let mut free = self
                .inner
                .desc
                .free(want)
                .map_err(|e| SendError::from_internal(e.into()))?;
            if free == 0 {
                self.inner
                    .reserve_slots(1, None)
                    .map_err(SendError::from_internal)?;
                free = 1;
            }
            let n = (free as usize).min(rest.len());
            self.put(&rest[..n]).map_err(SendError::from_internal)?;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// Closes the channel (as dropping it): the consumer drains, then gets
    /// [`RecvError::Disconnected`].
    pub fn close(self) {}
}

impl<T> AsFd for TypedSender<T> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl<T: Pod> TypedReceiver<T> {
    fn wrap(inner: Receiver) -> TypedReceiver<T> {
        let release_every = (inner.desc.shape().capacity / 4).max(1);
        TypedReceiver {
            owner: inner.owner(),
            inner,
            unreleased: 0,
            release_every,
            _t: PhantomData,
        }
    }

    /// Opens the typed channel `name`, created by a [`TypedSender<T>`] of the same `T` (same
    /// size, alignment and, for element arrays, dtype and shape).
    ///
    /// # Errors
    /// As [`Receiver::open`]; [`Error::Schema`] (a [`SchemaError::Mismatch`](crate::SchemaError::Mismatch)
    /// naming both types) for a channel of another type or of self-describing messages.
    pub fn open(name: &str) -> Result<TypedReceiver<T>, Error> {
        let v = ValueType::of::<T>();
        Receiver::open_as(&Rendezvous::default(), name, None, Expect::Value(&v)).map(Self::wrap)
    }

    /// [`TypedReceiver::open`], waiting up to `timeout` for the channel to appear (see
    /// [`Receiver::open_timeout`]).
    ///
    /// # Errors
    /// As [`TypedReceiver::open`]; [`Error::NotFound`] after `timeout`.
    pub fn open_timeout(name: &str, timeout: Duration) -> Result<TypedReceiver<T>, Error> {
        let v = ValueType::of::<T>();
        Receiver::open_as(
            &Rendezvous::default(),
            name,
            Some(timeout),
            Expect::Value(&v),
        )
        .map(Self::wrap)
    }

    /// [`TypedReceiver::open`] (with `timeout`: [`TypedReceiver::open_timeout`]) in the socket
    /// directory and with the peers `rdv` says (see [`Receiver::open_in`]).
    ///
    /// # Errors
    /// As [`TypedReceiver::open_timeout`].
    pub fn open_in(
        rdv: &Rendezvous,
        name: &str,
        timeout: Option<Duration>,
    ) -> Result<TypedReceiver<T>, Error> {
        let v = ValueType::of::<T>();
        Receiver::open_as(rdv, name, timeout, Expect::Value(&v)).map(Self::wrap)
    }

    /// Opens an anonymous typed channel from its memfd (see [`TypedSender::anonymous`]).
    ///
    /// # Errors
    /// As [`TypedReceiver::open`] and [`Receiver::from_fd`].
    pub fn from_fd(fd: OwnedFd) -> Result<TypedReceiver<T>, Error> {
        let v = ValueType::of::<T>();
        Receiver::from_fd_as(fd, Expect::Value(&v)).map(Self::wrap)
    }

    /// Sets how blocked calls wait.
    pub fn set_wait(&mut self, wait: WaitConfig) {
        self.inner.set_wait(wait);
    }

    /// The channel name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Pid of the producer process.
    pub fn producer_pid(&self) -> u32 {
        self.inner.producer_pid()
    }

    /// Copies the value in slot 0 (published) out of shared memory and moves past it.
    #[inline]
    fn take(&mut self) -> Result<T, RecvError> {
        // The caller saw a published slot: the chunk has it (the open checked the slot size
        // against T). Copied once, by value; never a reference into shared memory.
        let r = self
            .inner
            .desc
            .read_chunk(1)
            .map_err(|e| RecvError::from_internal(e.into()))?;
        let v = r.read_unaligned::<T>(0);
        r.skip(1);
        self.read_one();
        Ok(v)
    }

    /// Hands the slot just read back to the producer at once. Holding read slots across
    /// calls (it used to hand them back once per quarter of the ring) kept a producer blocked
    /// on a full ring waiting for this receiver's next call, which may never come
    /// (`batching::a_blocked_typed_sender_proceeds_when_one_value_is_taken`).
    #[inline]
    fn read_one(&mut self) {
        self.unreleased += 1;
        if self.unreleased >= self.release_every {
            self.publish();
        } else {
            // The slot goes back at once (one Release store, no fence): see
            // `ring::Consumer::publish_head` for why a late wake-up is bounded.
            self.inner.desc.publish_head();
        }
    }

    /// Hands the slots read so far back to the producer (one store).
    #[inline]
    fn publish(&mut self) {
        if self.unreleased > 0 {
            // SYNC POINT (release(0)): we are done reading every skipped slot; see
            // `ring::Consumer::release`.
            self.inner.desc.release(0);
            self.unreleased = 0;
        }
    }

    /// `Some(())` once a value is available; `Err(Disconnected)` once the producer closed and
    /// everything was read.
    fn poll(&mut self) -> Result<Option<()>, Error> {
        self.inner.check_usable()?;
        if self.inner.desc.available(1)? > 0 {
            return Ok(Some(()));
        }
        self.publish();
        if self.inner.header().producer_closed.load(Ordering::SeqCst) != 0 {
            // SYNC POINT: the producer's last commit happened before its SeqCst flag store.
            return if self.inner.desc.available(1)? > 0 {
                Ok(Some(()))
            } else {
                Err(Error::Disconnected)
            };
        }
        Ok(None)
    }

    fn wait(&mut self, deadline: Option<Instant>) -> Result<(), RecvError> {
        if let Ok(Some(())) = self.poll() {
            return Ok(());
        }
        let wait = self.inner.wait;
        let this = std::cell::RefCell::new(self);
        block_on(
            true,
            &wait,
            deadline,
            || this.borrow_mut().poll(),
            || {
                let s = this.borrow();
                let (w, v) = s.inner.desc.peer_word();
                (w as *const AtomicU32, v)
            },
            || {
                let s = this.borrow();
                let (w, v) = s.inner.desc.begin_wait();
                (w as *const AtomicU32, v)
            },
            || this.borrow().inner.desc.end_wait(),
            || this.borrow().inner.producer_alive(),
        )
        .map_err(RecvError::from_internal)
    }

    /// Receives the next value, waiting as long as it takes.
    ///
    /// # Errors
    /// [`RecvError::Disconnected`] once the producer closed and everything was received;
    /// [`RecvError::PeerDied`] if the producer died (seen within
    /// [`WaitConfig::liveness_check`], after everything it sent was received);
    /// [`RecvError::Corrupt`] for an impossible ring index.
    #[inline]
    pub fn recv(&mut self) -> Result<T, RecvError> {
        // Fast path: our own receiver, and a value published (by the cached index or one
        // reload of the tail).
        if self.owner.is_current()
            && let Ok(r) = self.inner.desc.read_chunk(1)
            && r.len() == 1
        {
            let v = r.read_unaligned::<T>(0);
            r.skip(1);
            self.read_one();
            return Ok(v);
        }
        self.wait(None)?;
        self.take()
    }

    /// [`TypedReceiver::recv`] with a timeout ([`RecvError::Timeout`]).
    ///
    /// # Errors
    /// As [`TypedReceiver::recv`], and [`RecvError::Timeout`].
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<T, RecvError> {
        self.wait(Some(Instant::now() + timeout))?;
        self.take()
    }

    /// Receives a value if one is there.
    ///
    /// # Errors
    /// As [`TypedReceiver::recv`].
    pub fn try_recv(&mut self) -> Result<Option<T>, RecvError> {
        match self.poll() {
            Ok(Some(())) => self.take().map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(RecvError::from_internal(e)),
        }
    }

    /// Receives the next value and lets `f` read it. The value is copied once out of the
    /// slot first (another process may write shared memory at any time, so no Rust reference
    /// into it is handed out); for a value of a few cache lines that copy is the read.
    ///
    /// # Errors
    /// As [`TypedReceiver::recv`].
    pub fn recv_with<R>(&mut self, f: impl FnOnce(&T) -> R) -> Result<R, RecvError> {
        let v = self.recv()?;
        Ok(f(&v))
    }
}

impl<T> Drop for TypedReceiver<T> {
    fn drop(&mut self) {
        if self.unreleased > 0 && self.owner.is_current() {
            self.inner.desc.release(0);
        }
    }
}
