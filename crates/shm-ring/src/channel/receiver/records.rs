//! Reading records off the descriptor ring: the record header (read once, validated), pads,
//! corrupt records, waiting for the next record, and handing read slots back in batches.

use std::time::Instant;

use super::Receiver;
use super::record_header::{Rec, n_of};
use crate::channel::ShmRing;
use crate::channel::{REC_BLOCK, REC_INLINE, REC_PAD, RECORD_HEADER};
use crate::error::{Error, corrupt};
use crate::link::segment::Segment;
use crate::link::wait::block_on;
use crate::ring;
use crate::ring::bytes::ShmBytes;
use crate::sync::Ordering;

impl<P> Receiver<P> {
    /// Reads and validates the record header at our read position, if a record is there.
    pub(super) fn peek(&mut self) -> Result<Option<Rec>, Error> {
        // Reloads the producer's tail only if the cached one says empty.
        let chunk = self.desc.read_available()?;
        let avail = chunk.len();
        if avail == 0 {
            return Ok(None);
        }
        // The producer may rewrite the header at any time: it is read exactly once (one
        // volatile copy) into locals, and only the locals are validated and used.
        let [n_slots, kind, body_len, block]: [u32; 4] = chunk.read_pod(0, 0);
        let slot_size = self.desc.shape().slot_size as usize;
        if n_slots == 0 || n_slots > avail || n_slots > self.desc.contiguous(0) {
            return Err(self.skip_corrupt(format!(
                "record of {n_slots} slots ({avail} published, {} before the wrap)",
                self.desc.contiguous(0)
            )));
        }
        match kind {
            REC_PAD => Ok(Some(Rec::Pad(n_slots))),
            REC_INLINE if (body_len as usize) <= n_slots as usize * slot_size - RECORD_HEADER => {
                Ok(Some(Rec::Inline {
                    n_slots,
                    body_len: body_len as usize,
                }))
            }
            // A block holds up to block_size bytes; a large extent up to the end of its area
            // (checked arithmetic on the copies).
            REC_BLOCK
                if n_slots == 1
                    && let Some(at) = self
                        .shared
                        .pool
                        .locate(u64::from(block), u64::from(body_len)) =>
            {
                Ok(Some(Rec::Block {
                    block,
                    at,
                    body_len: body_len as usize,
                }))
            }
            _ => Err(self.skip_corrupt(format!(
                "record kind {kind}, {n_slots} slots, body {body_len} bytes, block {block}"
            ))),
        }
    }

    /// Moves past the `n` slots of the record at our read position (validated by `peek`:
    /// published) without publishing our index: [`Receiver::release_read`] does, once per
    /// receive call.
    #[inline]
    pub(super) fn skip(&mut self, n: u32) {
        if let Ok(chunk) = self.desc.read_chunk(n) {
            // `peek` checked n <= the slots published (the cached tail only grows).
            chunk.skip(n);
            self.unreleased += n;
        }
    }

    /// Hands the slots read so far back to the producer: one store of `head` (and a wake-up
    /// if it sleeps on a full ring) per receive call, however many records it read. Not
    /// later: a sender blocked on a full ring must not wait for our next call (a receiver
    /// that then blocks elsewhere, say on a full ring back to that sender, would deadlock);
    /// holding slots back across calls measured no faster here.
    #[inline]
    pub(in crate::channel) fn release_read(&mut self) {
        if self.unreleased > 0 {
            // SYNC POINT (release(0)): we are done reading every skipped slot; see
            // `ring::Consumer::release`.
            self.desc.release(0);
            self.unreleased = 0;
        }
    }

    /// A corrupt record: skip everything published (we cannot find the next record boundary).
    fn skip_corrupt(&mut self, why: String) -> Error {
        if let Ok(n) = self.desc.available(1) {
            let from = self.desc.position();
            self.desc.release(n);
            self.unreleased = 0;
            // The blocks that went out with the skipped records come back to the producer.
            self.shared.dropped(from, n);
        }
        corrupt(why)
    }

    /// Waits for the next record (skipping pads): the fast path (a record is there) without
    /// the wait loop's set-up.
    #[inline]
    pub(super) fn next_rec(&mut self, deadline: Option<Instant>) -> Result<Rec, Error> {
        match self.poll_rec()? {
            Some(r) => Ok(r),
            None => self.wait_rec(deadline),
        }
    }

    /// The next record if one is there (pads skipped); `Err(Disconnected)` once the producer
    /// closed and everything was read.
    fn poll_rec(&mut self) -> Result<Option<Rec>, Error> {
        loop {
            match self.peek()? {
                Some(Rec::Pad(n)) => self.skip(n),
                Some(r) => return Ok(Some(r)),
                None => {
                    // About to wait (or report the end): hand back what we read first.
                    self.release_read();
                    if self.header().producer_closed.load(Ordering::SeqCst) != 0 {
                        // The final commit happened before the flag: look once more.
                        return match self.peek()? {
                            None => Err(Error::Disconnected),
                            Some(Rec::Pad(n)) => {
                                self.skip(n);
                                continue;
                            }
                            Some(r) => Ok(Some(r)),
                        };
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// Waits for the next record: spin, then sleep (see `wait.rs`).
    #[cold]
    fn wait_rec(&mut self, deadline: Option<Instant>) -> Result<Rec, Error> {
        let wait = self.wait;
        block_on(
            self,
            true,
            &wait,
            deadline,
            |s| s.poll_rec(),
            |s| s.desc.peer_word().0,
            |s| s.desc.begin_wait().1,
            |s| s.desc.end_wait(),
            |s| s.producer_alive(),
        )
    }

    /// The body of a record at our read position: `body_len` bytes in memory the producer
    /// can write at any time (so: read as copies, and the documented zero-copy array views).
    /// A function of the two fields it reads (not of `self`), so the caller may borrow its
    /// other fields meanwhile.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the body does not lie in the slots or the mapping (`peek`
    /// validated it already: this is the view's own check).
    #[inline]
    pub(super) fn body_bytes<'a>(
        desc: &'a ring::Consumer<ShmRing>,
        seg: &'a Segment,
        rec: &Rec,
    ) -> Result<ShmBytes<'a>, Error> {
        let bytes = match *rec {
            // Validated in `peek`: the record's slots are published, contiguous, and hold
            // RECORD_HEADER + body_len bytes.
            Rec::Inline { body_len, .. } => desc.slot_bytes(0).sub(RECORD_HEADER, body_len),
            // Validated in `peek`: `at + body_len` lies inside a block or the large area.
            Rec::Block { at, body_len, .. } => seg.bytes().sub(at, body_len),
            Rec::Pad(_) => Some(ShmBytes::private(&[])),
        };
        bytes.ok_or_else(|| corrupt("a record's body lies outside its slots or the pool"))
    }

    pub(super) fn finish(&mut self, rec: &Rec) {
        self.skip(n_of(rec));
        // The head first, then the block (as `read_in_place` does): a consumer that dies
        // between the two leaves a read record and a block still in flight, which the
        // takeover reclaims. The other order left an unread record whose block was already
        // back in the pool: the next consumer read it again and returned the block twice
        // (review 17).
        self.release_read();
        if let Rec::Block { block, .. } = *rec {
            self.shared.release(&[block]);
        }
    }
}
