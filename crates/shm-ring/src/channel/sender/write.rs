//! The steps of a message send: where each array goes, the size checks, the blocks for arrays
//! copied zero-copy, the ring slots, the record header, and the bookkeeping once the record is
//! staged; `send_inner` (sender.rs) calls them in that order.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Instant;

use smallvec::SmallVec;

use super::Sender;
use crate::channel::{LARGE_OUT, REC_BLOCK, REC_INLINE, REC_PAD, RECORD_HEADER};
use crate::error::Error;
use crate::message::{ArraySrc, NEW_BLOCK, NEW_EXTENT, Place};
use crate::ring::bytes::ShmBytesMut;

/// Whether `p` is an array still to be copied into a new block or extent.
fn is_new(p: Place) -> bool {
    matches!(p, Place::Block(b) if b >= NEW_EXTENT)
}

impl<P> Sender<P> {
    /// Where an array goes: its own loaned block (refused if loaned from another sender),
    /// a new block or large extent (`Place::Block(NEW_BLOCK | NEW_EXTENT)`, allocated by
    /// [`Sender::write_record`]) when the transfer policy says zero-copy, or inline in the body.
    pub(super) fn place_array(
        &self,
        data: &ArraySrc<'_>,
        name: &dyn Display,
    ) -> Result<Place, Error> {
        if let ArraySrc::Loan(t) = data {
            if !Arc::ptr_eq(&t.home, self.pool.home()) {
                return Err(Error::InvalidArgument(format!(
                    "array {name} was loaned from another sender"
                )));
            }
            return Ok(Place::Block(t.block));
        }
        let len = data.len();
        if self.cfg.blocks > 0 && self.cfg.transfer.zero_copy(len) {
            let block_size = self.pool.home().geom.block_size;
            if len > block_size {
                return self
                    .large_fits("zero-copy array", len)
                    .map(|()| Place::Block(NEW_EXTENT));
            }
            Ok(Place::Block(NEW_BLOCK))
        } else {
            Ok(Place::Inline)
        }
    }

    /// `Ok` if the large size class can hold `len` bytes; else [`Error::TooLarge`] naming the
    /// setting to raise.
    pub(super) fn large_fits(&self, what: &'static str, len: usize) -> Result<(), Error> {
        let cap = self.pool.large_capacity();
        if len <= cap {
            return Ok(());
        }
        Err(Error::TooLarge {
            what,
            needed: len,
            limit: if cap == 0 {
                self.pool.home().geom.block_size
            } else {
                cap
            },
            setting: if cap == 0 {
                crate::error::BLOCK_OR_LARGE_POOL
            } else {
                "ChannelConfig::large_pool"
            },
        })
    }

    /// With a large size class, a message takes at most `max(1, blocks / 2 - 1)` new blocks
    /// and `LARGE_OUT / 2 - 1` new extents for its arrays (so it always finds them while the
    /// consumer holds the others); further arrays are copied into the body instead, which
    /// then travels in an extent of its own if it must.
    pub(super) fn fit_places(&self, places: &mut [Place]) {
        let mut blocks = (self.cfg.blocks as usize / 2).saturating_sub(1).max(1);
        let mut extents = LARGE_OUT as usize / 2 - 1;
        for p in places.iter_mut() {
            let left = match *p {
                Place::Block(NEW_BLOCK) => &mut blocks,
                Place::Block(NEW_EXTENT) => &mut extents,
                _ => continue,
            };
            if *left == 0 {
                *p = Place::Inline;
            } else {
                *left -= 1;
            }
        }
    }

    /// Whether a body of `body_len` bytes travels inline in the ring (else in a block or
    /// large extent of its own), checked against the ring, the block size, the large size
    /// class and the pool's block count.
    pub(super) fn check_body(&self, places: &[Place], body_len: usize) -> Result<bool, Error> {
        let mut new_blocks = places
            .iter()
            .filter(|p| **p == Place::Block(NEW_BLOCK))
            .count();
        let inline = RECORD_HEADER + body_len <= self.max_inline;
        if !inline {
            if self.cfg.blocks == 0 {
                return Err(Error::TooLarge {
                    what: "message body (too large to travel inline)",
                    needed: RECORD_HEADER + body_len,
                    limit: self.max_inline,
                    setting: "ChannelConfig::slots (or slot_size)",
                });
            }
            let block_size = self.pool.home().geom.block_size;
            // Body lengths travel as u32.
            if body_len > u32::MAX as usize {
                return Err(Error::TooLarge {
                    what: "message body (arrays copied into it, and metadata)",
                    needed: body_len,
                    limit: u32::MAX as usize,
                    setting: "the message: fewer or smaller arrays copied into its body",
                });
            }
            if body_len > block_size {
                self.large_fits("message body", body_len)?;
            } else {
                new_blocks += 1;
            }
        }
        if new_blocks > self.cfg.blocks as usize {
            return Err(Error::TooLarge {
                what: "message (pool blocks)",
                needed: new_blocks,
                limit: self.cfg.blocks as usize,
                setting: "ChannelConfig::blocks",
            });
        }
        Ok(inline)
    }

