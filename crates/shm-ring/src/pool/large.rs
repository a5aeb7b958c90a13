//! The pool's large size class: extents of any size, carved from an area of address space
//! ([`ChannelConfig::large_pool`](crate::ChannelConfig::large_pool)) that costs nothing until
//! used. Producer-local bookkeeping, like the block allocator in `alloc.rs`, which routes every
//! block index at or above the block count here.
//!
//! An extent is a run of pages `[start, start + pages)` of the area, named in messages and on
//! the completion ring by the block index `first + start` (`first` = the channel's block
//! count). It is in exactly one of three states:
//! - a *hole*: free address space whose pages are not reserved (`holes`, coalesced);
//! - *out*: loaned to producer code or in flight with a record (`out`, at most [`LARGE_OUT`]);
//! - *warm*: free, its pages still reserved so the next large item of about its size reuses
//!   them without faulting fresh pages in (measured: a 4 MiB copy into fresh pages costs
//!   ~20x one into reserved pages on the 2-core VM, docs/pipeline.md).
//!
//! Warm extents free for [`LARGE_KEEP`](crate::LARGE_KEEP) are punched back into holes
//! (`fallocate(PUNCH_HOLE)`), so the memory a channel holds returns to its blocks' once large
//! items stop. Every index the consumer returns is checked against `out` (a double free or a
//! hostile consumer is [`Error::Corrupt`], never a second free).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::error::{Error, corrupt};
use crate::link::segment::Segment;

pub use crate::link::geometry::MAX_LARGE_POOL;
pub(crate) use crate::link::geometry::{LARGE_OUT, PAGE};

/// Most bytes of extents of the large size class a producer has out at once (in flight or
/// loaned), unless a single item is larger: then it goes alone, once at most half of this
/// is out. A consumer that keeps messages should keep at most half of this in extents
/// ([`Message::leased_large_bytes`](crate::Message::leased_large_bytes)), copying the rest:
/// the producer then always finds room for its next item. Bounds what a producer far ahead of a slow consumer holds.
pub const LARGE_IN_FLIGHT: usize = 64 << 20;

/// A run of pages of the area and how many of its bytes (from its start) are reserved.
#[derive(Debug, Clone, Copy)]
struct Extent {
    start: u32,
    pages: u32,
    committed: usize,
}

/// An extent handed out.
#[derive(Debug)]
struct Out {
    ext: Extent,
    /// When it was handed out: its last use, once it is back (the producer learns of returns
    /// only when it looks, so the time of the return itself is unknown).
    since: Instant,
    /// Sent with the record at this descriptor position (None: loaned, or allocated for a
    /// message not staged yet).
    owner: Option<u32>,
}

/// The producer's allocator of the large size class.
#[derive(Debug)]
pub(crate) struct LargePool {
    /// Offset of the area in the segment.
    off: usize,
    /// Pages of the area.
    pages: u32,
    /// Block index of the area's page 0 (the channel's block count).
    first: u32,
    /// Free, unreserved runs: start page -> pages; never two adjacent ones.
    holes: BTreeMap<u32, u32>,
    /// Free extents still reserved, each with the instant it was last handed out.
    warm: Vec<(Extent, Instant)>,
    /// Extents loaned or in flight (at most [`LARGE_OUT`]).
    out: Vec<Out>,
    /// Bytes of the extents in `out`.
    out_bytes: usize,
    /// Bytes of the extents taken for the message being written (see [`LargePool::new_message`]).
    msg_bytes: usize,
    /// Bytes reserved in out and warm extents.
    committed: usize,
}

const fn pages_for(len: usize) -> usize {
    len.div_ceil(PAGE)
}

