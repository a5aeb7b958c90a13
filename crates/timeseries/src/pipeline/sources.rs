//! The emitters' sources over a JSON-lines file: raw lines, byte ranges or line numbers for
//! the workers to read, or entries parsed once.
//!
//! Records group consecutive series by bytes, not by count (issue 18): a record holds series
//! up to `group_bytes` (of JSON text, or of parsed arrays), and a series larger than that
//! travels alone. So a record of long series never grows past what a channel carries well,
//! and the work per record (parsing and windowing scale with the bytes) stays even.

use std::ops::Range;
use std::path::Path;

use shmpipe::ndarray::Array1;
use shmpipe::{Item, Source, SourceError};

use super::convert::{entry_to_item, group_items};
use super::names::{LINE_FIELD, LINE_NO_META, LINES_FIELD, RANGES_FIELD};
use crate::jsonl::parse_entry;
use crate::period::Freq;

/// Records that are each one i64 array under `field`: byte ranges or line numbers of the
/// part's lines, or row numbers of a store (`rows.rs`), read by the workers themselves.
pub(crate) struct I64Records {
    pub(crate) field: &'static str,
    pub(crate) records: Vec<Vec<i64>>,
}

/// The part's non-blank lines as `(line number, byte range)`.
fn non_blank_lines(
    path: &Path,
    part: usize,
    parts: usize,
) -> Result<Vec<(i64, Range<usize>)>, SourceError> {
    let Part {
        data,
        lines,
        first_line,
    } = read_part(path, part, parts)?;
    Ok(lines
        .into_iter()
        .enumerate()
        .filter(|(_, r)| !data[r.clone()].iter().all(u8::is_ascii_whitespace))
        .map(|(i, r)| ((first_line + i as u64) as i64, r))
        .collect())
}

/// Splits consecutive entries of `sizes` bytes into runs of at most `group_bytes` bytes
/// each; an entry larger than that is a run of its own. Every entry is in exactly one run,
/// in order.
pub(crate) fn runs_by_bytes(sizes: &[usize], group_bytes: usize) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, &n) in sizes.iter().enumerate() {
        if i > start && bytes.saturating_add(n) > group_bytes {
            runs.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(n);
    }
    if start < sizes.len() {
        runs.push(start..sizes.len());
    }
    runs
}

impl I64Records {
    /// Byte ranges: each record is the `(offset, length, line)` triples of consecutive
    /// non-blank lines of up to `group_bytes` bytes together (see [`runs_by_bytes`]).
    pub(crate) fn ranges(
        path: &Path,
        group_bytes: usize,
        part: usize,
        parts: usize,
    ) -> Result<I64Records, SourceError> {
        let lines = non_blank_lines(path, part, parts)?;
        let sizes: Vec<usize> = lines.iter().map(|(_, r)| r.len()).collect();
        let records = runs_by_bytes(&sizes, group_bytes)
            .into_iter()
            .map(|run| {
                lines[run]
                    .iter()
                    .flat_map(|(line, r)| [r.start as i64, r.len() as i64, *line])
                    .collect()
            })
            .collect();
        Ok(I64Records {
            field: RANGES_FIELD,
            records,
        })
    }

    /// Line numbers: each record is the numbers of consecutive non-blank lines of up to
    /// `group_bytes` bytes together (the workers' work follows the bytes of the series).
    pub(crate) fn indices(
        path: &Path,
        group_bytes: usize,
        part: usize,
        parts: usize,
    ) -> Result<I64Records, SourceError> {
        let lines = non_blank_lines(path, part, parts)?;
        let sizes: Vec<usize> = lines.iter().map(|(_, r)| r.len()).collect();
        let records = runs_by_bytes(&sizes, group_bytes)
            .into_iter()
            .map(|run| lines[run].iter().map(|(line, _)| *line).collect())
            .collect();
        Ok(I64Records {
            field: LINES_FIELD,
            records,
        })
    }
}

impl Source for I64Records {
    fn len(&self) -> usize {
        self.records.len()
    }

    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        let r = self
            .records
            .get(index)
            .ok_or_else(|| SourceError::Other(format!("index {index} out of range")))?;
        Ok(Item::new().with(self.field, Array1::from(r.clone())))
    }
}

/// One emitter's part of a JSON-lines file.
struct Part {
    /// The whole file.
    data: Vec<u8>,
    /// Byte ranges of the part's lines (blank ones included).
    lines: Vec<Range<usize>>,
    /// 1-based number of the part's first line.
    first_line: u64,
}

