//! The channel segment's layout, from the geometry alone: where the channel header, the two
//! rings, the schema region and the pool sit (see the map in `channel/mod.rs`), the record
//! header's kinds, and the ring storage inside a segment.

use std::sync::Arc;

use crate::error::Error;
use crate::link::geometry::{LARGE_OUT, MAX_LARGE_POOL, PAGE, PoolGeom};
use crate::link::segment::Segment;
use crate::ring::{self, RingHeader, RingShape, Storage};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// `kind` of a channel segment.
pub(crate) const KIND_CHANNEL: u32 = 1;
pub(crate) const CHANNEL_HEADER_AT: usize = 128;
pub(crate) const DESC_RING_AT: usize = 256;
pub(crate) const RECORD_HEADER: usize = 16;
/// Largest schema region a channel may carry.
pub(crate) const MAX_SCHEMA: u32 = 1 << 20;
pub(crate) const REC_PAD: u32 = 1;
pub(crate) const REC_INLINE: u32 = 2;
pub(crate) const REC_BLOCK: u32 = 3;
/// A completion-ring entry with this bit set is not a block index but a note "the records at
/// descriptor positions `[low 32 bits, + bits 32..62)` were dropped unread" (corrupt): the
/// producer takes back every block still out with them.
pub(crate) const DROPPED_MARK: u64 = 1 << 63;

/// The shared part of a channel, after the segment header. Every field is an atomic: the
/// peer may write any of them at any time, so each is read once (into a local) and validated.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct ChannelHeader {
    pub(crate) slots: AtomicU32,
    pub(crate) slot_size: AtomicU32,
    pub(crate) blocks: AtomicU32,
    pub(crate) comp_slots: AtomicU32,
    pub(crate) block_size: AtomicU64,
    /// Set (SeqCst) by the producer when it closes; the consumer drains, then disconnects.
    pub(crate) producer_closed: AtomicU32,
    /// Set (SeqCst) by the consumer when it closes.
    pub(crate) consumer_closed: AtomicU32,
    /// The attached consumer, claimed with one CAS from 0 (or from a dead consumer's word) by
    /// `Receiver::attach`: its pid in the high 32 bits, the low 32 bits of its start time
    /// (clock ticks since boot) in the low 32 bits; 0 if none; `claim::RECLAIMING` while the
    /// producer takes back a dead consumer's blocks. One word, so a producer never pairs one
    /// process's pid with another's start time. See `claim.rs`.
    pub(crate) consumer: AtomicU64,
    /// Bytes of the channel's schema region (0: no schema, self-describing messages). Read
    /// once at open; the layout places the region from it (see [`Layout::new`]).
    pub(crate) schema_len: AtomicU32,
    pub(crate) _reserved: AtomicU32,
    /// Bytes of the pool's large size class (0: none). Read once at open; the layout places
    /// the area from it after the blocks (see [`Layout::new`]).
    pub(crate) large_pool: AtomicU64,
}
const _: () = assert!(std::mem::size_of::<ChannelHeader>() == 56);
const _: () = assert!(CHANNEL_HEADER_AT + std::mem::size_of::<ChannelHeader>() <= DESC_RING_AT);

/// Offsets of every region, computed from the geometry alone (so both sides agree, and the
/// consumer can check the segment against it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) desc: RingShape,
    pub(crate) comp: RingShape,
    pub(crate) desc_slots: usize,
    pub(crate) comp_ring: usize,
    pub(crate) comp_slots: usize,
    /// The schema region: `schema_len` bytes at `schema`.
    pub(crate) schema: usize,
    pub(crate) schema_len: usize,
    pub(crate) pool: PoolGeom,
    pub(crate) total: usize,
}

pub(crate) const fn align_up(x: usize, a: usize) -> usize {
    (x + a - 1) & !(a - 1)
}

