//! Errors of schemas: a schema region that fails validation, a channel of another schema
//! than the one asked for, a field looked up that the schema does not have.

use std::fmt;

/// A channel's schema is unreadable (its bytes in the segment failed validation: a bug, a
/// version mix-up or a hostile peer; nothing of it was used), or is not the one asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaError {
    /// The region does not start with the schema magic.
    BadMagic {
        /// The first four bytes, little-endian.
        found: u32,
    },
    /// A schema kind this build does not know (1: typed value).
    UnknownKind(u32),
    /// The length written in the schema is not the length of its region.
    LengthMismatch {
        /// The length the schema states.
        declared: u64,
        /// The length of the region (from the channel header).
        region: u64,
    },
    /// An entry runs past the end of the schema.
    Truncated {
        /// Offset (in the schema) of the entry.
        at: usize,
        /// Length of the schema.
        len: usize,
    },
    /// Bytes after the last entry.
    TrailingBytes {
        /// Offset of the first one.
        at: usize,
        /// Length of the schema.
        len: usize,
    },
    /// A field (or the typed value, field 0) names a dtype code that does not exist.
    BadDType {
        /// Field position.
        field: usize,
        /// The code found.
        code: u8,
    },
    /// More dimensions than allowed.
    BadRank {
        /// Field position.
        field: usize,
        /// The rank found.
        rank: u64,
    },
    /// A field name is empty, too long or not UTF-8.
    BadName {
        /// Field position.
        field: usize,
        /// What is wrong.
        why: String,
    },
    /// Values that contradict each other (a typed value's shape and size, an alignment that
    /// is not a power of two, ...).
    Inconsistent(String),
    /// The channel carries another schema than the one asked for.
    Mismatch {
        /// What the channel carries.
        channel: String,
        /// What was asked for.
        expected: String,
    },
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let corrupt = "(another process wrote an invalid schema into the channel: a bug, a \
                       version mix-up or a hostile process; the channel was not opened)";
        match self {
            SchemaError::BadMagic { found } => {
                write!(f, "schema magic {found:#x} is not 'SRS1' {corrupt}")
            }
            SchemaError::UnknownKind(k) => write!(f, "schema kind {k} is unknown {corrupt}"),
            SchemaError::LengthMismatch { declared, region } => write!(
                f,
                "schema states {declared} bytes in a region of {region} {corrupt}"
            ),
            SchemaError::Truncated { at, len } => write!(
                f,
                "schema entry at byte {at} runs past its end ({len} bytes) {corrupt}"
            ),
            SchemaError::TrailingBytes { at, len } => write!(
                f,
                "schema has stray bytes from {at} to its end ({len}) {corrupt}"
            ),
            SchemaError::BadDType { field, code } => {
                write!(f, "schema field {field}: dtype code {code} {corrupt}")
            }
            SchemaError::BadRank { field, rank } => write!(
                f,
                "schema field {field}: {rank} dimensions (at most {})",
                super::value::MAX_VALUE_RANK
            ),
            SchemaError::BadName { field, why } => {
                write!(f, "schema field {field}: its name is {why}")
            }
            SchemaError::Inconsistent(why) => write!(f, "schema: {why}"),
            SchemaError::Mismatch { channel, expected } => write!(
                f,
                "the channel carries {channel}, but {expected} was asked for: open it with \
                 the type (or schema) its sender created it with"
            ),
        }
    }
}

impl std::error::Error for SchemaError {}

/// Why a field of a message (or schema) could not be read: looked up by a name or position
/// that is not there, read as another kind or element type than it has, or not valid.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FieldError {
    /// No field of that name.
    NoSuchField {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: Vec<String>,
    },
    /// A record index past the last record of a message.
    NoSuchRecord {
        /// The index asked for.
        index: usize,
        /// Number of records.
        len: usize,
    },
    /// The field is metadata, not an array.
    NotAnArray {
        /// Its name.
        name: String,
    },
    /// The array has another element type than the one asked for.
    WrongDType {
        /// Array name.
        name: String,
        /// Its element type.
        found: crate::DType,
        /// The element type asked for.
        expected: crate::DType,
    },
    /// The array's data is not aligned for its element type (a sender that placed it
    /// wrongly: a bug or a hostile process).
    Misaligned {
        /// Array name.
        name: String,
        /// Its element type.
        dtype: crate::DType,
    },
    /// A boolean array holds a byte other than 0 or 1.
    NotABool {
        /// Array name.
        name: String,
        /// The first such byte.
        byte: u8,
    },
    /// The message's encoding failed validation on the way to the field.
    Corrupt(crate::DecodeError),
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldError::NoSuchField { name, known } => write!(
                f,
                "no field '{name}' (the fields are {known:?}: check the name the sender used)"
            ),
            FieldError::NoSuchRecord { index, len } => write!(
                f,
                "no record {index}: the message has {len} (records count from 0)"
            ),
            FieldError::NotAnArray { name } => write!(
                f,
                "field '{name}' is metadata, not an array: read it with meta/meta_i64/meta_str"
            ),
            FieldError::WrongDType {
                name,
                found,
                expected,
            } if *found == crate::DType::Bool => write!(
                f,
                "array '{name}' holds bool, not {expected}: read it with array_bool"
            ),
            FieldError::WrongDType {
                name,
                found,
                expected,
            } => write!(
                f,
                "array '{name}' holds {found}, not {expected}: read it as {found}"
            ),
            FieldError::Misaligned { name, dtype } => write!(
                f,
                "array '{name}' of {dtype} is not aligned for its element type (the sender \
                 placed it wrongly: a bug or a hostile process; read it with array_bytes)"
            ),
            FieldError::NotABool { name, byte } => write!(
                f,
                "boolean array '{name}' holds byte {byte} (only 0 and 1 are bools: the sender \
                 wrote another type; read it with array_bytes or array::<u8>)"
            ),
            FieldError::Corrupt(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for FieldError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FieldError::Corrupt(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}
