//! Errors of the message codec: a body that fails validation when decoded.

use std::fmt;

use crate::error::Error;

/// Why a message body could not be decoded ([`MessageView::decode`](crate::MessageView::decode)):
/// the bytes are not a valid encoding. Nothing of such a body is used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The body (or a record or field in it) is malformed; the text says what and where
    /// (e.g. "message magic 0x0", "record of 12 bytes at 24").
    Malformed(String),
}

impl DecodeError {
    /// The decoder's internal error (only ever [`Error::Corrupt`]: a failed validation) as
    /// a `DecodeError`, its text kept whole.
    pub(crate) fn from_internal(e: Error) -> Self {
        match e {
            Error::Corrupt(why) => DecodeError::Malformed(why),
            Error::Decode(e) => e,
            other => DecodeError::Malformed(other.to_string()),
        }
    }

    /// As the internal error of the receive path: shared memory that failed validation
    /// ([`Error::Corrupt`], the text kept whole), which the channel verbs report as corrupt.
    pub(crate) fn into_internal(self) -> Error {
        match self {
            DecodeError::Malformed(why) => Error::Corrupt(why),
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Malformed(why) => write!(
                f,
                "malformed message body: {why} (decode only bytes made by \
                 MessageBuilder::encode_inline, whole, of the same shm-ring version; the \
                 body was not used)"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}
