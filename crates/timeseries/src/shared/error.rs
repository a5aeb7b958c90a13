//! The error of creating, opening or reading a shared dataset.

use std::fmt;

/// Creating, opening or reading a shared dataset failed.
#[derive(Debug)]
pub enum SharedError {
    /// An OS call failed (`what` names it).
    Os {
        /// The call and its object.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The memfd lacks some of `F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`.
    NotSealed,
    /// The bytes are not a valid layout (what is wrong).
    Corrupt(String),
    /// Series index out of range.
    OutOfRange {
        /// The index asked for.
        index: usize,
        /// Number of series.
        len: usize,
    },
    /// An entry cannot be stored (e.g. more than 2^32 elements along one axis).
    TooLarge(String),
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedError::Os { what, source } => write!(f, "{what}: {source}"),
            SharedError::NotSealed => f.write_str(
                "shared dataset is not sealed (F_SEAL_WRITE|F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL)",
            ),
            SharedError::Corrupt(m) => write!(f, "corrupt shared dataset: {m}"),
            SharedError::OutOfRange { index, len } => {
                write!(f, "series {index} out of range (len {len})")
            }
            SharedError::TooLarge(m) => write!(f, "cannot store in a shared dataset: {m}"),
        }
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SharedError::Os { source, .. } => Some(source),
            _ => None,
        }
    }
}
