//! A lock-free single-producer single-consumer ring of fixed-size slots, generic over where its
//! memory lives ([`Storage`]): on the heap for tests and loom models, or in a shared-memory
//! segment between two processes.
//!
//! # Algorithm
//! The classic Lamport ring with cached indices (as in rtrb): the producer owns `tail`, the
//! consumer owns `head`; each keeps a cached copy of the other's index and only reloads it when
//! the cached value says the ring is *possibly* full (or empty). Positions are `u32` counters
//! that wrap; the slot of position `p` is `p & (capacity - 1)`, and `tail - head` (wrapping) is
//! the number of filled slots, always in `0 ..= capacity`.
//!
//! Both sides can move many slots with one index store (batch push/pop): a
//! [`WriteChunkUninit`] (from [`Producer::write_chunk_uninit`]) hands out free slots, and its
//! `commit(k)` publishes `k` of them with one store of `tail` (its `stage(k)` keeps them
//! unpublished, for the next commit); a [`ReadChunk`] (from [`Consumer::read_chunk`]) hands out
//! published slots, and its `release(k)` gives `k` of them back with one store of `head`. The
//! chunks read and write slots through bounds-checked volatile copies (`read_pod`,
//! `write_pod`), so the raw slot pointers and their `unsafe` stay in this module. The channel
//! encodes and reads bodies in place through checked byte views of the slots
//! (`WriteChunkUninit::bytes_mut`, `Consumer::slot_bytes`: the link's `ShmBytes`), never
//! through a raw pointer; the raw pointers (`as_mut_ptr`, `as_ptr`, `slot`) remain for users of
//! the public ring API.
//!
//! # Waiting
//! A side that finds nothing to do may sleep on the *other* side's index word with a futex.
//! It first raises its `waiting` flag, then issues a `SeqCst` fence and re-reads the index;
//! the other side stores its index, issues a `SeqCst` fence and then reads the flag (a Dekker
//! handshake). The two fences are ordered one way or the other in the single total order of
//! `SeqCst` fences, so one of the two sides sees the other's store: a wake-up is never lost;
//! and the futex itself refuses to sleep if the index word already moved. The fences (rather
//! than `SeqCst` loads and stores) are what loom models faithfully: `tests/loom.rs` checks this
//! very code with the futex modelled as a real sleep and wake.
//!
//! The waker calls `futex_wake` only when the flag says the peer sleeps (or is about to), so
//! a busy pair of processes never enters the kernel.
//!
//! # Validation
//! Indices are read from memory a peer can write. A distance `tail - head` larger than the
//! capacity is reported as [`RingError::Corrupt`], never used.

use std::fmt;

use crate::sync::{AtomicU32, Ordering, fence};

// Bounds-checked views of shared-memory bytes: the one way the layers above touch them.
#[cfg(not(loom))]
pub(crate) mod bytes;
mod chunks;
// A ring on the heap: for the loom models and the conformance tests, not used by the channel.
#[cfg(any(loom, test, feature = "unstable-internals"))]
mod heap;

pub use chunks::{ReadChunk, WriteChunkUninit};
#[cfg(any(loom, test, feature = "unstable-internals"))]
pub use heap::{HeapStorage, heap_ring};

/// A value padded and aligned to 128 bytes (two cache lines, against adjacent-line prefetch),
/// with a `#[repr(C)]` layout that is stable across processes.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub struct Padded<T>(pub T);

/// The shared state of a ring. `#[repr(C)]`: it is placed in shared memory.
#[repr(C)]
#[derive(Debug, Default)]
pub struct RingHeader {
    /// Next position the producer writes; only the producer stores it. Wraps; the consumer may
    /// sleep on it (futex word).
    pub(crate) tail: Padded<AtomicU32>,
    /// Next position the consumer reads; only the consumer stores it. Wraps; the producer may
    /// sleep on it (futex word).
    pub(crate) head: Padded<AtomicU32>,
    /// 1 while the consumer is (about to be) asleep on `tail`.
    pub(crate) consumer_waiting: Padded<AtomicU32>,
    /// 1 while the producer is (about to be) asleep on `head`.
    pub(crate) producer_waiting: Padded<AtomicU32>,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<RingHeader>() == 512);

