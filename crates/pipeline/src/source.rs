//! Sources read by emitter processes: the [`Source`] trait, its errors and an in-memory
//! source. JSON lines are in [`crate::jsonl`], the seeded shuffling helpers in
//! [`crate::shuffle`], the order of reading in [`crate::records`].

use std::fmt;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::item::Item;

/// A random-access set of records: one part of the data, read by one emitter.
///
/// An emitter asks for indices `0..len()`, in order or permuted per epoch (shuffling).
///
/// # Examples
/// ```
/// use shmpipe::{Item, MemorySource, Source};
/// let items: Vec<Item> = (0..10).map(|i| Item::new().with_meta("i", i)).collect();
/// let mut part = MemorySource::new(items).part(1, 2); // second half
/// assert_eq!(part.len(), 5);
/// assert_eq!(part.read(0).unwrap().i64("i"), Some(5));
/// ```
pub trait Source: Send {
    /// Number of records in this part.
    fn len(&self) -> usize;
    /// Whether this part holds no record.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads record `index` (`0..len()`).
    ///
    /// # Errors
    /// [`SourceError::BadRecord`] for a malformed record (the pipeline's
    /// [`OnBadRecord`](crate::OnBadRecord) policy decides), other variants stop the pipeline.
    fn read(&mut self, index: usize) -> Result<Item, SourceError>;
}

/// Why a source could not produce a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourceError {
    /// A malformed record.
    BadRecord {
        /// File (or source name).
        file: String,
        /// 1-based line number.
        line: u64,
        /// The offending field, when one is to blame.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// Reading failed.
    Io {
        /// File.
        file: String,
        /// The OS error.
        message: String,
    },
    /// Anything else (e.g. an unknown source name).
    Other(String),
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::BadRecord {
                file,
                line,
                field: Some(field),
                message,
            } => {
                write!(f, "bad record at {file}:{line}, field {field:?}: {message}")
            }
            SourceError::BadRecord {
                file,
                line,
                field: None,
                message,
            } => {
                write!(f, "bad record at {file}:{line}: {message}")
            }
            SourceError::Io { file, message } => write!(f, "cannot read {file}: {message}"),
            SourceError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for SourceError {}

/// What a registered source factory gets.
#[derive(Debug)]
pub struct SourceContext<'a> {
    /// Arguments given with [`PipelineBuilder::source_named`](crate::PipelineBuilder::source_named).
    pub args: &'a serde_json::Value,
    /// The part this emitter reads: `rank * emitters + emitter`.
    pub part: usize,
    /// Number of parts: `world_size * emitters`.
    pub parts: usize,
}

impl SourceContext<'_> {
    /// The descriptor shared under argument `key` (a [`SharedFd`](crate::SharedFd) handle
    /// from [`PipelineBuilder::share_fd`](crate::PipelineBuilder::share_fd)): a sealed memfd
    /// opened read-only, checked when this emitter received it, open until it exits.
    ///
    /// # Errors
    /// When `args[key]` is not a handle, or outside a pipeline's emitter.
    pub fn shared_fd(&self, key: &str) -> Result<std::os::fd::BorrowedFd<'static>, SourceError> {
        crate::share::from_args(self.args, key).map_err(SourceError::Other)
    }
}

/// An in-memory source. Use [`MemorySource::part`] in a registered source factory to read
/// the part of an emitter.
#[derive(Debug, Clone, Default)]
pub struct MemorySource {
    items: Vec<Item>,
}

impl MemorySource {
    /// A source over `items`.
    pub fn new(items: Vec<Item>) -> MemorySource {
        MemorySource { items }
    }

    /// Keeps part `part` of `parts`: the contiguous index range
    /// `len * part / parts .. len * (part + 1) / parts`. Parts are disjoint and cover all items.
    ///
    /// # Panics
    /// If `part >= parts`.
    pub fn part(mut self, part: usize, parts: usize) -> MemorySource {
        let r = part_range(self.items.len(), part, parts);
        self.items.truncate(r.end);
        self.items.drain(..r.start);
        self
    }
}

/// The index range of part `part` of `parts` over `len` records.
///
/// # Panics
/// If `part >= parts`.
///
/// # Examples
/// ```
/// assert_eq!(shmpipe::part_range(10, 2, 3), 6..10);
/// ```
pub fn part_range(len: usize, part: usize, parts: usize) -> Range<usize> {
    assert!(part < parts, "part {part} out of 0..{parts}");
    let at = |p: usize| (len as u128 * p as u128 / parts as u128) as usize;
    at(part)..at(part + 1)
}

impl Source for MemorySource {
    fn len(&self) -> usize {
        self.items.len()
    }
    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        self.items
            .get(index)
            .cloned()
            .ok_or_else(|| SourceError::Other(format!("index {index} out of range")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_parts_are_disjoint_and_complete() {
        for len in [0usize, 1, 7, 100] {
            for parts in 1..6 {
                let mut all = Vec::new();
                for p in 0..parts {
                    all.extend(part_range(len, p, parts));
                }
                assert_eq!(all, (0..len).collect::<Vec<_>>());
            }
        }
    }
}
