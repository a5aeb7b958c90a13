//! Sending on a channel with a schema: a [`SchemaMessage`] checked against the channel's
//! schema, then written as a data-only body (see `message::schema_encode`).

use std::sync::Arc;
use std::time::Instant;

use smallvec::SmallVec;

use super::Sender;
use crate::channel::{REC_BLOCK, REC_INLINE, RECORD_HEADER};
use crate::error::Error;
use crate::message::{self, ArraySrc, MessageBuilder, Place, PosVal, SchemaMessage};

mod sealed {
    pub trait Sealed {}
}

/// What [`Sender::send`] takes: a [`MessageBuilder`] (self-describing, channels without a
/// schema) or a [`SchemaMessage`] (data-only, channels with a schema). Sealed.
pub trait Outgoing: sealed::Sealed {
    #[doc(hidden)]
    fn send_on(&mut self, tx: &mut Sender, deadline: Option<Instant>) -> Result<(), Error>;
}

impl sealed::Sealed for MessageBuilder<'_> {}
impl sealed::Sealed for SchemaMessage<'_> {}

impl Outgoing for MessageBuilder<'_> {
    fn send_on(&mut self, tx: &mut Sender, deadline: Option<Instant>) -> Result<(), Error> {
        tx.send_inner(self, deadline)
    }
}

impl Outgoing for SchemaMessage<'_> {
    fn send_on(&mut self, tx: &mut Sender, deadline: Option<Instant>) -> Result<(), Error> {
        tx.send_data_inner(self, deadline)
    }
}

impl Sender {
    /// An empty [`SchemaMessage`] for this channel's schema.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a channel without a schema.
    pub fn schema_message<'a>(&self) -> Result<SchemaMessage<'a>, Error> {
        match &self.fields {
            Some(s) => Ok(SchemaMessage::new(s)),
            None => Err(Error::InvalidArgument(
                "this channel has no schema (create it with Sender::with_schema)".into(),
            )),
        }
    }

    fn send_data_inner(
        &mut self,
        msg: &mut SchemaMessage<'_>,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        let h = self.header();
        if h.consumer_closed.load(crate::sync::Ordering::Relaxed) != 0
            || h.producer_closed.load(crate::sync::Ordering::Relaxed) != 0
        {
            return Err(Error::Disconnected);
        }
        let Some(schema) = self.fields.clone() else {
            return Err(Error::InvalidArgument(
                "a SchemaMessage on a channel without a schema: send a MessageBuilder (or \
                 create the channel with Sender::with_schema)"
                    .into(),
            ));
        };
        msg.check(&schema)?;
        // 1. Where does each array go? (as for self-describing messages)
        let mut places: SmallVec<[Place; 8]> = SmallVec::with_capacity(msg.vals.len());
        let mut new_blocks = 0usize;
        let block_size = self.pool.home().geom.block_size;
        for v in &msg.vals {
            places.push(match v {
                Some(PosVal::Array {
                    data: ArraySrc::Loan(t),
                    ..
                }) => {
                    if !Arc::ptr_eq(&t.home, self.pool.home()) {
                        return Err(Error::InvalidArgument(
                            "an array was loaned from another sender".into(),
                        ));
                    }
                    Place::Block(t.block)
                }
                Some(PosVal::Array { data, .. }) => {
                    let len = data.len();
                    if self.cfg.blocks > 0 && self.cfg.transfer.zero_copy(len) {
                        if len > block_size {
                            return Err(Error::TooLarge {
                                what: "zero-copy array",
                                needed: len,
                                limit: block_size,
                                setting: "ChannelConfig::block_size",
                            });
                        }
                        new_blocks += 1;
                        Place::Block(u32::MAX)
                    } else {
                        Place::Inline
                    }
                }
                _ => Place::None,
            });
        }
        let body_len = message::data_body_len(msg, &schema, &places);
        let inline = RECORD_HEADER + body_len <= self.max_inline;
        if !inline {
            if self.cfg.blocks == 0 || body_len > block_size {
                return Err(Error::TooLarge {
                    what: "message body",
                    needed: body_len,
                    limit: if self.cfg.blocks == 0 {
                        self.max_inline
                    } else {
                        block_size
                    },
                    setting: "ChannelConfig::block_size (or slots)",
                });
            }
            new_blocks += 1;
        }
        if new_blocks > self.cfg.blocks as usize {
            return Err(Error::TooLarge {
                what: "message (pool blocks)",
                needed: new_blocks,
                limit: self.cfg.blocks as usize,
                setting: "ChannelConfig::blocks",
            });
        }
        // 2. Blocks for arrays copied zero-copy, and their data.
        let mut taken: SmallVec<[u32; 4]> = SmallVec::new();
        let result = (|| {
            for (i, v) in msg.vals.iter().enumerate() {
                if places[i] == Place::Block(u32::MAX)
                    && let Some(PosVal::Array { data, .. }) = v
                {
                    let src = data.bytes();
                    let b = self.alloc_block(src.len(), deadline)?;
                    taken.push(b);
                    places[i] = Place::Block(b);
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
            let pad = self.reserve_slots(n_slots, deadline)?;
            Ok((body_block, n_slots, pad))
        })();
        let (body_block, n_slots, pad) = match result {
            Ok(v) => v,
            Err(e) => {
                self.pool.unsent(&taken);
                return Err(e);
            }
        };
        // 3. Write the record (and the body) and hand the blocks over.
        let rec_pos = self.desc.position().wrapping_add(pad);
        let mut chunk = self.desc.write_chunk_uninit(pad + n_slots)?;
        if pad > 0 {
            chunk.write_pod(0, 0, [pad, crate::channel::REC_PAD, 0, 0]);
        }
        match body_block {
            None => {
                chunk.write_pod(pad, 0, [n_slots, REC_INLINE, body_len as u32, 0]);
                let rec = chunk.as_mut_ptr(pad);
                // SAFETY: the chunk's n_slots contiguous free slots (reserve_slots) start at
                // `rec` and hold RECORD_HEADER + body_len bytes; slot memory is 8-aligned.
                // Written through pointers only: a hostile consumer writing these slots
                // meanwhile only spoils the message it is about to read.
                unsafe {
                    message::encode_data_raw(
                        msg,
                        &schema,
                        &places,
                        rec.add(RECORD_HEADER),
                        body_len,
                    )
                };
            }
            Some(b) => {
                let block = self.pool.home().block_ptr(b);
                // SAFETY: block b is ours (just allocated), block_size >= body_len (checked),
                // 64-aligned. Pointers only, as above.
                unsafe { message::encode_data_raw(msg, &schema, &places, block, body_len) };
                chunk.write_pod(pad, 0, [1, REC_BLOCK, body_len as u32, b]);
            }
        }
        chunk.stage(pad + n_slots);
        for b in taken {
            self.pool.sent(b, rec_pos);
        }
        for (v, p) in msg.vals.iter_mut().zip(&places) {
            if let Some(PosVal::Array { data, .. }) = v {
                self.stats.array_bytes += data.len() as u64;
                if let ArraySrc::Loan(t) = std::mem::replace(data, ArraySrc::Borrowed(&[])) {
                    let b = (*t).take();
                    self.pool.sent(b, rec_pos);
                }
                match p {
                    Place::Block(_) => self.stats.zero_copy_arrays += 1,
                    _ => self.stats.copied_arrays += 1,
                }
            }
        }
        self.stats.messages += 1;
        Ok(())
    }
}