    /// Allocates and fills a block for every array placed `Block(u32::MAX)` (`bytes_of(i)`
    /// gives array `i`'s bytes), a block for the body if it does not travel inline, waits for
    /// ring slots, writes the record header and lets `encode(dst, places)` write the body
    /// into `dst` (8-aligned, exactly `body_len` bytes that only this sender writes, though a
    /// hostile consumer may scribble on them). Stages the record (the caller
    /// publishes) and returns its ring position. On error every block taken goes back.
    pub(super) fn write_record<'s>(
        &mut self,
        places: &mut [Place],
        bytes_of: impl Fn(usize) -> Option<&'s [u8]>,
        inline: bool,
        body_len: usize,
        deadline: Option<Instant>,
        encode: impl FnOnce(ShmBytesMut<'_>, &[Place]),
    ) -> Result<u32, Error> {
        let mut taken: SmallVec<[u32; 4]> = SmallVec::new();
        self.pool.new_message();
        let result = (|| {
            for (i, place) in places.iter_mut().enumerate() {
                if is_new(*place)
                    && let Some(src) = bytes_of(i)
                {
                    // A block for up to a block's bytes, else an extent of the large size
                    // class (`place_array` checked it can hold them).
                    let b = self.alloc_block(src.len(), deadline)?;
                    taken.push(b);
                    *place = Place::Block(b);
                    // Block b is ours alone and holds len bytes (checked by `write_block`).
                    self.pool.write_block(b, src);
                }
            }
            let body_block = if inline {
                None
            } else {
                let b = self.alloc_block(body_len, deadline)?;
                taken.push(b);
                Some(b)
            };
            let n_slots = if inline {
                (RECORD_HEADER + body_len).div_ceil(self.desc.shape().slot_size as usize) as u32
            } else {
                1
            };
            let pad = self.place_record(n_slots)?;
            if self.desc.free(pad + n_slots)? < pad + n_slots {
                self.wait_for_slots(pad + n_slots, deadline)?;
            }
            Ok((body_block, n_slots, pad))
        })();
        let (body_block, n_slots, pad) = match result {
            Ok(v) => v,
            Err(e) => {
                self.pool.unsent(&taken);
                return Err(e);
            }
        };
        let rec_pos = self.desc.position().wrapping_add(pad);
        // `pad + n_slots` slots are free (checked or waited for above, and the consumer only
        // frees more): the chunk has them all.
        let mut chunk = self.desc.write_chunk_uninit(pad + n_slots)?;
        if pad > 0 {
            chunk.write_pod(0, 0, [pad, REC_PAD, 0, 0]);
        }
        match body_block {
            None => {
                chunk.write_pod(pad, 0, [n_slots, REC_INLINE, body_len as u32, 0]);
                // The chunk's n_slots contiguous free slots start here and hold
                // RECORD_HEADER + body_len bytes (`place_record`); slot memory is 8-aligned.
                let dst = chunk.bytes_mut(pad).into_sub(RECORD_HEADER, body_len);
                encode(dst.expect("a record's slots hold its body"), places);
            }
            Some(b) => {
                // Block (or extent) b is ours, just allocated for body_len bytes (checked by
                // `check_body`), 64-aligned.
                encode(self.pool.block_mut(b, body_len), places);
                chunk.write_pod(pad, 0, [1, REC_BLOCK, body_len as u32, b]);
            }
        }
        // Staged: the caller publishes (`flush`).
        chunk.stage(pad + n_slots);
        for b in taken {
            self.pool.sent(b, rec_pos);
        }
        Ok(rec_pos)
    }

    /// After the record at `rec_pos` was staged: counts the array and hands a loan's block
    /// over (the block is in flight with the record now).
    pub(super) fn account_array(&mut self, data: &mut ArraySrc<'_>, place: Place, rec_pos: u32) {
        self.stats.array_bytes += data.len() as u64;
        if let ArraySrc::Loan(t) = std::mem::replace(data, ArraySrc::Borrowed(&[])) {
            let b = (*t).take();
            self.pool.sent(b, rec_pos);
        }
        match place {
            Place::Block(_) => self.stats.zero_copy_arrays += 1,
            _ => self.stats.copied_arrays += 1,
        }
    }
}