/// Where a ring's header and slots live.
///
/// # Safety
/// Implementors guarantee that `header()` and the `slots_len()` bytes at `slots()` stay valid
/// (and at the same address) for the lifetime of `self`, and that the slot memory is aligned
/// to 8 bytes. Attaching checks the shape's `capacity * slot_size` against `slots_len()`. The other side may be another process, buggy or hostile, writing
/// anything anywhere: the ring validates every index it loads and hands out slot *pointers*
/// only, which callers read once into locals (or copy) before validating.
pub unsafe trait Storage {
    /// The shared indices.
    fn header(&self) -> &RingHeader;
    /// The first slot.
    fn slots(&self) -> *mut u8;
    /// How many bytes of slot memory there are at `slots()`.
    fn slots_len(&self) -> usize;
    /// Called when the producer (`write`) or the consumer takes the slot at index `idx`;
    /// the loom build records the access to detect data races on slots. A no-op otherwise.
    #[inline]
    fn track(&self, _idx: u32, _write: bool) {}
}

/// Errors of ring operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingError {
    /// An index read from shared memory is impossible (the peer is buggy or hostile).
    Corrupt {
        /// Producer position seen.
        tail: u32,
        /// Consumer position seen.
        head: u32,
        /// Ring capacity.
        capacity: u32,
    },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Corrupt {
                tail,
                head,
                capacity,
            } => write!(
                f,
                "ring indices tail={tail} head={head} are more than capacity {capacity} apart"
            ),
        }
    }
}

impl std::error::Error for RingError {}

/// Shape of a ring: slot count (a power of two) and bytes per slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingShape {
    /// Number of slots, a power of two, at least 1 and at most 2^30.
    pub capacity: u32,
    /// Bytes per slot, a multiple of 8.
    pub slot_size: u32,
}

impl RingShape {
    /// Checks the shape's invariants.
    pub fn is_valid(&self) -> bool {
        self.capacity.is_power_of_two()
            && self.capacity <= 1 << 30
            && self.slot_size >= 8
            && self.slot_size.is_multiple_of(8)
    }

    /// Bytes of slot memory.
    pub fn bytes(&self) -> usize {
        self.capacity as usize * self.slot_size as usize
    }
}

/// The producer half of a ring. `Send`, not `Sync`, not `Clone`: there is exactly one.
#[derive(Debug)]
pub struct Producer<S> {
    storage: S,
    shape: RingShape,
    /// Our last published write position (authoritative: only we store `tail`).
    tail: u32,
    /// Slots written after `tail` but not yet published (staged by [`WriteChunkUninit::stage`]),
    /// in `0 ..= capacity`; the next commit publishes them together.
    staged: u32,
    /// The consumer's `head` as last loaded; may be stale (too small), never too large.
    cached_head: u32,
}

/// The consumer half of a ring. `Send`, not `Sync`, not `Clone`: there is exactly one.
#[derive(Debug)]
pub struct Consumer<S> {
    storage: S,
    shape: RingShape,
    /// Our own next read position (authoritative: only we store `head`). It may run ahead of
    /// the `head` published in shared memory (slots skipped, released later in one store).
    head: u32,
    /// The producer's `tail` as last loaded; may be stale (too small), never too large.
    cached_tail: u32,
}

/// Splits a ring over `a` (given to the producer) and `b` (given to the consumer), two
/// handles on the same storage, whose header must be freshly initialised (`tail == head == 0`)
/// or consistent.
///
/// # Panics
/// If the shape is invalid.
#[cfg(any(loom, test, feature = "unstable-internals"))]
pub fn split<S: Storage>(a: S, b: S, shape: RingShape) -> (Producer<S>, Consumer<S>) {
    (Producer::attach(a, shape), Consumer::attach(b, shape))
}

