//! Sending on a channel with a schema: a [`SchemaMessage`] checked against the channel's
//! schema, then written as a data-only body (see `message::schema_encode`).

use std::time::Instant;

use smallvec::SmallVec;

use super::Sender;
use crate::error::Error;
use crate::message::{self, MessageBuilder, Place, PosVal, SchemaMessage};

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
        self.owner.check()?;
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
        for (i, v) in msg.vals.iter().enumerate() {
            places.push(match v {
                Some(PosVal::Array { data, .. }) => {
                    self.place_array(data, &format_args!("of field {i}"))?
                }
                _ => Place::None,
            });
        }
        if self.cfg.large_pool > 0 {
            self.fit_places(&mut places);
        }
        let body_len = message::data_body_len(msg, &schema, &places);
        let inline = self.check_body(&places, body_len)?;
        // 2.-3. Blocks, slots, the record and its body (see `write.rs`).
        let m: &SchemaMessage<'_> = msg;
        let rec_pos = self.write_record(
            &mut places,
            |i| match &m.vals[i] {
                Some(PosVal::Array { data, .. }) => Some(data.bytes()),
                _ => None,
            },
            inline,
            body_len,
            deadline,
            // SAFETY: `write_record` hands `dst` with `body_len` writable 8-aligned bytes of
            // a record or block of ours; written through pointers only (a hostile consumer
            // scribbling there meanwhile only spoils the message it is about to read).
            |dst, places| unsafe { message::encode_data_raw(m, &schema, places, dst, body_len) },
        )?;
        for (v, p) in msg.vals.iter_mut().zip(&places) {
            if let Some(PosVal::Array { data, .. }) = v {
                self.account_array(data, *p, rec_pos);
            }
        }
        self.stats.messages += 1;
        Ok(())
    }
}
