//! Receiving on a channel with a schema: data-only bodies, validated against the receiver's
//! private copy of the schema and read by position ([`PositionalView`]).

use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::Receiver;
use super::records::{Rec, n_of};
use crate::error::Error;
use crate::message::{self, DataRef, PositionalView};
use crate::schema::ChannelSchema;

impl Receiver {
    /// [`Receiver::recv_batch`] for a channel with a schema: waits for at least one message,
    /// then lets `f` read up to `max` messages in place, by position
    /// ([`PositionalView::record`], then `array::<T>(field_id)`, `meta_i64(field_id)`, ...).
    /// Every value of a message is checked against the schema (read once at open, private)
    /// before `f` sees it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a channel without a schema (use `recv_batch`); otherwise
    /// as [`Receiver::recv_batch`] (a body that does not match the schema is
    /// [`Error::Corrupt`] and is skipped).
    pub fn recv_positional(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        mut f: impl FnMut(PositionalView<'_>),
    ) -> Result<usize, Error> {
        let schema = match self.schema.as_deref() {
            Some(ChannelSchema::Fields(_)) => self.schema.clone().expect("checked"),
            _ => {
                return Err(Error::InvalidArgument(
                    "recv_positional on a channel without a schema: use recv_batch".into(),
                ));
            }
        };
        let ChannelSchema::Fields(schema) = &*schema else {
            unreachable!("checked above")
        };
        self.shared.check()?;
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut rec = self.next_rec(deadline)?;
        let mut done = 0usize;
        let mut blocks: SmallVec<[u32; 16]> = SmallVec::new();
        let mut dropped = None;
        let result = loop {
            let (n, block) = match rec {
                Rec::Inline { n_slots, .. } => (n_slots, None),
                Rec::Block { block, .. } => (1, Some(block)),
                Rec::Pad(n) => (n, None),
            };
            if !matches!(rec, Rec::Pad(_)) {
                let (src, len) = self.body_src(&rec);
                if self.scratch.len() < len.div_ceil(8) {
                    self.scratch.resize(len.div_ceil(8), 0);
                }
                let body = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.scratch)[..len];
                // SAFETY: `body_src` bounds (validated in `peek`) lie inside the mapping, kept
                // alive by `self.shared`; `body` is private and `len` bytes long. A producer
                // writing the source meanwhile only changes the bytes we copy, which are then
                // validated as private data.
                unsafe { message::copy_for_parse(src, len, body) };
                let body: &[u8] = body;
                // SAFETY: the `len` body bytes at `src` stay mapped while `self` is borrowed;
                // inline array ranges read through it were checked against `len`.
                let data = unsafe { DataRef::shared(src) };
                let ok = PositionalView::parse(body, data, self.shared.pool(), schema);
                if let Ok(v) = &ok {
                    v.for_each_block(|b| blocks.push(b));
                }
                if let Some(b) = block {
                    blocks.push(b);
                }
                match ok {
                    Ok(v) => {
                        f(v);
                        done += 1;
                    }
                    Err(e) => {
                        dropped = Some(self.desc.position());
                        self.skip(n);
                        break Err(e);
                    }
                }
            }
            self.skip(n);
            if done >= max {
                break Ok(done);
            }
            match self.peek() {
                Ok(Some(r)) => rec = r,
                Ok(None) => break Ok(done),
                Err(e) => break Err(e),
            }
        };
        self.release_read();
        blocks.sort_unstable();
        blocks.dedup();
        self.shared.release(&blocks);
        if let Some(from) = dropped {
            // Every block the failing message named comes back.
            self.shared.dropped(
                from,
                if matches!(rec, Rec::Inline { .. }) {
                    n_of(&rec)
                } else {
                    1
                },
            );
        }
        result
    }
}