/// A shape whose slots do not fit the storage would hand out slots past its memory.
#[track_caller]
fn assert_fits<S: Storage>(storage: &S, shape: RingShape) {
    assert!(
        shape.bytes() <= storage.slots_len(),
        "ring shape {shape:?} needs {} bytes of slots but its storage holds {}",
        shape.bytes(),
        storage.slots_len()
    );
}

impl<S: Storage> Producer<S> {
    /// Attaches to the producer side of an existing ring, continuing at its current `tail`.
    ///
    /// # Panics
    /// If the shape is invalid.
    pub fn attach(storage: S, shape: RingShape) -> Self {
        assert!(shape.is_valid(), "invalid ring shape {shape:?}");
        assert_fits(&storage, shape);
        let h = storage.header();
        let tail = h.tail.0.load(Ordering::Relaxed);
        // SYNC POINT (Acquire): pairs with the consumer's `release`: slots before `head` are
        // no longer read.
        let head = h.head.0.load(Ordering::Acquire);
        // The peer may have written anything: an impossible distance counts as "full", so the
        // first `free` reloads `head` and reports it as corrupt instead of trusting it.
        let cached_head = if tail.wrapping_sub(head) > shape.capacity {
            tail.wrapping_sub(shape.capacity)
        } else {
            head
        };
        Producer {
            storage,
            shape,
            tail,
            staged: 0,
            cached_head,
        }
    }

    /// The ring's shape.
    pub fn shape(&self) -> RingShape {
        self.shape
    }

    /// Our next write position: the published `tail` plus the staged slots.
    #[inline(always)]
    pub fn position(&self) -> u32 {
        self.tail.wrapping_add(self.staged)
    }

    /// Slots written but not yet published (see [`WriteChunkUninit::stage`]).
    #[inline]
    #[cfg(any(loom, test, feature = "unstable-internals"))]
    pub fn staged(&self) -> u32 {
        self.staged
    }

    /// Number of free slots after the write position, reloading the consumer's index only if
    /// the cached one says fewer than `want` are free ("*possibly* full").
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the consumer's index is impossible.
    #[inline(always)]
    pub fn free(&mut self, want: u32) -> Result<u32, RingError> {
        let pos = self.position();
        // `cached_head` is only ever a validated value, so this never underflows; saturate
        // anyway rather than trust it with a panic.
        let free = self
            .shape
            .capacity
            .saturating_sub(pos.wrapping_sub(self.cached_head));
        if free >= want {
            return Ok(free);
        }
        // Possibly full: look at the real head.
        // SYNC POINT (Acquire): pairs with the consumer's `release`; the consumer has finished
        // reading every slot before `head`, so we may overwrite them.
        let head = self.storage.header().head.0.load(Ordering::Acquire);
        let used = pos.wrapping_sub(head);
        if used > self.shape.capacity {
            return Err(RingError::Corrupt {
                tail: pos,
                head,
                capacity: self.shape.capacity,
            });
        }
        self.cached_head = head;
        Ok(self.shape.capacity - used)
    }

