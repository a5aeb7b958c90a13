//! Chunk guards: a run of free slots to write ([`WriteChunkUninit`]) or of published slots to
//! read ([`ReadChunk`]), handed out by [`Producer::write_chunk_uninit`] and
//! [`Consumer::read_chunk`] (after rtrb's `chunks` module, with byte slots instead of `T`).
//!
//! A chunk borrows its ring half mutably, so nothing else moves the index while it lives.
//! Slot `i` of a chunk is the slot `i` positions after the write (read) position; slots wrap
//! around the end of the slot array, records that must be contiguous ask
//! [`WriteChunkUninit::contiguous`] first.
//!
//! Every accessor checks its slot and byte range against the chunk (a handful of compares;
//! the panic paths are cold), so a wrong length in the caller is a panic, never a write
//! outside the slots it owns.
//!
//! Slot memory may be shared with another process that writes any byte at any time. So the
//! chunks never hand out references into it: values go in and out through bounds-checked
//! volatile copies ([`ReadChunk::read_pod`], [`WriteChunkUninit::write_pod`]), each read once
//! into a private value the caller validates. The channel, which encodes and reads bodies in
//! place, asks for a checked byte view of the contiguous slots (`WriteChunkUninit::bytes_mut`,
//! `Consumer::slot_bytes`; see `ring::bytes`); other users of the ring may ask for a raw
//! pointer ([`WriteChunkUninit::as_mut_ptr`], [`ReadChunk::as_ptr`]) and the number of bytes
//! they may touch there.

use bytemuck::Pod;

use super::{Consumer, Producer, Storage};

/// Up to `len` free slots after the producer's write position (see the module doc).
/// Dropping the chunk without committing publishes nothing.
#[derive(Debug)]
pub struct WriteChunkUninit<'a, S: Storage> {
    producer: &'a mut Producer<S>,
    /// Number of free slots in the chunk, `<= capacity - (position - head)`.
    len: u32,
}

/// Up to `len` published slots from the consumer's read position (see the module doc).
/// Dropping the chunk without releasing leaves the slots in the ring (a peek).
#[derive(Debug)]
pub struct ReadChunk<'a, S: Storage> {
    consumer: &'a mut Consumer<S>,
    /// Number of published slots in the chunk, `<= tail - head`.
    len: u32,
}