impl LargePool {
    /// The allocator of an area of `len` bytes at `off`, whose page 0 is block index `first`.
    pub(crate) fn new(off: usize, len: usize, first: u32) -> LargePool {
        let pages = (len / PAGE) as u32;
        let mut holes = BTreeMap::new();
        if pages > 0 {
            holes.insert(0, pages);
        }
        LargePool {
            off,
            pages,
            first,
            holes,
            warm: Vec::new(),
            out: Vec::new(),
            out_bytes: 0,
            msg_bytes: 0,
            committed: 0,
        }
    }

    /// Bytes of the area: the largest extent there can be.
    pub(crate) fn capacity(&self) -> usize {
        self.pages as usize * PAGE
    }

    /// Whether anything is out or reserved (so returns and trims are worth looking at).
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.committed > 0 || !self.out.is_empty()
    }

    /// Bytes reserved for extents (out or warm).
    pub(crate) fn committed(&self) -> usize {
        self.committed
    }

    /// Whether block index `idx` names this area (rather than a block).
    #[inline]
    pub(crate) fn owns(&self, idx: u32) -> bool {
        idx >= self.first
    }

    /// The bytes an extent handed out as `idx` holds, if it is out.
    pub(crate) fn capacity_of(&self, idx: u32) -> Option<usize> {
        self.find(idx)
            .map(|i| self.out[i].ext.pages as usize * PAGE)
    }

    fn find(&self, idx: u32) -> Option<usize> {
        let start = idx.checked_sub(self.first)?;
        self.out.iter().position(|o| o.ext.start == start)
    }

    /// An extent of at least `len` bytes with its first `len` bytes reserved, without waiting:
    /// a warm one of about that size, else fresh address space (punching warm extents back
    /// into holes if the space is fragmented). `Ok(None)`: [`LARGE_OUT`] extents are out, or
    /// the area has no room until some come back.
    ///
    /// # Errors
    /// [`Error::NoSpace`] when the pages cannot be reserved (the extent goes back).
    pub(crate) fn try_alloc(&mut self, seg: &Segment, len: usize) -> Result<Option<u32>, Error> {
        if self.out.len() >= LARGE_OUT as usize {
            return Ok(None);
        }
        // At most LARGE_IN_FLIGHT bytes out, or a message of any size while at most half of
        // that is out besides it (what a consumer may keep): the producer never runs far
        // ahead of a slow consumer with large items, and always finds room for its next one.
        let bytes = pages_for(len.max(1)) * PAGE;
        let others = self.out_bytes - self.msg_bytes;
        if self.out_bytes + bytes > LARGE_IN_FLIGHT && others > LARGE_IN_FLIGHT / 2 {
            return Ok(None);
        }
        let need = pages_for(len.max(1));
        if need > self.pages as usize {
            return Ok(None);
        }
        let need = need as u32;
        let ext = match self.take_warm(need) {
            Some(e) => e,
            None => match self.carve(need) {
                Some(e) => e,
                None if !self.warm.is_empty() => {
                    self.trim(seg, None);
                    match self.carve(need) {
                        Some(e) => e,
                        None => return Ok(None),
                    }
                }
                None => return Ok(None),
            },
        };
        let mut ext = ext;
        let want = pages_for(len) * PAGE;
        if want > ext.committed {
            let at = self.off + ext.start as usize * PAGE;
            if let Err(e) = seg.commit(at + ext.committed, want - ext.committed) {
                self.free_warm(ext, Instant::now());
                return Err(e);
            }
            self.committed += want - ext.committed;
            ext.committed = want;
        }
        self.out_bytes += ext.pages as usize * PAGE;
        self.msg_bytes += ext.pages as usize * PAGE;
        self.out.push(Out {
            ext,
            since: Instant::now(),
            owner: None,
        });
        Ok(Some(self.first + ext.start))
    }

    /// The smallest warm extent of `need` pages or more, if it wastes little: at most twice
    /// the need plus 1 MiB (a one-off huge extent is not kept busy by small items). Of equal
    /// ones, the last to come back (LIFO, as the block free list: its pages are the likeliest
    /// to be still in cache).
    fn take_warm(&mut self, need: u32) -> Option<Extent> {
        let slack = need
            .saturating_mul(2)
            .saturating_add((1 << 20) / PAGE as u32);
        let i = self
            .warm
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, (e, _))| e.pages >= need && e.pages <= slack)
            .min_by_key(|(_, (e, _))| e.pages)
            .map(|(i, _)| i)?;
        Some(self.warm.remove(i).0)
    }

    /// `need` pages of fresh address space (first fit), nothing reserved yet.
    fn carve(&mut self, need: u32) -> Option<Extent> {
        let (&start, &pages) = self.holes.iter().find(|&(_, &p)| p >= need)?;
        self.holes.remove(&start);
        if pages > need {
            self.holes.insert(start + need, pages - need);
        }
        Some(Extent {
            start,
            pages: need,
            committed: 0,
        })
    }

    /// Adds a free run to the holes, merged with its neighbours.
    fn hole(&mut self, mut start: u32, mut pages: u32) {
        if let Some((&s, &p)) = self.holes.range(..start).next_back()
            && s + p == start
        {
            self.holes.remove(&s);
            start = s;
            pages += p;
        }
        if let Some(p) = self.holes.remove(&(start + pages)) {
            pages += p;
        }
        self.holes.insert(start, pages);
    }

    /// A free extent, last handed out at `since`: warm if it holds reserved pages.
    fn free_warm(&mut self, ext: Extent, since: Instant) {
        if ext.committed == 0 {
            self.hole(ext.start, ext.pages);
        } else {
            self.warm.push((ext, since));
        }
    }

    fn take_out(&mut self, i: usize) {
        let o = self.out.swap_remove(i);
        self.out_bytes -= o.ext.pages as usize * PAGE;
        self.msg_bytes = self.msg_bytes.min(self.out_bytes);
        self.free_warm(o.ext, o.since);
    }

    /// The extents taken from now on belong to a new message (or loan): those of earlier
    /// ones count against [`LARGE_IN_FLIGHT`], its own do not hold it back.
    pub(crate) fn new_message(&mut self) {
        self.msg_bytes = 0;
    }

    /// Extent `idx` went out with the record at descriptor position `pos`.
    pub(crate) fn sent(&mut self, idx: u32, pos: u32) {
        if let Some(i) = self.find(idx) {
            self.out[i].owner = Some(pos);
        }
    }

    /// Extent `idx` comes back: from the consumer (`in_flight`: it must have been sent), or as
    /// a loan dropped unsent / an allocation for a message that was not staged.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if it is not out (or, from the consumer, not in flight): a double
    /// free or a hostile consumer. Nothing changes then.
    pub(crate) fn back(&mut self, idx: u32, in_flight: bool) -> Result<(), Error> {
        let i = self
            .find(idx)
            .filter(|&i| !in_flight || self.out[i].owner.is_some())
            .ok_or_else(|| {
                corrupt(format!(
                    "consumer returned large extent {idx}, which is not in flight"
                ))
            })?;
        self.take_out(i);
        Ok(())
    }

    /// The consumer dropped the records at positions `[from, from + n)` unread: every extent
    /// still out with one of them comes back.
    pub(crate) fn dropped(&mut self, from: u32, n: u32) {
        let mut i = 0;
        while i < self.out.len() {
            match self.out[i].owner {
                Some(pos) if pos.wrapping_sub(from) < n => self.take_out(i),
                _ => i += 1,
            }
        }
    }

    /// Takes back every extent in flight (the consumer is gone); returns how many.
    pub(crate) fn reclaim_all(&mut self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.out.len() {
            if self.out[i].owner.is_some() {
                self.take_out(i);
                n += 1;
            } else {
                i += 1;
            }
        }
        n
    }

    /// Gives back the pages of warm extents last handed out at least `keep` ago (all of them
    /// for `None`): punched holes, address space only again.
    pub(crate) fn trim(&mut self, seg: &Segment, keep: Option<Duration>) {
        if self.warm.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut i = 0;
        while i < self.warm.len() {
            let (ext, since) = self.warm[i];
            if keep.is_some_and(|k| now.duration_since(since) < k) {
                i += 1;
                continue;
            }
            let at = self.off + ext.start as usize * PAGE;
            if seg.decommit(at, ext.committed).is_err() {
                // Still reserved: try again at the next trim.
                self.warm[i].1 = now;
                i += 1;
                continue;
            }
            self.warm.swap_remove(i);
            self.committed -= ext.committed;
            self.hole(ext.start, ext.pages);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area(pages: u32) -> (Segment, LargePool) {
        let len = pages as usize * PAGE;
        let seg = Segment::anonymous_reserving("large-test", PAGE + len, PAGE).unwrap();
        (seg, LargePool::new(PAGE, len, 10))
    }

    #[test]
    fn extents_are_reused_warm_then_punched_back_into_one_hole() {
        let (seg, mut l) = area(64);
        let a = l.try_alloc(&seg, 3 * PAGE + 1).unwrap().unwrap();
        let b = l.try_alloc(&seg, PAGE).unwrap().unwrap();
        assert_eq!((a, b), (10, 14));
        assert_eq!(l.committed(), 5 * PAGE);
        l.sent(a, 7);
        assert!(l.back(a, true).is_ok());
        assert!(l.back(a, true).is_err(), "a double free is refused");
        // The warm extent of 4 pages serves the next item of about its size.
        assert_eq!(l.try_alloc(&seg, 2 * PAGE).unwrap(), Some(a));
        assert_eq!(l.committed(), 5 * PAGE);
        l.back(a, false).unwrap();
        l.back(b, false).unwrap();
        l.trim(&seg, Some(Duration::from_secs(60)));
        assert_eq!(l.committed(), 5 * PAGE, "kept while recent");
        l.trim(&seg, None);
        assert_eq!(l.committed(), 0);
        assert_eq!(l.holes.len(), 1, "{:?}", l.holes);
        assert!(!l.active());
        // The whole area is one run again.
        assert_eq!(l.try_alloc(&seg, 64 * PAGE).unwrap(), Some(10));
    }

    #[test]
    fn indices_not_out_or_not_in_flight_are_corrupt() {
        let (seg, mut l) = area(8);
        let a = l.try_alloc(&seg, PAGE).unwrap().unwrap();
        assert!(l.back(a, true).is_err(), "loaned, not in flight");
        for bogus in [0, 9, a + 1, u32::MAX] {
            assert!(l.back(bogus, true).is_err(), "{bogus}");
        }
        l.sent(a, 3);
        l.dropped(3, 1);
        assert!(l.out.is_empty());
    }

    #[test]
    fn at_most_large_out_extents_and_no_room_is_none() {
        let (seg, mut l) = area(LARGE_OUT + 8);
        for _ in 0..LARGE_OUT {
            assert!(l.try_alloc(&seg, 1).unwrap().is_some());
        }
        assert_eq!(l.try_alloc(&seg, 1).unwrap(), None);
        let (seg, mut l) = area(8);
        assert_eq!(l.try_alloc(&seg, 9 * PAGE).unwrap(), None);
        let x = l.try_alloc(&seg, 6 * PAGE).unwrap().unwrap();
        assert_eq!(l.try_alloc(&seg, 3 * PAGE).unwrap(), None, "no room: wait");
        l.back(x, false).unwrap();
        // A warm extent far larger than the need is not reused but punched to make room.
        let (seg, mut l) = area(600);
        let x = l.try_alloc(&seg, 550 * PAGE).unwrap().unwrap();
        l.back(x, false).unwrap();
        assert_eq!(l.committed(), 550 * PAGE);
        let y = l.try_alloc(&seg, 100 * PAGE).unwrap().unwrap();
        assert_eq!((y, l.committed()), (10, 100 * PAGE));
    }
}