    /// Up to `n` free slots after the write position, as a chunk to write and then commit
    /// (or stage). The chunk may be shorter than `n` (down to empty) when the ring has less
    /// room; unlike rtrb this is not an error, so callers that need `n` check [`len`].
    ///
    /// [`len`]: WriteChunkUninit::len
    ///
    /// # Examples
    /// ```
    /// use shm_ring::ring::{heap_ring, RingShape};
    /// let (mut p, mut c) = heap_ring(RingShape { capacity: 4, slot_size: 16 });
    /// let mut w = p.write_chunk_uninit(2).unwrap();
    /// w.write_pod(0, 0, 7u64);
    /// w.write_pod(1, 8, [1u32, 2]);
    /// w.commit_all(); // one store of `tail` for both slots
    /// let r = c.read_chunk(4).unwrap();
    /// assert_eq!(r.len(), 2);
    /// assert_eq!(r.read_pod::<u64>(0, 0), 7);
    /// assert_eq!(r.read_pod::<[u32; 2]>(1, 8), [1, 2]);
    /// r.release_all();
    /// assert_eq!(p.free(4).unwrap(), 4);
    /// ```
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the consumer's index is impossible.
    #[inline(always)]
    pub fn write_chunk_uninit(&mut self, n: u32) -> Result<WriteChunkUninit<'_, S>, RingError> {
        let free = self.free(n)?;
        Ok(WriteChunkUninit::new(self, n.min(free)))
    }

    /// Pointer to the slot `i` positions after our write position. Slots `i` and `i + 1` are
    /// adjacent in memory unless `i + 1` wraps to slot 0 ([`Producer::contiguous`]).
    /// Prefer [`Producer::write_chunk_uninit`], whose accessors are checked.
    #[inline(always)]
    pub fn slot(&self, i: u32) -> *mut u8 {
        self.slot_at(self.position().wrapping_add(i))
    }

    /// Pointer to the slot of position `pos`; tracked for loom.
    #[inline(always)]
    fn slot_at(&self, pos: u32) -> *mut u8 {
        let idx = pos & (self.shape.capacity - 1);
        self.storage.track(idx, true);
        // `idx < capacity`, so the offset stays inside the slot memory (Storage guarantee).
        self.storage
            .slots()
            .wrapping_add(idx as usize * self.shape.slot_size as usize)
    }

    /// Number of slots from the write position `i` ahead to the end of the slot array (records
    /// that must be contiguous have to fit in this).
    #[inline]
    pub fn contiguous(&self, i: u32) -> u32 {
        let idx = self.position().wrapping_add(i) & (self.shape.capacity - 1);
        self.shape.capacity - idx
    }

    /// Publishes the staged slots and the next `n` slots, which the caller has written (and
    /// which were free). Returns whether the consumer was waiting (and so got woken).
    #[inline]
    pub fn commit(&mut self, n: u32) -> bool {
        self.staged = self.staged.wrapping_add(n);
        self.publish()
    }

    /// Publishes every staged slot (one store of `tail`) and wakes the consumer if it sleeps.
    /// Returns whether it was waiting. Nothing to publish: no store, returns `false`.
    #[inline]
    pub fn publish(&mut self) -> bool {
        if self.staged == 0 {
            return false;
        }
        self.tail = self.tail.wrapping_add(self.staged);
        self.staged = 0;
        let h = self.storage.header();
        // SYNC POINT (Release): the contents of the committed slots are visible to the
        // consumer once it loads this tail with Acquire.
        h.tail.0.store(self.tail, Ordering::Release);
        // SYNC POINT (SeqCst fence): Dekker handshake with `Consumer::begin_wait` (flag store,
        // fence, tail load): in the total order of SeqCst fences, either our flag load below
        // sees its flag, or its tail load sees our store (see "Waiting" in the module doc).
        fence(Ordering::SeqCst);
        if h.consumer_waiting.0.load(Ordering::Relaxed) != 0 {
            wake(&h.tail.0);
            true
        } else {
            false
        }
    }

    /// Raises our waiting flag and returns `(futex word, value to sleep on)`: sleep only if the
    /// consumer's `head` still equals the value. Call [`Producer::end_wait`] after sleeping.
    pub fn begin_wait(&self) -> (&AtomicU32, u32) {
        let h = self.storage.header();
        h.producer_waiting.0.store(1, Ordering::Relaxed);
        // SYNC POINT (SeqCst fence): Dekker handshake with the consumer's `release` (head
        // store, fence, flag load): one of the two sees the other.
        fence(Ordering::SeqCst);
        (&h.head.0, h.head.0.load(Ordering::Relaxed))
    }

    /// The futex word the consumer moves (its `head`) and its current value, without raising
    /// our waiting flag: for a spinning waiter that only watches for movement.
    #[inline]
    pub fn peer_word(&self) -> (&AtomicU32, u32) {
        let w = &self.storage.header().head.0;
        (w, w.load(Ordering::Relaxed))
    }

    /// Lowers our waiting flag.
    pub fn end_wait(&self) {
        self.storage
            .header()
            .producer_waiting
            .0
            .store(0, Ordering::Relaxed);
    }

    /// Publishes the staged slots, then discards everything not yet consumed, as if the
    /// consumer had read it all (its `head` jumps to our `tail`).
    ///
    /// # Safety
    /// No consumer may be reading the ring: it died or never attached, and none can attach
    /// before this returns. A live consumer would go on reading slots we now consider free and
    /// overwrite (a data race on the slot memory), and its next `release` would move `head`
    /// backwards (reported as [`RingError::Corrupt`]).
    pub unsafe fn reset_consumer(&mut self) {
        self.publish();
        let h = self.storage.header();
        h.head.0.store(self.tail, Ordering::SeqCst);
        self.cached_head = self.tail;
    }

    /// The storage.
    pub fn storage(&self) -> &S {
        &self.storage
    }
}