/// Reads part `part` of `parts` (line-aligned byte ranges, as the pipeline splits files).
fn read_part(path: &Path, part: usize, parts: usize) -> Result<Part, SourceError> {
    let io = |e: std::io::Error| SourceError::Io {
        file: path.display().to_string(),
        message: e.to_string(),
    };
    let ranges = shmpipe::split_seeks(path, parts).map_err(io)?;
    let r = ranges
        .get(part)
        .cloned()
        .ok_or_else(|| SourceError::Other(format!("part {part} of {parts}")))?;
    let data = std::fs::read(path).map_err(io)?;
    let (start, end) = (r.start as usize, (r.end as usize).min(data.len()));
    let first_line = memchr::memchr_iter(b'\n', &data[..start]).count() as u64 + 1;
    let mut lines = Vec::new();
    let mut s = start;
    for i in memchr::memchr_iter(b'\n', &data[start..end]) {
        lines.push(s..start + i);
        s = start + i + 1;
    }
    if s < end {
        lines.push(s..end);
    }
    Ok(Part {
        data,
        lines,
        first_line,
    })
}

/// Raw lines: each record is the bytes of consecutive lines, up to `group_bytes` together (a
/// longer line alone), parsed by the workers.
pub(super) struct LinesSource {
    data: Vec<u8>,
    /// Per record: byte range (whole lines) and 1-based number of its first line.
    records: Vec<(Range<usize>, u64)>,
}

impl LinesSource {
    pub(super) fn open(
        path: &Path,
        group_bytes: usize,
        part: usize,
        parts: usize,
    ) -> Result<LinesSource, SourceError> {
        let Part {
            data,
            lines,
            first_line,
        } = read_part(path, part, parts)?;
        let sizes: Vec<usize> = lines.iter().map(|r| r.len() + 1).collect();
        let records = runs_by_bytes(&sizes, group_bytes)
            .into_iter()
            .map(|run| {
                (
                    lines[run.start].start..lines[run.end - 1].end,
                    first_line + run.start as u64,
                )
            })
            .collect();
        Ok(LinesSource { data, records })
    }
}

impl Source for LinesSource {
    fn len(&self) -> usize {
        self.records.len()
    }

    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        let (r, line) = self
            .records
            .get(index)
            .cloned()
            .ok_or_else(|| SourceError::Other(format!("index {index} out of range")))?;
        Ok(Item::new()
            .with(LINE_FIELD, Array1::from(self.data[r].to_vec()))
            .with_meta(LINE_NO_META, line as i64))
    }
}

/// Entries parsed once at start, served from memory in groups of up to `group_bytes` of
/// arrays (a larger series alone). A malformed line is reported when its group is read, so
/// the pipeline's bad-record policy applies (skipping drops the whole group).
pub(super) struct ParsedSource {
    items: Vec<Result<Item, SourceError>>,
}

impl ParsedSource {
    pub(super) fn open(
        path: &Path,
        freq: Result<Freq, String>,
        group_bytes: usize,
        part: usize,
        parts: usize,
    ) -> Result<ParsedSource, SourceError> {
        let freq = freq.map_err(SourceError::Other)?;
        let Part {
            data,
            lines: ranges,
            first_line: first,
        } = read_part(path, part, parts)?;
        let mut items = Vec::with_capacity(ranges.len());
        for (i, r) in ranges.into_iter().enumerate() {
            let line = &data[r];
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            items.push(parse_entry(line, freq).map(entry_to_item).map_err(|e| {
                SourceError::BadRecord {
                    file: path.display().to_string(),
                    line: first + i as u64,
                    field: e.field.clone(),
                    message: e.to_string(),
                }
            }));
        }
        // Group series by their bytes; a group with a bad line is that line's error.
        let sizes: Vec<usize> = items
            .iter()
            .map(|r| r.as_ref().map_or(0, Item::nbytes))
            .collect();
        let runs = runs_by_bytes(&sizes, group_bytes);
        let mut it = items.into_iter();
        let grouped = runs
            .into_iter()
            .map(|run| {
                let chunk: Result<Vec<Item>, SourceError> = it.by_ref().take(run.len()).collect();
                chunk.map(group_items)
            })
            .collect();
        Ok(ParsedSource { items: grouped })
    }
}

impl Source for ParsedSource {
    fn len(&self) -> usize {
        self.items.len()
    }

    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        self.items
            .get(index)
            .cloned()
            .unwrap_or_else(|| Err(SourceError::Other(format!("index {index} out of range"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_hold_at_most_group_bytes_and_a_larger_entry_alone() {
        let sizes = [10, 20, 30, 100, 5, 5, 60, 1];
        let runs = runs_by_bytes(&sizes, 60);
        assert_eq!(runs, vec![0..3, 3..4, 4..6, 6..7, 7..8]);
        for r in &runs {
            let bytes: usize = sizes[r.clone()].iter().sum();
            assert!(bytes <= 60 || r.len() == 1, "{r:?}: {bytes}");
        }
        let flat: Vec<usize> = runs.into_iter().flatten().collect();
        assert_eq!(flat, (0..sizes.len()).collect::<Vec<_>>());
        assert!(runs_by_bytes(&[], 10).is_empty());
        assert_eq!(runs_by_bytes(&[1, 1, 1], 0), vec![0..1, 1..2, 2..3]);
        assert_eq!(runs_by_bytes(&[1; 5], usize::MAX), vec![0..5]);
    }
}
