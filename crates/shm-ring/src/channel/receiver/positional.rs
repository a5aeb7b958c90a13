//! Receiving on a channel with a schema: data-only bodies, validated against the receiver's
//! private copy of the schema and read by position ([`PositionalView`]).

use std::time::Duration;

use super::Receiver;
use crate::error::Error;
use crate::message::PositionalView;
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
        self.read_in_place(max, timeout, |body, data, pool, blocks| {
            let v = PositionalView::parse(body, data, pool, schema)?;
            v.for_each_block(|b| blocks.push(b));
            f(v);
            Ok(())
        })
    }
}