impl<S: Storage> Consumer<S> {
    /// Attaches to the consumer side of an existing ring, continuing at its current `head`.
    ///
    /// # Panics
    /// If the shape is invalid.
    pub fn attach(storage: S, shape: RingShape) -> Self {
        assert!(shape.is_valid(), "invalid ring shape {shape:?}");
        assert_fits(&storage, shape);
        let head = storage.header().head.0.load(Ordering::Relaxed);
        Consumer {
            storage,
            shape,
            head,
            cached_tail: head,
        }
    }

    /// The ring's shape.
    pub fn shape(&self) -> RingShape {
        self.shape
    }

    /// Our read position.
    #[inline(always)]
    pub fn position(&self) -> u32 {
        self.head
    }

    /// Number of filled slots, reloading the producer's index only if the cached one says
    /// fewer than `want` are available ("*possibly* empty").
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the producer's index is impossible.
    #[inline(always)]
    pub fn available(&mut self, want: u32) -> Result<u32, RingError> {
        let avail = self.cached_tail.wrapping_sub(self.head);
        if avail >= want {
            return Ok(avail);
        }
        // SYNC POINT (Acquire): pairs with the producer's `publish`; the contents of every slot
        // before `tail` are visible to us.
        let tail = self.storage.header().tail.0.load(Ordering::Acquire);
        let avail = tail.wrapping_sub(self.head);
        if avail > self.shape.capacity {
            return Err(RingError::Corrupt {
                tail,
                head: self.head,
                capacity: self.shape.capacity,
            });
        }
        self.cached_tail = tail;
        Ok(avail)
    }

