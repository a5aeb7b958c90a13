//! The producer's pool allocator: which block is free, loaned, or in flight, and taking back
//! the blocks the consumer returns through the completion ring.
//!
//! Only the producer allocates. Its free list is process-local (a LIFO stack, so the few
//! blocks a steady stream needs stay warm in cache). A block's pages are committed (reserved
//! with `fallocate`) when it is handed out for more bytes than it ever held, and never-used
//! blocks are taken only when no used block is free: the memory a channel holds follows the
//! most bytes it ever had out at once (page-rounded per block), not the pool's size. A block is in exactly one of four states:
//! never used (at or above the high-water mark `fresh`), free (on the list), loaned to producer
//! code (an `ArrayLoan*` holds it), or in flight (sent with the record at descriptor position
//! `owner[b]`, and not yet returned). The consumer hands indices back through the completion
//! ring; an index that is not in flight is corrupt (a double free, or a hostile consumer) and
//! is never freed twice. A completion entry with [`DROPPED_MARK`] set names records the
//! consumer dropped unread: every block still out with one of them comes back.

use std::sync::Arc;

use crate::error::{Error, corrupt};
use crate::link::claim::DeadConsumer;
use crate::link::layout::{DROPPED_MARK, ShmRing};
use crate::pool::PoolHome;
use crate::pool::large::LargePool;
use crate::pool::large::PAGE;
use crate::ring;
use crate::ring::bytes::ShmBytesMut;
use crate::sync::AtomicU32;

/// The producer's block allocator and the consumer end of the completion ring.
#[derive(Debug)]
pub(crate) struct BlockPool {
    home: Arc<PoolHome>,
    comp: ring::Consumer<ShmRing>,
    /// Free blocks that were handed out before (LIFO).
    free: Vec<u32>,
    /// Blocks `fresh..blocks` were never handed out; `0..fresh` were, at least once.
    fresh: u32,
    /// `committed[b]`: bytes at the start of block `b` whose pages are reserved (the most it
    /// ever had to hold, rounded up to a page, at most a block).
    committed: Vec<usize>,
    /// `in_flight[b]`: block `b` went out with a message and has not come back.
    in_flight: Vec<bool>,
    /// `owner[b]`: descriptor position of the record block `b` went out with (so blocks of
    /// records the consumer had to drop unread can come back).
    owner: Vec<u32>,
    /// The large size class (block indices from `blocks` on), if the channel has one.
    large: Option<LargePool>,
}

impl BlockPool {
    pub(crate) fn new(home: Arc<PoolHome>, comp: ring::Consumer<ShmRing>) -> BlockPool {
        let blocks = home.geom.blocks as usize;
        let g = home.geom;
        let large = (g.large_len > 0).then(|| LargePool::new(g.large_off, g.large_len, g.blocks));
        BlockPool {
            home,
            comp,
            free: Vec::with_capacity(blocks),
            fresh: 0,
            committed: vec![0; blocks],
            in_flight: vec![false; blocks],
            owner: vec![0; blocks],
            large,
        }
    }

    /// Bytes of the large size class's area (0: none): the largest array or body it takes.
    pub(crate) fn large_capacity(&self) -> usize {
        self.large.as_ref().map_or(0, LargePool::capacity)
    }

    /// Bytes reserved for extents of the large size class (in flight, loaned or warm).
    pub(crate) fn large_committed(&self) -> usize {
        self.large.as_ref().map_or(0, LargePool::committed)
    }

    /// Extents taken from now on belong to a new message or loan (see `LargePool`).
    #[inline]
    pub(crate) fn new_message(&mut self) {
        if let Some(l) = &mut self.large {
            l.new_message();
        }
    }

    /// Whether extents of the large size class are out or reserved.
    #[inline]
    pub(crate) fn large_active(&self) -> bool {
        self.large.as_ref().is_some_and(LargePool::active)
    }

    /// Takes back what the consumer returned and gives back the pages of extents free for
    /// at least `keep` (all for `None`).
    ///
    /// # Errors
    /// As [`BlockPool::collect_returns`].
    pub(crate) fn trim(&mut self, keep: Option<std::time::Duration>) -> Result<(), Error> {
        self.collect_returns()?;
        if let Some(l) = &mut self.large {
            l.trim(&self.home.seg, keep);
        }
        Ok(())
    }

    /// The pool as loans see it.
    pub(crate) fn home(&self) -> &Arc<PoolHome> {
        &self.home
    }

    /// Blocks that can be handed out right now without waiting (free or never used).
    pub(crate) fn available(&self) -> usize {
        self.free.len() + (self.home.geom.blocks - self.fresh) as usize
    }