/// Body lengths travel as u32: a block, and a quarter of the ring (the largest inline body),
/// must stay below 4 GiB.
const MAX_BLOCK: usize = (1 << 32) - 64;

impl Layout {
    /// The layout of a channel; `schema_len` bytes of schema (0 for none) sit between the
    /// completion ring and the pool, so a channel without a schema keeps the same offsets.
    pub(crate) fn new(
        slots: u32,
        slot_size: u32,
        blocks: u32,
        block_size: usize,
        schema_len: u32,
        large_pool: usize,
    ) -> Result<Layout, Error> {
        check_geometry(slots, slot_size, blocks, block_size, schema_len, large_pool)?;
        // Without blocks the block size means nothing: normalise it (both sides agree).
        let block_size = if blocks == 0 {
            64
        } else {
            align_up(block_size, 64)
        };
        let desc = RingShape {
            capacity: slots,
            slot_size,
        };
        let large_out = if large_pool > 0 { LARGE_OUT } else { 0 };
        // Room for every block index and every large extent at once, plus as many "records
        // dropped" notes.
        let comp = RingShape {
            capacity: (blocks.max(1) + large_out).next_power_of_two() * 2,
            slot_size: 8,
        };
        let desc_slots = DESC_RING_AT + std::mem::size_of::<RingHeader>();
        let comp_ring = align_up(desc_slots + desc.bytes(), 128);
        let comp_slots = comp_ring + std::mem::size_of::<RingHeader>();
        let schema = align_up(comp_slots + comp.bytes(), 64);
        let pool_off = align_up(schema + schema_len as usize, 4096);
        let (large_off, total) = pool_end(pool_off, blocks, block_size, large_pool)?;
        Ok(Layout {
            desc,
            comp,
            desc_slots,
            comp_ring,
            comp_slots,
            schema,
            schema_len: schema_len as usize,
            pool: PoolGeom {
                off: pool_off,
                block_size,
                blocks,
                large_off,
                large_len: large_pool,
            },
            total,
        })
    }
}

/// Refuses a geometry [`Layout::new`] cannot place, naming the first bad parameter.
fn check_geometry(
    slots: u32,
    slot_size: u32,
    blocks: u32,
    block_size: usize,
    schema_len: u32,
    large_pool: usize,
) -> Result<(), Error> {
    let bad = |why: String| Err(Error::InvalidArgument(why));
    if !slots.is_power_of_two() || !(2..=1 << 20).contains(&slots) {
        return bad(format!(
            "slots = {slots}: use a power of two from 2 to 2^20"
        ));
    }
    if !slot_size.is_multiple_of(64) || !(64..=65536).contains(&slot_size) {
        return bad(format!(
            "slot_size = {slot_size}: use a multiple of 64 from 64 to 65536"
        ));
    }
    if blocks > 1 << 20 {
        return bad(format!("blocks = {blocks}: at most 2^20"));
    }
    if blocks > 0 && !(64..=MAX_BLOCK).contains(&block_size) {
        return bad(format!(
            "block_size = {block_size}: from 64 bytes to 4 GiB - 64 ({MAX_BLOCK})"
        ));
    }
    let desc = RingShape {
        capacity: slots,
        slot_size,
    };
    if desc.bytes() > 1 << 32 {
        return bad(format!(
            "slots x slot_size = {slots} x {slot_size}: at most 4 GiB"
        ));
    }
    if large_pool > 0
        && (blocks == 0 || !large_pool.is_multiple_of(PAGE) || large_pool > MAX_LARGE_POOL)
    {
        return bad(format!(
            "large_pool = {large_pool}: a multiple of {PAGE} up to {MAX_LARGE_POOL}, and only \
             with blocks > 0"
        ));
    }
    if schema_len > MAX_SCHEMA {
        return bad(format!(
            "schema of {schema_len} bytes: at most {MAX_SCHEMA} (fewer or shorter field names)"
        ));
    }
    Ok(())
}

