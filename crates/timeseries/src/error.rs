//! Error types: one small enum per operation.

use std::fmt;
use std::path::PathBuf;

/// A frequency or timestamp string that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeError {
    /// Unsupported or malformed frequency string (e.g. `"B"`, `"0h"`).
    BadFreq(String),
    /// Malformed or impossible timestamp.
    BadTimestamp(String),
}

impl fmt::Display for TimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeError::BadFreq(s) => write!(
                f,
                "unsupported frequency {s:?} (supported: s, min, h, D, W[-DAY], M, Q, Y with an optional multiple)"
            ),
            TimeError::BadTimestamp(s) => write!(f, "bad timestamp {s:?}"),
        }
    }
}

impl std::error::Error for TimeError {}

/// What is wrong with one JSON line.
#[derive(Debug, Clone, PartialEq)]
pub enum ParseErrorKind {
    /// The line ended inside a value.
    UnexpectedEnd,
    /// A byte that cannot start or continue the expected value.
    UnexpectedByte(u8),
    /// A malformed number, or a string that is not a number where one is expected.
    BadNumber,
    /// A malformed string (bad escape, invalid UTF-8).
    BadString,
    /// A value of the wrong JSON type (e.g. an object where an array is expected).
    WrongType(&'static str),
    /// Rows of a 2-D array have different lengths.
    Ragged,
    /// A required field is absent.
    Missing,
    /// The `start` timestamp is invalid.
    Time(TimeError),
    /// Bytes after the closing brace.
    TrailingBytes,
}

/// A malformed JSON line: where and what.
#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    /// The field being read, when known.
    pub field: Option<String>,
    /// Byte offset in the line.
    pub offset: usize,
    /// What went wrong.
    pub kind: ParseErrorKind,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(field) = &self.field {
            write!(f, "field {field:?}: ")?;
        }
        match &self.kind {
            ParseErrorKind::UnexpectedEnd => f.write_str("unexpected end of line")?,
            ParseErrorKind::UnexpectedByte(b) => write!(f, "unexpected byte {:?}", char::from(*b))?,
            ParseErrorKind::BadNumber => f.write_str("malformed number")?,
            ParseErrorKind::BadString => f.write_str("malformed string")?,
            ParseErrorKind::WrongType(t) => write!(f, "expected {t}")?,
            ParseErrorKind::Ragged => f.write_str("rows of different lengths")?,
            ParseErrorKind::Missing => f.write_str("required field is missing")?,
            ParseErrorKind::Time(e) => write!(f, "{e}")?,
            ParseErrorKind::TrailingBytes => f.write_str("trailing bytes after the object")?,
        }
        write!(f, " (at byte {})", self.offset)
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ParseErrorKind::Time(e) => Some(e),
            _ => None,
        }
    }
}

/// Reading a JSON-lines file failed.
#[derive(Debug)]
pub enum ReadError {
    /// The file could not be opened or read.
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line is malformed.
    Parse {
        /// The file (empty for in-memory buffers).
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// The parse error.
        source: ParseError,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            ReadError::Parse { path, line, source } => {
                write!(f, "{}:{line}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Io { source, .. } => Some(source),
            ReadError::Parse { source, .. } => Some(source),
        }
    }
}

/// A transformation could not be applied to an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransformError {
    /// A field the step needs is absent.
    MissingField {
        /// The step.
        step: &'static str,
        /// The field.
        field: String,
    },
    /// A field has the wrong number of dimensions.
    BadNdim {
        /// The step.
        step: &'static str,
        /// The field.
        field: String,
        /// Required number of dimensions.
        expected: usize,
        /// Actual number of dimensions.
        got: usize,
    },
    /// A field's time axis does not have the required length.
    LengthMismatch {
        /// The step.
        step: &'static str,
        /// The field.
        field: String,
        /// Required length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// The entry has no `start` period but the step needs one.
    MissingStart {
        /// The step.
        step: &'static str,
    },
    /// A sampler that must return a split point (the test sampler) found none.
    EmptyInterval {
        /// The step.
        step: &'static str,
        /// Length of the series.
        len: usize,
    },
}

impl fmt::Display for TransformError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransformError::MissingField { step, field } => {
                write!(f, "{step}: missing field {field:?}")
            }
            TransformError::BadNdim {
                step,
                field,
                expected,
                got,
            } => write!(
                f,
                "{step}: field {field:?} has {got} dimensions, expected {expected}"
            ),
            TransformError::LengthMismatch {
                step,
                field,
                expected,
                got,
            } => write!(
                f,
                "{step}: field {field:?} has length {got}, expected {expected}"
            ),
            TransformError::MissingStart { step } => write!(f, "{step}: entry has no start"),
            TransformError::EmptyInterval { step, len } => {
                write!(f, "{step}: no split point in a series of length {len}")
            }
        }
    }
}

impl std::error::Error for TransformError {}

/// Entries could not be stacked into a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// No entries.
    Empty,
    /// Entry `index` lacks a field of the first entry, or its shape differs.
    Mismatch {
        /// The field.
        field: String,
        /// Position of the entry in the batch.
        index: usize,
    },
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::Empty => f.write_str("cannot stack an empty batch"),
            BatchError::Mismatch { field, index } => write!(
                f,
                "entry {index} of the batch lacks field {field:?} or has a different shape"
            ),
        }
    }
}

impl std::error::Error for BatchError {}
