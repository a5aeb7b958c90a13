//! Errors of the message codec: a message that cannot be encoded, a body that fails
//! validation when decoded.

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

/// Why a message cannot be encoded ([`MessageBuilder::encode_inline`](crate::MessageBuilder::encode_inline),
/// and the same checks of [`Sender::send`](crate::Sender::send), as [`SendError::Encode`](crate::SendError::Encode)):
/// it breaks a limit of the encoding, or holds an array only a channel can carry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// Two fields of one record have the same name.
    DuplicateField {
        /// The name.
        name: String,
        /// The record (from 0).
        record: usize,
    },
    /// A field name longer than [`EncodeError::MAX_NAME`] bytes.
    NameTooLong {
        /// The name.
        name: String,
    },
    /// A metadata string longer than [`EncodeError::MAX_STR`] bytes.
    StringTooLong {
        /// The field's name.
        name: String,
        /// The string's length in bytes.
        len: usize,
    },
    /// An array of more than [`EncodeError::MAX_NDIM`] dimensions.
    TooManyDims {
        /// The array's name.
        name: String,
        /// Its dimensions.
        ndim: usize,
    },
    /// An array whose bytes are not as many as its shape and dtype need.
    ShapeMismatch {
        /// The array's name.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
        /// Its element type.
        dtype: crate::DType,
        /// The bytes given.
        bytes: usize,
    },
    /// A loaned array (it lives in a channel's pool) in a message encoded outside a channel.
    Loaned {
        /// The array's name.
        name: String,
    },
}

impl EncodeError {
    /// Longest field name, in bytes.
    pub const MAX_NAME: usize = 255;
    /// Longest metadata string, in bytes.
    pub const MAX_STR: usize = 65535;
    /// Most dimensions of an array.
    pub const MAX_NDIM: usize = super::MAX_NDIM;
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::DuplicateField { name, record } => write!(
                f,
                "field '{name}' appears twice in record {record}: names must be unique per \
                 record (rename one, or put it in another record with next_record)"
            ),
            EncodeError::NameTooLong { name } => write!(
                f,
                "field name of {} bytes (limit {}): shorten it",
                name.len(),
                Self::MAX_NAME
            ),
            EncodeError::StringTooLong { name, len } => write!(
                f,
                "metadata string '{name}' of {len} bytes (limit {}): send longer text as a u8 \
                 array (array_raw with DType::U8)",
                Self::MAX_STR
            ),
            EncodeError::TooManyDims { name, ndim } => write!(
                f,
                "array '{name}' has {ndim} dimensions (limit {}): reshape it to fewer",
                Self::MAX_NDIM
            ),
            EncodeError::ShapeMismatch {
                name,
                shape,
                dtype,
                bytes,
            } => write!(
                f,
                "array '{name}': shape {shape:?} of {dtype} does not match {bytes} bytes (pass \
                 the shape of the data: its elements times {} bytes)",
                dtype.size()
            ),
            EncodeError::Loaned { name } => write!(
                f,
                "array '{name}' is a loan (it lives in a channel's pool): send it with \
                 Sender::send, or copy it in with MessageBuilder::array to encode the message \
                 outside a channel"
            ),
        }
    }
}

impl std::error::Error for EncodeError {}

/// `Ok` if an array `name` of `shape` and `dtype` may be made of `bytes` bytes: as many as
/// they need, and at most [`EncodeError::MAX_NDIM`] dimensions.
pub(crate) fn check_array(
    name: &str,
    dtype: crate::DType,
    shape: &[usize],
    bytes: usize,
) -> Result<(), EncodeError> {
    if shape.len() > EncodeError::MAX_NDIM {
        return Err(EncodeError::TooManyDims {
            name: name.to_string(),
            ndim: shape.len(),
        });
    }
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if n.and_then(|n| n.checked_mul(dtype.size())) != Some(bytes) {
        return Err(EncodeError::ShapeMismatch {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype,
            bytes,
        });
    }
    Ok(())
}