/// Checks that slot `i` is in a chunk of `len` slots and that a `T` fits, aligned, at byte
/// `off` of a slot of `slot_size` bytes. Cheap (a few compares): it runs on every record.
#[inline(always)]
#[track_caller]
fn check_pod<T: Pod>(i: u32, len: u32, off: usize, slot_size: usize) {
    let size = std::mem::size_of::<T>();
    let align = std::mem::align_of::<T>();
    if i >= len
        || align > 8
        || !off.is_multiple_of(align)
        || size > slot_size
        || off > slot_size - size
    {
        bad_access(i, len, off, size);
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn bad_access(i: u32, len: u32, off: usize, size: usize) -> ! {
    panic!(
        "slot access of {size} bytes at byte {off} of slot {i}: outside the slot, misaligned, \
         or outside a chunk of {len} slots"
    )
}

#[cold]
#[inline(never)]
#[track_caller]
fn too_many(what: &str, k: u32, len: u32) -> ! {
    panic!("{what} of {k} slots from a chunk of {len}")
}

impl<'a, S: Storage> WriteChunkUninit<'a, S> {
    #[inline(always)]
    pub(super) fn new(producer: &'a mut Producer<S>, len: u32) -> Self {
        WriteChunkUninit { producer, len }
    }

    /// Number of slots in the chunk.
    #[inline(always)]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the chunk has no slot (the ring is full).
    #[inline]
    #[cfg_attr(not(any(loom, feature = "unstable-internals")), allow(dead_code))]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of slots of the chunk from slot `i` on that are adjacent in memory (up to the
    /// end of the chunk or of the slot array, whichever comes first).
    #[inline]
    pub fn contiguous(&self, i: u32) -> u32 {
        if i >= self.len {
            return 0;
        }
        self.producer.contiguous(i).min(self.len - i)
    }

    /// Bytes per slot.
    #[inline]
    pub fn slot_size(&self) -> usize {
        self.producer.shape.slot_size as usize
    }

    /// Raw pointer to slot `i` (8-aligned), valid for `contiguous(i) * slot_size` bytes of
    /// writes while the chunk lives. The memory may be shared with a peer process: write
    /// through the pointer only, never make a reference to it.
    ///
    /// # Panics
    /// If `i >= len`.
    #[inline]
    #[track_caller]
    pub fn as_mut_ptr(&mut self, i: u32) -> *mut u8 {
        if i >= self.len {
            bad_access(i, self.len, 0, 0);
        }
        self.producer.slot(i)
    }

    /// The bytes of the contiguous slots of the chunk from slot `i` on
    /// (`contiguous(i) * slot_size` bytes), to write while the chunk lives: for a body
    /// encoded in place. (The byte views are not part of the loom build.)
    ///
    /// # Panics
    /// If `i >= len`.
    #[cfg(not(loom))]
    #[inline]
    #[track_caller]
    pub(crate) fn bytes_mut(&mut self, i: u32) -> crate::ring::bytes::ShmBytesMut<'_> {
        let len = self.contiguous(i) as usize * self.slot_size();
        let p = self.as_mut_ptr(i);
        // SAFETY: slots `i .. i + contiguous(i)` are free slots of this chunk (between our
        // write position and the consumer's head), adjacent in the slot memory the storage
        // keeps valid while the producer lives; the chunk borrows the producer mutably for
        // the view's lifetime, so nothing else of ours writes or reads them, and a consumer
        // never reads a free slot (a hostile one writing there only spoils what it reads).
        unsafe { crate::ring::bytes::ShmBytesMut::from_raw_parts(p, len) }
    }

    /// Writes `value` at byte `off` of slot `i`, with a volatile store.
    ///
    /// # Panics
    /// If `i >= len`, the value does not lie inside the slot, or `off` is not aligned for `T`
    /// (alignments up to 8).
    #[inline(always)]
    #[track_caller]
    pub fn write_pod<T: Pod>(&mut self, i: u32, off: usize, value: T) {
        check_pod::<T>(i, self.len, off, self.slot_size());
        let p = self.producer.slot(i);
        // SAFETY: slot i is free (i < len: the chunk's slots lie between our write position
        // and the consumer's head) and the value lies inside it, aligned (checked above; slot
        // memory is 8-aligned). A hostile consumer writing there meanwhile only spoils what it
        // reads itself later.
        unsafe { p.add(off).cast::<T>().write_volatile(value) };
    }

    /// Writes `value` at the start of slot `i`, unaligned (for values whose alignment the
    /// slot memory does not promise; not volatile).
    ///
    /// # Panics
    /// If `i >= len` or the value is larger than a slot.
    #[inline(always)]
    #[track_caller]
    pub fn write_unaligned<T: Pod>(&mut self, i: u32, value: T) {
        check_pod::<u8>(i, self.len, 0, self.slot_size());
        if std::mem::size_of::<T>() > self.slot_size() {
            bad_access(i, self.len, 0, std::mem::size_of::<T>());
        }
        let p = self.producer.slot(i);
        // SAFETY: slot i is free (i < len) and holds the value (checked above). A hostile
        // consumer writing there meanwhile only spoils what it reads itself later.
        unsafe { p.cast::<T>().write_unaligned(value) };
    }

    /// Copies `src` to byte `off` of slot `i` and on (through the contiguous slots).
    ///
    /// # Panics
    /// If `src` does not fit in the contiguous slots of the chunk from `i`.
    #[inline]
    pub fn write_bytes(&mut self, i: u32, off: usize, src: &[u8]) {
        let room = self.contiguous(i) as usize * self.slot_size();
        if off.checked_add(src.len()).is_none_or(|end| end > room) {
            bad_access(i, self.len, off, src.len());
        }
        let p = self.as_mut_ptr(i);
        // SAFETY: as in `write_pod`: free slots of this chunk, bounds checked above; `src` is
        // private memory, so the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p.add(off), src.len()) };
    }

    /// Publishes the first `k` slots of the chunk (and every slot staged before) with one
    /// store of `tail`, waking the consumer if it sleeps. Returns whether it was waiting.
    ///
    /// # Panics
    /// If `k > len`.
    #[inline(always)]
    pub fn commit(self, k: u32) -> bool {
        if k > self.len {
            too_many("commit", k, self.len);
        }
        self.producer.commit(k)
    }

    /// Publishes every slot of the chunk: `commit(len)`.
    #[inline]
    #[cfg_attr(not(any(loom, feature = "unstable-internals")), allow(dead_code))]
    pub fn commit_all(self) -> bool {
        let k = self.len;
        self.commit(k)
    }

    /// Marks the first `k` slots of the chunk written without publishing them: the next
    /// commit (or [`Producer::publish`]) publishes them together with its own (a burst with
    /// one store of `tail`). Until then the consumer does not see them.
    ///
    /// # Panics
    /// If `k > len`.
    #[inline(always)]
    pub fn stage(self, k: u32) {
        if k > self.len {
            too_many("stage", k, self.len);
        }
        self.producer.staged += k;
    }
}

impl<'a, S: Storage> ReadChunk<'a, S> {
    #[inline(always)]
    pub(super) fn new(consumer: &'a mut Consumer<S>, len: u32) -> Self {
        ReadChunk { consumer, len }
    }

    /// Number of slots in the chunk.
    #[inline(always)]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the chunk has no slot (nothing published).
    #[inline]
    #[cfg_attr(not(any(loom, feature = "unstable-internals")), allow(dead_code))]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of slots of the chunk from slot `i` on that are adjacent in memory.
    #[inline]
    #[cfg_attr(not(any(loom, feature = "unstable-internals")), allow(dead_code))]
    pub fn contiguous(&self, i: u32) -> u32 {
        if i >= self.len {
            return 0;
        }
        self.consumer.contiguous(i).min(self.len - i)
    }

    /// Bytes per slot.
    #[inline]
    pub fn slot_size(&self) -> usize {
        self.consumer.shape.slot_size as usize
    }

    /// Raw pointer to slot `i` (8-aligned), valid for `contiguous(i) * slot_size` bytes of
    /// reads while the chunk lives. The producer may rewrite that memory at any time (it may
    /// be hostile): read each value once, into a local or a private copy, and validate that.
    ///
    /// # Panics
    /// If `i >= len`.
    #[inline]
    #[track_caller]
    #[cfg_attr(not(any(loom, feature = "unstable-internals")), allow(dead_code))]
    pub fn as_ptr(&self, i: u32) -> *const u8 {
        if i >= self.len {
            bad_access(i, self.len, 0, 0);
        }
        self.consumer.slot(i)
    }

    /// Reads a `T` at byte `off` of slot `i` with one volatile load: a private copy, to
    /// validate before use.
    ///
    /// # Panics
    /// If `i >= len`, the value does not lie inside the slot, or `off` is not aligned for `T`
    /// (alignments up to 8).
    #[inline(always)]
    #[track_caller]
    pub fn read_pod<T: Pod>(&self, i: u32, off: usize) -> T {
        check_pod::<T>(i, self.len, off, self.slot_size());
        let p = self.consumer.slot(i);
        // SAFETY: slot i is published (i < len: the chunk's slots lie between head and the
        // tail we loaded with Acquire), the value lies inside it and is aligned (checked
        // above). The producer may write it concurrently: one volatile read into a local,
        // never re-fetched; T is Pod, so any bytes are a valid T.
        unsafe { p.add(off).cast::<T>().read_volatile() }
    }

    /// Reads a `T` from the start of slot `i`, unaligned: one copy, to validate before use
    /// (for values whose alignment the slot memory does not promise; not volatile).
    ///
    /// # Panics
    /// If `i >= len` or the value is larger than a slot.
    #[inline(always)]
    #[track_caller]
    pub fn read_unaligned<T: Pod>(&self, i: u32) -> T {
        check_pod::<u8>(i, self.len, 0, self.slot_size());
        if std::mem::size_of::<T>() > self.slot_size() {
            bad_access(i, self.len, 0, std::mem::size_of::<T>());
        }
        let p = self.consumer.slot(i);
        // SAFETY: slot i is published (i < len) and holds a T (checked above). T is Pod: any
        // bytes, even ones a hostile producer rewrites during the copy, are a valid T; read
        // once, by value, never through a reference into shared memory.
        unsafe { p.cast::<T>().read_unaligned() }
    }

    /// Gives the first `k` slots of the chunk (and every slot skipped before) back to the
    /// producer with one store of `head`, waking it if it sleeps. Returns whether it was
    /// waiting.
    ///
    /// # Panics
    /// If `k > len`.
    #[inline(always)]
    pub fn release(self, k: u32) -> bool {
        if k > self.len {
            too_many("release", k, self.len);
        }
        self.consumer.release(k)
    }

    /// Releases every slot of the chunk: `release(len)`.
    #[inline]
    pub fn release_all(self) -> bool {
        let k = self.len;
        self.release(k)
    }

    /// Moves the read position past the first `k` slots of the chunk without telling the
    /// producer: the next release publishes them together (one store of `head` per burst).
    ///
    /// # Panics
    /// If `k > len`.
    #[inline(always)]
    pub fn skip(self, k: u32) {
        if k > self.len {
            too_many("skip", k, self.len);
        }
        // SAFETY: k <= len <= the published slots (the chunk's invariant).
        unsafe { self.consumer.skip(k) };
    }
}

#[cfg(not(loom))]
impl<S: Storage> Consumer<S> {
    /// The bytes of the slots from the one `i` positions after our read position up to the
    /// end of the slot array (`contiguous(i) * slot_size` bytes), to read (copies of checked
    /// ranges, see `ring::bytes`). Whether they hold a published record is the caller's
    /// business; the view only promises that the bytes are mapped.
    #[inline]
    pub(crate) fn slot_bytes(&self, i: u32) -> crate::ring::bytes::ShmBytes<'_> {
        let len = self.contiguous(i) as usize * self.shape.slot_size as usize;
        // SAFETY: the slot of position `head + i` and the ones after it up to the end of the
        // slot array lie in the `capacity * slot_size` bytes of slot memory the storage keeps
        // valid while it lives (the `Storage` contract), and `&self` keeps it alive.
        unsafe { crate::ring::bytes::ShmBytes::from_raw_parts(self.slot(i), len) }
    }
}
