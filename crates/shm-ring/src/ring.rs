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
//! Both sides can move many slots with one index store (batch push/pop).
//!
//! # Waiting
//! A side that finds nothing to do may sleep on the *other* side's index word with a futex.
//! It first raises its `waiting` flag, then re-reads the index (both `SeqCst`); the other side
//! stores its index with `SeqCst` and then reads the flag. In the single total order of `SeqCst`
//! operations one of the two sees the other, so a wake-up is never lost; and the futex itself
//! refuses to sleep if the index word already moved.
//!
//! # Validation
//! Indices are read from memory a peer can write. A distance `tail - head` larger than the
//! capacity is reported as [`RingError::Corrupt`], never used.

use std::fmt;

use crate::sync::{AtomicU32, Ordering};

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
/// Implementors guarantee that `header()` and the `capacity * slot_size` bytes at `slots()`
/// stay valid (and at the same address) for the lifetime of `self`, and that the slot memory
/// is aligned to 8 bytes. The other side may be another process, buggy or hostile, writing
/// anything anywhere: the ring validates every index it loads and hands out slot *pointers*
/// only, which callers read once into locals (or copy) before validating.
pub unsafe trait Storage {
    /// The shared indices.
    fn header(&self) -> &RingHeader;
    /// The first slot.
    fn slots(&self) -> *mut u8;
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
    /// Our own next write position (authoritative: only we store `tail`).
    tail: u32,
    /// The consumer's `head` as last loaded; may be stale (too small), never too large.
    cached_head: u32,
}

/// The consumer half of a ring. `Send`, not `Sync`, not `Clone`: there is exactly one.
#[derive(Debug)]
pub struct Consumer<S> {
    storage: S,
    shape: RingShape,
    /// Our own next read position (authoritative: only we store `head`).
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
pub fn split<S: Storage>(a: S, b: S, shape: RingShape) -> (Producer<S>, Consumer<S>) {
    (Producer::attach(a, shape), Consumer::attach(b, shape))
}

impl<S: Storage> Producer<S> {
    /// Attaches to the producer side of an existing ring, continuing at its current `tail`.
    ///
    /// # Panics
    /// If the shape is invalid.
    pub fn attach(storage: S, shape: RingShape) -> Self {
        assert!(shape.is_valid(), "invalid ring shape {shape:?}");
        let h = storage.header();
        let tail = h.tail.0.load(Ordering::Relaxed);
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
            cached_head,
        }
    }

    /// The ring's shape.
    pub fn shape(&self) -> RingShape {
        self.shape
    }

    /// Our write position.
    pub fn position(&self) -> u32 {
        self.tail
    }

    /// Number of free slots, reloading the consumer's index only if the cached one says the
    /// ring is possibly full (fewer than `want` free).
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the consumer's index is impossible.
    #[inline]
    pub fn free(&mut self, want: u32) -> Result<u32, RingError> {
        // `cached_head` is only ever a validated value, so this never underflows; saturate
        // anyway rather than trust it with a panic.
        let free = self
            .shape
            .capacity
            .saturating_sub(self.tail.wrapping_sub(self.cached_head));
        if free >= want {
            return Ok(free);
        }
        // Possibly full: look at the real head.
        // SYNC POINT (Acquire): pairs with the consumer's `release`; the consumer has finished
        // reading every slot before `head`, so we may overwrite them.
        let head = self.storage.header().head.0.load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > self.shape.capacity {
            return Err(RingError::Corrupt {
                tail: self.tail,
                head,
                capacity: self.shape.capacity,
            });
        }
        self.cached_head = head;
        Ok(self.shape.capacity - used)
    }

    /// Pointer to the slot `i` positions after our write position. Slots `i` and `i + 1` are
    /// adjacent in memory unless `i + 1` wraps to slot 0 ([`Producer::contiguous`]).
    #[inline]
    pub fn slot(&self, i: u32) -> *mut u8 {
        let idx = self.tail.wrapping_add(i) & (self.shape.capacity - 1);
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
        let idx = self.tail.wrapping_add(i) & (self.shape.capacity - 1);
        self.shape.capacity - idx
    }