/// Where the pool's regions end, the pool starting at `pool_off`: `blocks` blocks of
/// `block_size`, then the large size class, page-aligned. Returns the large area's offset and
/// the segment's total size; [`Error::InvalidArgument`] if either overflows.
fn pool_end(
    pool_off: usize,
    blocks: u32,
    block_size: usize,
    large_pool: usize,
) -> Result<(usize, usize), Error> {
    let pool_end = (blocks as usize)
        .checked_mul(block_size)
        .and_then(|p| p.checked_add(pool_off))
        .ok_or_else(|| Error::InvalidArgument("pool size overflows".into()))?;
    // The large size class: `large_pool` bytes of address space, page-aligned, after the
    // blocks. Its extents are named by block indices `blocks + page` (below 2^32 - 2:
    // blocks <= 2^20 and pages <= 2^28).
    let large_off = align_up(pool_end, PAGE);
    let total = large_off
        .checked_add(large_pool)
        .ok_or_else(|| Error::InvalidArgument("pool size overflows".into()))?;
    Ok((large_off, total))
}

/// A ring inside a channel segment: made only by [`ShmRing::producer`] /
/// [`ShmRing::consumer`], which check that its header and slots (for the shape the ring end
/// is attached with) lie inside the segment, aligned.
#[derive(Debug)]
pub(crate) struct ShmRing {
    seg: Arc<Segment>,
    /// Offset of the ring header: 128-aligned, `size_of::<RingHeader>()` bytes inside `seg`.
    header: usize,
    /// Offset of the slots: 8-aligned, `capacity * slot_size` bytes inside `seg`.
    slots: usize,
}

impl ShmRing {
    /// The ring of `shape` with its header at `header` and its slots at `slots` in `seg`.
    fn new(
        seg: &Arc<Segment>,
        header: usize,
        slots: usize,
        shape: RingShape,
    ) -> Result<ShmRing, Error> {
        let len = seg.len();
        let slot_bytes = (shape.capacity as usize).checked_mul(shape.slot_size as usize);
        let fits = |at: usize, n: Option<usize>| {
            n.and_then(|n| at.checked_add(n))
                .is_some_and(|end| end <= len)
        };
        if !shape.is_valid()
            || !header.is_multiple_of(std::mem::align_of::<RingHeader>())
            || !fits(header, Some(std::mem::size_of::<RingHeader>()))
            || !slots.is_multiple_of(8)
            || !fits(slots, slot_bytes)
        {
            return Err(crate::error::corrupt(format!(
                "a ring of {shape:?} with its header at {header} and slots at {slots} does not \
                 lie in a segment of {len} bytes"
            )));
        }
        Ok(ShmRing {
            seg: seg.clone(),
            header,
            slots,
        })
    }

    /// The producer end of the ring of `shape` at `header` / `slots` in `seg`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the ring does not lie inside the segment, aligned, or the shape
    /// is invalid.
    pub(crate) fn producer(
        seg: &Arc<Segment>,
        header: usize,
        slots: usize,
        shape: RingShape,
    ) -> Result<ring::Producer<ShmRing>, Error> {
        Ok(ring::Producer::attach(
            Self::new(seg, header, slots, shape)?,
            shape,
        ))
    }

    /// The consumer end of the ring of `shape` at `header` / `slots` in `seg`, reading on
    /// from the ring's `head`.
    ///
    /// # Errors
    /// As [`ShmRing::producer`].
    pub(crate) fn consumer(
        seg: &Arc<Segment>,
        header: usize,
        slots: usize,
        shape: RingShape,
    ) -> Result<ring::Consumer<ShmRing>, Error> {
        let ring = Self::new(seg, header, slots, shape)?;
        // SYNC POINT (Acquire): pairs with the last Release store of the ring's head by the
        // consumer before us (a dead one we took over from, or the producer's reset after a
        // reclaim): we read on from there.
        let _ = ring.header().head.0.load(Ordering::Acquire);
        Ok(ring::Consumer::attach(ring, shape))
    }