    /// Up to `n` published slots from our read position, as a chunk to read and then
    /// release (or skip). Shorter than `n` (down to empty) when fewer are published.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the producer's index is impossible.
    #[inline(always)]
    pub fn read_chunk(&mut self, n: u32) -> Result<ReadChunk<'_, S>, RingError> {
        let avail = self.available(n)?;
        Ok(ReadChunk::new(self, n.min(avail)))
    }

    /// Every published slot from our read position, as a chunk, reloading the producer's
    /// index only if the cached one says the ring is empty (the cheap "anything there?" of a
    /// polling consumer).
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the producer's index is impossible.
    #[inline(always)]
    pub fn read_available(&mut self) -> Result<ReadChunk<'_, S>, RingError> {
        let avail = self.available(1)?;
        Ok(ReadChunk::new(self, avail))
    }

    /// Pointer to the slot `i` positions after our read position.
    /// Prefer [`Consumer::read_chunk`], whose accessors are checked.
    #[inline(always)]
    pub fn slot(&self, i: u32) -> *const u8 {
        self.slot_at(self.head.wrapping_add(i))
    }

    /// Pointer to the slot of position `pos`; tracked for loom.
    #[inline(always)]
    fn slot_at(&self, pos: u32) -> *const u8 {
        let idx = pos & (self.shape.capacity - 1);
        self.storage.track(idx, false);
        self.storage
            .slots()
            .wrapping_add(idx as usize * self.shape.slot_size as usize)
    }

    /// Number of slots from the read position `i` ahead to the end of the slot array.
    #[inline]
    pub fn contiguous(&self, i: u32) -> u32 {
        let idx = self.head.wrapping_add(i) & (self.shape.capacity - 1);
        self.shape.capacity - idx
    }

    /// Moves our read position past `n` slots without telling the producer; a later
    /// [`Consumer::release`] (e.g. `release(0)`) publishes the new position.
    /// [`ReadChunk::skip`] is the checked form.
    ///
    /// # Safety
    /// The `n` slots must be published (`n <=` [`Consumer::available`]). Skipping past the
    /// producer's `tail` would make us read, through later slot pointers, slots the producer
    /// is still writing (a data race), and would publish a `head` ahead of `tail`.
    #[inline(always)]
    pub unsafe fn skip(&mut self, n: u32) {
        self.head = self.head.wrapping_add(n);
    }

    /// Publishes our read position (the slots read or skipped so far) with one Release store,
    /// without the Dekker fence of [`Consumer::release`]: for a consumer that hands slots back
    /// after every value and cannot afford a full fence each time. If the producer's waiting
    /// flag is seen raised, falls back to [`Consumer::release`] (fence + wake). A producer that
    /// raises its flag at the same instant may miss this store and fall asleep; it is woken by
    /// the consumer's next full `release` (before the consumer waits, and every quarter of the
    /// ring) or wakes by itself at the end of its sleep slice
    /// (`WaitConfig::liveness_check`, 50 ms): a late wake-up, never a lost one.
    #[inline]
    pub fn publish_head(&mut self) {
        let h = self.storage.header();
        // SYNC POINT (Release): we are done reading every slot before `head`; pairs with the
        // producer's Acquire load of `head` in `free` (as in `release`).
        h.head.0.store(self.head, Ordering::Release);
        if h.producer_waiting.0.load(Ordering::Relaxed) != 0 {
            self.release(0);
        }
    }

    /// Hands the next `n` slots (which were available), and any skipped before, back to the
    /// producer. Returns whether the producer was waiting (and so got woken).
    #[inline]
    pub fn release(&mut self, n: u32) -> bool {
        self.head = self.head.wrapping_add(n);
        let h = self.storage.header();
        // SYNC POINT (Release): we are done reading the released slots; pairs with the
        // producer's Acquire load of `head` in `free`.
        h.head.0.store(self.head, Ordering::Release);
        // SYNC POINT (SeqCst fence): Dekker handshake with `Producer::begin_wait`, as in
        // `Producer::publish`.
        fence(Ordering::SeqCst);
        if h.producer_waiting.0.load(Ordering::Relaxed) != 0 {
            wake(&h.head.0);
            true
        } else {
            false
        }
    }

    /// Raises our waiting flag and returns `(futex word, value to sleep on)`: sleep only if the
    /// producer's `tail` still equals the value. Call [`Consumer::end_wait`] after sleeping.
    pub fn begin_wait(&self) -> (&AtomicU32, u32) {
        let h = self.storage.header();
        h.consumer_waiting.0.store(1, Ordering::Relaxed);
        // SYNC POINT (SeqCst fence): Dekker handshake with the producer's `publish` (tail
        // store, fence, flag load): one of the two sees the other.
        fence(Ordering::SeqCst);
        (&h.tail.0, h.tail.0.load(Ordering::Relaxed))
    }

    /// The futex word the producer moves (its `tail`) and its current value, without raising
    /// our waiting flag: for a spinning waiter that only watches for movement.
    #[inline]
    pub fn peer_word(&self) -> (&AtomicU32, u32) {
        let w = &self.storage.header().tail.0;
        (w, w.load(Ordering::Relaxed))
    }

    /// Lowers our waiting flag.
    pub fn end_wait(&self) {
        self.storage
            .header()
            .consumer_waiting
            .0
            .store(0, Ordering::Relaxed);
    }

    /// The storage.
    pub fn storage(&self) -> &S {
        &self.storage
    }
}

#[cfg(not(loom))]
fn wake(word: &AtomicU32) {
    crate::sys::futex_wake_all(word);
}

#[cfg(loom)]
fn wake(word: &AtomicU32) {
    crate::sync::futex_wake_all(word);
}

/// The futex sleep of the loom build (see `sync`): sleeps while `*word == expected`, until a
/// wake on the ring. For the loom models of the sleep/wake handshake.
#[cfg(loom)]
pub use crate::sync::futex_wait;