    /// Publishes the next `n` slots, which the caller has written (and which were free).
    /// Returns whether the consumer was waiting (and so got woken).
    #[inline]
    pub fn commit(&mut self, n: u32) -> bool {
        self.tail = self.tail.wrapping_add(n);
        let h = self.storage.header();
        // SYNC POINT (SeqCst store, Release semantics included): the contents of the committed
        // slots are visible to the consumer once it loads this tail with Acquire. SeqCst also
        // orders it before our read of `consumer_waiting` (see "Waiting" in the module doc).
        h.tail.0.store(self.tail, Ordering::SeqCst);
        if h.consumer_waiting.0.load(Ordering::SeqCst) != 0 {
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
        h.producer_waiting.0.store(1, Ordering::SeqCst);
        (&h.head.0, h.head.0.load(Ordering::SeqCst))
    }

    /// Lowers our waiting flag.
    pub fn end_wait(&self) {
        self.storage
            .header()
            .producer_waiting
            .0
            .store(0, Ordering::Relaxed);
    }

    /// Discards everything not yet consumed, as if the consumer had read it all. Only sound
    /// when no consumer is attached (it died or never came); used to reclaim a dead consumer's
    /// ring.
    pub fn reset_consumer(&mut self) {
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
    pub fn position(&self) -> u32 {
        self.head
    }

    /// Number of filled slots, reloading the producer's index only if the cached one says
    /// fewer than `want` are available.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the producer's index is impossible.
    #[inline]
    pub fn available(&mut self, want: u32) -> Result<u32, RingError> {
        let avail = self.cached_tail.wrapping_sub(self.head);
        if avail >= want {
            return Ok(avail);
        }
        // SYNC POINT (Acquire): pairs with the producer's `commit`; the contents of every slot
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

    /// Pointer to the slot `i` positions after our read position.
    #[inline]
    pub fn slot(&self, i: u32) -> *const u8 {
        let idx = self.head.wrapping_add(i) & (self.shape.capacity - 1);
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

    /// Moves our read position past `n` available slots without telling the producer; a later
    /// [`Consumer::release`] (e.g. `release(0)`) publishes the new position.
    #[inline]
    pub fn skip(&mut self, n: u32) {
        self.head = self.head.wrapping_add(n);
    }

    /// Hands the next `n` slots (which were available), and any skipped before, back to the
    /// producer.
    /// Returns whether the producer was waiting (and so got woken).
    #[inline]
    pub fn release(&mut self, n: u32) -> bool {
        self.head = self.head.wrapping_add(n);
        let h = self.storage.header();
        // SYNC POINT (SeqCst store, Release included): we are done reading the released slots;
        // pairs with the producer's Acquire load of `head` in `free`. SeqCst orders it before our
        // read of `producer_waiting`.
        h.head.0.store(self.head, Ordering::SeqCst);
        if h.producer_waiting.0.load(Ordering::SeqCst) != 0 {
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
        h.consumer_waiting.0.store(1, Ordering::SeqCst);
        (&h.tail.0, h.tail.0.load(Ordering::SeqCst))
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
fn wake(_word: &AtomicU32) {}

/// A ring on the process heap: for tests, loom models and in-process use.
#[derive(Debug, Clone)]
pub struct HeapStorage {
    inner: std::sync::Arc<HeapInner>,
}

#[derive(Debug)]
struct HeapInner {
    header: RingHeader,
    slots: Box<[std::cell::UnsafeCell<u64>]>,
    /// One loom cell per slot, touched on every slot access so loom sees who owns which slot.
    #[cfg(loom)]
    tracks: Box<[loom::cell::UnsafeCell<()>]>,
}

// SAFETY: the slot cells are only accessed through the ring protocol: the producer writes slots
// it owns (free ones), the consumer reads slots it owns (published ones), and ownership moves
// with the Release/Acquire index stores and loads.
unsafe impl Sync for HeapInner {}
// SAFETY: as above; the raw cells hold plain u64s.
unsafe impl Send for HeapInner {}

impl HeapStorage {
    /// Allocates a zeroed ring of the given shape.
    ///
    /// # Panics
    /// If the shape is invalid.
    pub fn new(shape: RingShape) -> Self {
        assert!(shape.is_valid());
        let words = shape.bytes() / 8;
        HeapStorage {
            inner: std::sync::Arc::new(HeapInner {
                header: RingHeader::default(),
                slots: (0..words).map(|_| std::cell::UnsafeCell::new(0)).collect(),
                #[cfg(loom)]
                tracks: (0..shape.capacity)
                    .map(|_| loom::cell::UnsafeCell::new(()))
                    .collect(),
            }),
        }
    }
}

// SAFETY: the header and the boxed slice live as long as the Arc, which every handle holds;
// the slice is `capacity * slot_size / 8` u64 cells, hence 8-aligned.
unsafe impl Storage for HeapStorage {
    fn header(&self) -> &RingHeader {
        &self.inner.header
    }
    fn slots(&self) -> *mut u8 {
        self.inner.slots.as_ptr() as *mut u8
    }
    #[cfg(loom)]
    fn track(&self, idx: u32, write: bool) {
        let cell = &self.inner.tracks[idx as usize];
        if write {
            cell.with_mut(|_| ());
        } else {
            cell.with(|_| ());
        }
    }
}

/// A heap ring split into its two halves.
///
/// # Examples
/// ```
/// use shm_ring::ring::{heap_ring, RingShape};
/// let (mut p, mut c) = heap_ring(RingShape { capacity: 4, slot_size: 8 });
/// assert_eq!(p.free(1).unwrap(), 4);
/// // SAFETY: slot 0 is free and 8 bytes long.
/// unsafe { p.slot(0).cast::<u64>().write(42) };
/// p.commit(1);
/// assert_eq!(c.available(1).unwrap(), 1);
/// // SAFETY: slot 0 is published and 8 bytes long.
/// assert_eq!(unsafe { c.slot(0).cast::<u64>().read() }, 42);
/// c.release(1);
/// ```
pub fn heap_ring(shape: RingShape) -> (Producer<HeapStorage>, Consumer<HeapStorage>) {
    let s = HeapStorage::new(shape);
    split(s.clone(), s, shape)
}