    /// A block for the producer to hold `len` bytes, without waiting: a free one (the most
    /// recently returned first), else whatever the consumer returned meanwhile, else a
    /// never-used one. `Ok(None)`: every block is out.
    ///
    /// # Errors
    /// [`Error::Corrupt`] from the completion ring; [`Error::NoSpace`] if the block's pages
    /// for `len` bytes cannot be reserved (memory used up: the pool cannot grow past what it
    /// holds now; the block stays free).
    #[inline]
    pub(crate) fn try_alloc(&mut self, len: usize) -> Result<Option<u32>, Error> {
        if len > self.home.geom.block_size {
            return self.try_alloc_large(len);
        }
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                self.collect_returns()?;
                match self.free.pop() {
                    Some(b) => b,
                    None if self.fresh < self.home.geom.blocks => {
                        let b = self.fresh;
                        self.commit(b, len)?;
                        self.fresh += 1;
                        return Ok(Some(b));
                    }
                    None => return Ok(None),
                }
            }
        };
        if let Err(e) = self.commit(b, len) {
            self.free.push(b);
            return Err(e);
        }
        Ok(Some(b))
    }

    /// An extent of the large size class for `len` bytes (more than a block), without
    /// waiting: returns are taken first, so warm extents come back for reuse.
    #[cold]
    fn try_alloc_large(&mut self, len: usize) -> Result<Option<u32>, Error> {
        self.collect_returns()?;
        match &mut self.large {
            Some(l) => l.try_alloc(&self.home.seg, len),
            None => Err(Error::TooLarge {
                what: "array or body (the channel has no large pool)",
                needed: len,
                limit: self.home.geom.block_size,
                setting: crate::error::BLOCK_OR_LARGE_POOL,
            }),
        }
    }

    /// Makes sure the first `len` bytes of block `b` are reserved: first use, or a longer use
    /// than before, reserves the missing pages now (so exhausted memory is an error here, never
    /// a SIGBUS when the block is written). A block holding a 16-float batch costs a page,
    /// not a whole block.
    #[inline]
    fn commit(&mut self, b: u32, len: usize) -> Result<(), Error> {
        let g = &self.home.geom;
        let have = self.committed[b as usize];
        if len <= have {
            return Ok(());
        }
        let want = len.next_multiple_of(PAGE).min(g.block_size);
        let at = g.off + b as usize * g.block_size;
        self.home.seg.commit(at + have, want - have)?;
        self.committed[b as usize] = want;
        Ok(())
    }

    /// Puts blocks taken for a message that was not sent back on the free list.
    pub(crate) fn unsent(&mut self, blocks: &[u32]) {
        for &b in blocks {
            self.give_back(b);
        }
    }

    /// A block or extent that was never sent (or a dropped loan's) is free again.
    fn give_back(&mut self, b: u32) {
        match &mut self.large {
            Some(l) if l.owns(b) => {
                let _ = l.back(b, false);
            }
            _ => self.free.push(b),
        }
    }

    /// Block `b` went out with the record at descriptor position `pos`.
    #[inline]
    pub(crate) fn sent(&mut self, b: u32, pos: u32) {
        match &mut self.large {
            Some(l) if l.owns(b) => l.sent(b, pos),
            _ => {
                self.in_flight[b as usize] = true;
                self.owner[b as usize] = pos;
            }
        }
    }

    /// Copies `src` to the start of block `b`, which must be ours (just allocated).
    ///
    /// # Panics
    /// As [`BlockPool::block_mut`].
    pub(crate) fn write_block(&mut self, b: u32, src: &[u8]) {
        self.block_mut(b, src.len()).write_from(0, src);
    }

    /// The first `len` bytes of block (or extent) `b`, to write: a block this sender just
    /// allocated for them (not loaned, not yet sent).
    ///
    /// # Panics
    /// If `b` is out of range or in flight, or `len` exceeds it.
    pub(crate) fn block_mut(&mut self, b: u32, len: usize) -> ShmBytesMut<'_> {
        let (room, in_flight) = match &self.large {
            Some(l) if l.owns(b) => (l.capacity_of(b).unwrap_or(0), false),
            _ if b < self.home.geom.blocks => {
                (self.home.geom.block_size, self.in_flight[b as usize])
            }
            _ => (0, false),
        };
        assert!(
            len <= room && !in_flight,
            "block {b} holds {room} bytes, not {len}, or is in flight ({in_flight})"
        );
        let at = self.home.geom.locate(u64::from(b), len as u64);
        let at = at.unwrap_or_else(|| panic!("block {b} of {len} bytes outside the pool"));
        // SAFETY: `locate` checked the range against the pool's geometry, which the layout
        // placed inside the mapping (its size checked against the layout); `home.seg` keeps
        // it mapped while `self` is borrowed. The block is ours: allocated to this sender,
        // not in flight (checked), so no receiver of this process views it, and `&mut self`
        // keeps anything else of ours from writing it meanwhile. The consumer's process maps
        // the pool too: a hostile consumer writing the block only changes what it reads.
        unsafe { ShmBytesMut::from_raw_parts(self.home.seg.as_ptr().add(at), len) }
    }

    /// Takes back blocks from the completion ring and from dropped loans.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the consumer returns a block that is not in flight, or the
    /// completion ring's index is impossible.
    pub(crate) fn collect_returns(&mut self) -> Result<(), Error> {
        // Reloads the consumer's tail only if the cached one says empty.
        let chunk = self.comp.read_available()?;
        let n = chunk.len();
        for i in 0..n {
            // One volatile read into a local, then validated: in flight, or a note in range.
            let b: u64 = chunk.read_pod(i, 0);
            if b & DROPPED_MARK != 0 {
                // The consumer dropped the records at positions [from, from + n) unread:
                // every block still out with one of them comes back.
                let (from, n) = (b as u32, ((b & !DROPPED_MARK) >> 32) as u32);
                if let Some(l) = &mut self.large {
                    l.dropped(from, n);
                }
                for (blk, out) in self.in_flight.iter_mut().enumerate() {
                    if *out && self.owner[blk].wrapping_sub(from) < n {
                        *out = false;
                        if self.home.release(blk as u32) {
                            self.free.push(blk as u32);
                        }
                    }
                }
                continue;
            }
            if let Some(l) = &mut self.large
                && b >= u64::from(self.home.geom.blocks)
            {
                let r = u32::try_from(b)
                    .map_err(|_| corrupt(format!("consumer returned block {b}")))
                    .and_then(|b| l.back(b, true));
                if let Err(e) = r {
                    chunk.release(i + 1);
                    return Err(e);
                }
                continue;
            }
            let ok = b < self.in_flight.len() as u64 && self.in_flight[b as usize];
            if !ok {
                chunk.release(i + 1);
                return Err(corrupt(format!(
                    "consumer returned block {b}, which is not in flight"
                )));
            }
            self.in_flight[b as usize] = false;
            // A pinned block (`BlockPin`) comes back through `orphans` when its last pin goes.
            if self.home.release(b as u32) {
                self.free.push(b as u32);
            }
        }
        if n > 0 {
            chunk.release(n);
        }
        let orphans = match self.home.orphans.try_lock() {
            Ok(mut o) if !o.is_empty() => std::mem::take(&mut *o),
            _ => Vec::new(),
        };
        for b in orphans {
            self.give_back(b);
        }
        Ok(())
    }

    /// Takes back every block in flight and empties the completion ring; returns how many
    /// blocks came back.
    ///
    /// `gone` proves the consumer is dead and that no new one attaches meanwhile (a live
    /// consumer may still be reading those blocks, which the producer would then overwrite,
    /// and its later returns of them would be reported as corrupt).
    ///
    /// # Panics
    /// If `gone` is the claim of another channel.
    pub(crate) fn reclaim_all(&mut self, gone: &DeadConsumer<'_>) -> usize {
        assert!(
            gone.is_of(&self.home.seg),
            "a dead consumer's claim reclaims its own channel's pool"
        );
        let _ = self.collect_returns();
        let mut reclaimed = 0;
        for (b, f) in self.in_flight.iter_mut().enumerate() {
            if *f {
                *f = false;
                if self.home.release(b as u32) {
                    self.free.push(b as u32);
                }
                reclaimed += 1;
            }
        }
        if let Some(l) = &mut self.large {
            reclaimed += l.reclaim_all();
        }
        // Anything the dead consumer pushed but we did not read: skip it.
        if let Ok(chunk) = self.comp.read_chunk(u32::MAX) {
            chunk.release_all();
        }
        reclaimed
    }

    /// Raises our waiting flag on the completion ring and returns the value of its tail word
    /// to sleep on (see `ring::Consumer::begin_wait`).
    pub(crate) fn begin_wait(&self) -> u32 {
        self.comp.begin_wait().1
    }

    /// The completion ring's tail word: a waiter watches it and sleeps on it.
    #[inline]
    pub(crate) fn peer_word(&self) -> &AtomicU32 {
        self.comp.peer_word().0
    }

    /// Lowers our waiting flag.
    pub(crate) fn end_wait(&self) {
        self.comp.end_wait();
    }
}
