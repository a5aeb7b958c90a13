//! A message outside a channel: encoded into one self-contained byte string (every array
//! inline), for another transport (a socket, a file), and decoded back.

use super::{DecodeError, EncodeError, MessageBuilder, MessageView, decode, encode};

impl MessageBuilder<'_> {
    /// Encodes the message with every array inline into a fresh, 8-aligned buffer; returns the
    /// buffer and the length of the body in bytes (the buffer is padded to whole words).
    ///
    /// # Errors
    /// [`EncodeError::Loaned`] for a loaned array (it lives in a channel's pool); the other
    /// [`EncodeError`]s for a message over the encoding's limits.
    ///
    /// # Examples
    /// ```
    /// use shm_ring::{MessageBuilder, MessageView};
    /// let (words, len) = MessageBuilder::new().tag(3).meta_i64("n", 7).encode_inline()?;
    /// let body = &bytemuck::cast_slice::<u64, u8>(&words)[..len];
    /// let m = MessageView::decode(body)?;
    /// assert_eq!((m.tag(), m.record(0)?.meta_i64("n")), (3, Some(7)));
    /// # Ok::<(), shm_ring::Error>(())
    /// ```
    pub fn encode_inline(&self) -> Result<(Vec<u64>, usize), EncodeError> {
        encode::encode_inline(self)
    }
}

impl<'a> MessageView<'a> {
    /// Decodes a body made by [`MessageBuilder::encode_inline`] (as read from a socket or a
    /// file); a body that refers to pool blocks is refused.
    ///
    /// # Errors
    /// [`DecodeError::Malformed`] on any invalid encoding (what is wrong, and where).
    pub fn decode(body: &'a [u8]) -> Result<MessageView<'a>, DecodeError> {
        decode::decode(body)
    }
}
