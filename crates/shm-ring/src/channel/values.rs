//! The verbs of a channel of values (`Sender<T>` / `Receiver<T>` for `T: bytemuck::Pod`): one
//! value per ring slot, with no record header and no per-message description. The value type
//! ([`ValueType`](crate::ValueType)) is written into the segment once at creation and checked
//! once at open.
//!
//! Everything else — liveness, [`SendError::PeerDied`], close and drain, linger — is shared
//! with the channel of messages: the same ends, ring and wait loop.

use std::time::{Duration, Instant};

use bytemuck::Pod;

use super::errors::{
    LoanError, RecvError, RecvTimeoutError, SendError, SendTimeoutError, TryRecvError, TrySendError,
};
use super::{Receiver, Sender, ShmRing};
use crate::error::Error;
use crate::link::wait::block_on;
use crate::ring::WriteChunkUninit;
use crate::sync::Ordering;

/// A ring slot loaned for one value of a channel of values ([`Sender::loan`]): written in
/// place (zeroed first), then sent. Dropping it unsent sends nothing.
///
/// # Examples
/// ```
/// use shm_ring::{ChannelConfig, Receiver, Sender};
/// #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
/// #[repr(C)]
/// struct Tick { price: f64, qty: u32, side: u32 }
/// let mut tx = Sender::<Tick>::anonymous(&ChannelConfig::default())?;
/// let mut rx = Receiver::<Tick>::from_fd(std::os::fd::AsFd::as_fd(&tx).try_clone_to_owned()?)?;
/// let mut slot = tx.loan()?;
/// slot.write_at(std::mem::offset_of!(Tick, price), 101.5f64);
/// slot.write_at(std::mem::offset_of!(Tick, qty), 7u32); // `side` stays 0
/// slot.send();
/// assert_eq!(rx.recv()?, Tick { price: 101.5, qty: 7, side: 0 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ValueLoan<'a, T> {
    chunk: WriteChunkUninit<'a, ShmRing>,
    sent: &'a mut u64,
    _t: std::marker::PhantomData<fn(T)>,
}

impl<T: Pod> ValueLoan<'_, T> {
    /// Writes the whole value into the slot.
    pub fn write(&mut self, value: T) {
        self.chunk.write_unaligned(0, value);
    }

    /// Writes `part` at byte `offset` of the value (a field: `std::mem::offset_of!`), in
    /// place.
    ///
    /// # Panics
    /// If `part` does not lie inside a `T`.
    #[track_caller]
    pub fn write_at<U: Pod>(&mut self, offset: usize, part: U) {
        let end = offset.checked_add(std::mem::size_of::<U>());
        assert!(
            end.is_some_and(|e| e <= std::mem::size_of::<T>()),
            "write_at({offset}) of {} bytes: outside a value of {} bytes",
            std::mem::size_of::<U>(),
            std::mem::size_of::<T>()
        );
        self.chunk.write_bytes(0, offset, bytemuck::bytes_of(&part));
    }

    /// Sends the value (one index store).
    pub fn send(self) {
        self.chunk.commit(1);
        *self.sent += 1;
    }
}

impl<T: Pod> Sender<T> {
    /// Whether this process made the sender, has not shut it down, and the consumer has not
    /// closed (one compare of process-local words, and one load of a line nobody writes while
    /// the channel is open). The producer's own close flag is not read back: only this sender
    /// sets it, and its gate says so.
    #[inline]
    fn is_open(&self) -> bool {
        crate::fork::Owner::holds(self.gate)
            && self.header().consumer_closed.load(Ordering::Relaxed) == 0
    }

    #[inline]
    fn check_open(&self) -> Result<(), Error> {
        if self.is_open() {
            Ok(())
        } else if !self.owner.is_current() {
            Err(self.owner.refusal())
        } else {
            Err(Error::Disconnected)
        }
    }

    /// Writes `vals` into the next free slots and publishes them (one index store).
    /// There must be room for all of them (the caller checked or waited).
    #[inline]
    fn put(&mut self, vals: &[T]) -> Result<(), Error> {
        let n = vals.len() as u32;
        let mut w = self.desc.write_chunk_uninit(n)?;
        for (i, v) in vals.iter().enumerate() {
            // The slot size was chosen for T at creation; unaligned, no alignment assumed.
            w.write_unaligned(i as u32, *v);
        }
        w.commit(n);
        self.stats.messages += vals.len() as u64;
        Ok(())
    }