    /// The segment the ring lies in.
    pub(crate) fn segment(&self) -> &Segment {
        &self.seg
    }
}

// SAFETY: `ShmRing::new` checked that the header (128-aligned) and the slots (8-aligned,
// capacity * slot_size bytes, for the shape the ring end is attached with: `producer` and
// `consumer` attach with the shape they checked) lie inside the segment; the Arc keeps the
// mapping alive as long as this storage exists.
unsafe impl Storage for ShmRing {
    fn header(&self) -> &RingHeader {
        // SAFETY: see the impl: in bounds and aligned. RingHeader is atomics only, so a peer
        // storing any value at any time is no data race; the ring validates every index it
        // loads (a distance beyond the capacity is `RingError::Corrupt`).
        unsafe { &*self.seg.as_ptr().add(self.header).cast::<RingHeader>() }
    }
    fn slots(&self) -> *mut u8 {
        self.seg.as_ptr().wrapping_add(self.slots)
    }
    fn slots_len(&self) -> usize {
        // `new` checked that the slots start inside the segment.
        self.seg.len() - self.slots
    }
}

/// The channel header of `seg`.
///
/// # Panics
/// If `seg` is too small to hold one (no channel segment is: checked at open and creation).
#[inline]
pub(crate) fn channel_header(seg: &Segment) -> &ChannelHeader {
    if seg.len() < CHANNEL_HEADER_AT + std::mem::size_of::<ChannelHeader>() {
        too_small_for_a_header(seg.len());
    }
    // SAFETY: the header lies inside the mapping (checked above), which lives as long as
    // `seg`, and the offset is 128-aligned (the mapping is page-aligned). Every field is an atomic, so a peer
    // writing any of them at any time is not a data race: we only ever load and store them
    // (each value read once and validated by its user), never take a plain reference inside.
    unsafe { &*seg.as_ptr().add(CHANNEL_HEADER_AT).cast::<ChannelHeader>() }
}

#[cold]
#[inline(never)]
fn too_small_for_a_header(len: usize) -> ! {
    panic!("a segment of {len} bytes is too small for a channel header")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `channel_header` is a safe function of any `&Segment`: on a segment too small to hold
    /// the header (a plain `Segment::anonymous(64)`) it must refuse, not hand out a
    /// reference past the end of the segment.
    #[test]
    fn a_ring_outside_its_segment_is_refused() {
        let seg = Arc::new(Segment::anonymous(8192).expect("anonymous segment"));
        let shape = RingShape {
            capacity: 8,
            slot_size: 64,
        };
        assert!(ShmRing::producer(&seg, DESC_RING_AT, 1024, shape).is_ok());
        assert!(ShmRing::consumer(&seg, DESC_RING_AT, 1024, shape).is_ok());
        // Slots past the end, a header past the end, misaligned, an invalid shape.
        assert!(ShmRing::producer(&seg, DESC_RING_AT, 8192 - 256, shape).is_err());
        assert!(ShmRing::consumer(&seg, 8192 - 128, 1024, shape).is_err());
        assert!(ShmRing::producer(&seg, DESC_RING_AT + 8, 1024, shape).is_err());
        assert!(ShmRing::producer(&seg, DESC_RING_AT, 1028, shape).is_err());
        assert!(ShmRing::producer(&seg, DESC_RING_AT, usize::MAX - 8, shape).is_err());
        let bad = RingShape {
            capacity: 3,
            slot_size: 64,
        };
        assert!(ShmRing::consumer(&seg, DESC_RING_AT, 1024, bad).is_err());
    }

    #[test]
    #[should_panic(expected = "too small for a channel header")]
    fn a_segment_too_small_for_a_channel_header_is_refused() {
        let seg = Segment::anonymous(64).expect("anonymous segment");
        let _ = channel_header(&seg);
    }
}