    /// Sends one value, waiting (per [`WaitConfig`](crate::WaitConfig)) while the ring is full.
    ///
    /// # Errors
    /// [`SendError::Disconnected`] if the consumer closed; [`SendError::PeerDied`] if it died
    /// (seen within [`WaitConfig::liveness_check`](crate::WaitConfig::liveness_check) of
    /// waiting); [`SendError::NoConsumer`]; [`SendError::Corrupt`]; [`SendError::Os`].
    #[inline]
    pub fn send(&mut self, value: &T) -> Result<(), SendError> {
        // Fast path: open, and a free slot by the cached index: one chunk of one slot, one
        // commit (no wait-loop set-up).
        if self.is_open()
            && let Ok(mut w) = self.desc.write_chunk_uninit(1)
            && w.len() == 1
        {
            // The slot size was chosen for T at creation; unaligned, no alignment assumed.
            w.write_unaligned(0, *value);
            w.commit(1);
            self.stats.messages += 1;
            return Ok(());
        }
        self.send_deadline(value, None)
            .map_err(SendError::from_internal)
    }

    /// [`Sender::send`], waiting at most `timeout` for a free slot; the value comes back on
    /// every failure.
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`], [`SendTimeoutError::Disconnected`],
    /// [`SendTimeoutError::Failed`] (as [`Sender::send`]).
    pub fn send_timeout(&mut self, value: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        self.send_deadline(&value, Some(Instant::now() + timeout))
            .map_err(|e| SendTimeoutError::from_internal(e, value))
    }

    fn send_deadline(&mut self, value: &T, deadline: Option<Instant>) -> Result<(), Error> {
        self.check_open()?;
        // One slot: never padded (a single slot is always contiguous).
        self.reserve_slots(1, deadline)?;
        self.put(std::slice::from_ref(value))
    }

    /// Sends `value` if a slot is free right now; gives it back otherwise.
    ///
    /// # Errors
    /// [`TrySendError::Full`] (the value is inside), [`TrySendError::Disconnected`],
    /// [`TrySendError::Failed`] for a corrupt ring index.
    pub fn try_send(&mut self, value: T) -> Result<(), TrySendError<T>> {
        let r = self.check_open().and_then(|()| match self.desc.free(1)? {
            0 => Err(Error::Full),
            _ => self.put(std::slice::from_ref(&value)),
        });
        r.map_err(|e| TrySendError::from_internal(e, value))
    }

    /// Sends every value of `values` in order, publishing as many as the ring has room for
    /// with one index store (waiting, as [`Sender::send`], while it is full). Returns how
    /// many were sent (all of them).
    ///
    /// # Errors
    /// As [`Sender::send`]; the values before the failure were sent.
    pub fn send_batch(&mut self, values: &[T]) -> Result<usize, SendError> {
        let mut rest = values;
        let r = (|| -> Result<(), Error> {
            self.check_open()?;
            while !rest.is_empty() {
                let want = u32::try_from(rest.len()).unwrap_or(u32::MAX);
                let mut free = self.desc.free(want)?;
                if free == 0 {
                    self.reserve_slots(1, None)?;
                    free = 1;
                }
                let n = (free as usize).min(rest.len());
                self.put(&rest[..n])?;
                rest = &rest[n..];
            }
            Ok(())
        })();
        r.map(|()| values.len()).map_err(SendError::from_internal)
    }

    /// Loans the next ring slot (waiting while the ring is full) to write one value in place,
    /// then [`ValueLoan::send`] it. The slot is zeroed first.
    ///
    /// # Errors
    /// As [`Sender::send`], in [`LoanError::Send`].
    pub fn loan(&mut self) -> Result<ValueLoan<'_, T>, LoanError> {
        self.loan_deadline(None).map_err(LoanError::from_internal)
    }

    /// [`Sender::loan`], waiting at most `timeout` for a free slot.
    ///
    /// # Errors
    /// As [`Sender::loan`], and [`LoanError::Timeout`].
    pub fn loan_timeout(&mut self, timeout: Duration) -> Result<ValueLoan<'_, T>, LoanError> {
        self.loan_deadline(Some(Instant::now() + timeout))
            .map_err(LoanError::from_internal)
    }

    fn loan_deadline(&mut self, deadline: Option<Instant>) -> Result<ValueLoan<'_, T>, Error> {
        self.check_open()?;
        if self.desc.free(1)? == 0 {
            self.reserve_slots(1, deadline)?;
        }
        let mut chunk = self.desc.write_chunk_uninit(1)?;
        if chunk.len() != 1 {
            return Err(crate::error::corrupt("a reserved slot is gone"));
        }
        chunk.write_unaligned(0, T::zeroed());
        Ok(ValueLoan {
            chunk,
            sent: &mut self.stats.messages,
            _t: std::marker::PhantomData,
        })
    }
}

impl<T: Pod> Receiver<T> {
    /// Copies the value in slot 0 (published) out of shared memory and moves past it.
    #[inline]
    fn take(&mut self) -> Result<T, Error> {
        // The caller saw a published slot: the chunk has it (the open checked the slot size
        // against T). Copied once, by value; never a reference into shared memory.
        let r = self.desc.read_chunk(1)?;
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
            self.release_read();
        } else {
            // The slot goes back at once (one Release store, no fence): see
            // `ring::Consumer::publish_head` for why a late wake-up is bounded.
            self.desc.publish_head();
        }
    }

    /// `Some(n)` once `n` (at least one) values are available; `Err(Disconnected)` once the
    /// producer closed and everything was read.
    fn poll(&mut self, max: u32) -> Result<Option<u32>, Error> {
        self.check_usable()?;
        let n = self.desc.available(max)?;
        if n > 0 {
            return Ok(Some(n));
        }
        self.release_read();
        if self.header().producer_closed.load(Ordering::SeqCst) != 0 {
            // SYNC POINT: the producer's last commit happened before its SeqCst flag store.
            return match self.desc.available(max)? {
                0 => Err(Error::Disconnected),
                n => Ok(Some(n)),
            };
        }
        Ok(None)
    }

    /// Waits until at least one (of at most `max`) values is available; returns how many.
    fn wait(&mut self, max: u32, deadline: Option<Instant>) -> Result<u32, Error> {
        if let Ok(Some(n)) = self.poll(max) {
            return Ok(n);
        }
        let wait = self.wait;
        block_on(
            self,
            true,
            &wait,
            deadline,
            |s| s.poll(max),
            |s| s.desc.peer_word().0,
            |s| s.desc.begin_wait().1,
            |s| s.desc.end_wait(),
            |s| s.producer_alive(),
        )
    }

    /// Receives the next value, waiting as long as it takes.
    ///
    /// # Errors
    /// [`RecvError::Disconnected`] once the producer closed and everything was received;
    /// [`RecvError::PeerDied`] if the producer died (seen within
    /// [`WaitConfig::liveness_check`](crate::WaitConfig::liveness_check), after everything it
    /// sent was received); [`RecvError::Corrupt`] for an impossible ring index;
    /// [`RecvError::Os`].
    #[inline]
    pub fn recv(&mut self) -> Result<T, RecvError> {
        // Fast path: our own receiver, and a value published (by the cached index or one
        // reload of the tail).
        if self.owner_copy.is_current()
            && let Ok(r) = self.desc.read_chunk(1)
            && r.len() == 1
        {
            let v = r.read_unaligned::<T>(0);
            r.skip(1);
            self.read_one();
            return Ok(v);
        }
        self.wait(1, None)
            .and_then(|_| self.take())
            .map_err(RecvError::from_internal)
    }

    /// [`Receiver::recv`], waiting at most `timeout`.
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`], or [`RecvTimeoutError::Failed`] as [`Receiver::recv`].
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.wait(1, Some(Instant::now() + timeout))
            .and_then(|_| self.take())
            .map_err(RecvTimeoutError::from_internal)
    }

    /// Receives a value if one is there.
    ///
    /// # Errors
    /// [`TryRecvError::Empty`], or [`TryRecvError::Failed`] as [`Receiver::recv`].
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        match self.poll(1) {
            Ok(Some(_)) => self.take().map_err(TryRecvError::from_internal),
            Ok(None) => Err(TryRecvError::Empty),
            Err(e) => Err(TryRecvError::from_internal(e)),
        }
    }

    /// Waits (at most `timeout`, if given) for at least one value, then hands `f` every value
    /// there is, up to `max`, in order, and gives their slots back with one index store.
    /// Returns how many were read.
    ///
    /// # Errors
    /// As [`Receiver::recv_timeout`].
    pub fn recv_batch(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        mut f: impl FnMut(T),
    ) -> Result<usize, RecvTimeoutError> {
        let max = u32::try_from(max.max(1)).unwrap_or(u32::MAX);
        let deadline = timeout.map(|t| Instant::now() + t);
        let r = self.wait(max, deadline).and_then(|n| {
            let r = self.desc.read_chunk(n)?;
            let n = r.len();
            for i in 0..n {
                f(r.read_unaligned::<T>(i));
            }
            r.skip(n);
            self.unreleased += n;
            self.release_read();
            Ok(n as usize)
        });
        r.map_err(RecvTimeoutError::from_internal)
    }
}
