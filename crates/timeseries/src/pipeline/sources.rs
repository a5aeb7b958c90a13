//! The emitters' sources over a JSON-lines file: raw lines, byte ranges or line numbers for
//! the workers to read, or entries parsed once.

use std::ops::Range;
use std::path::Path;

use shmpipe::ndarray::Array1;
use shmpipe::{Item, Source, SourceError};

use super::convert::{entry_to_item, group_items};
use super::{LINE_FIELD, LINE_NO_META, LINES_FIELD, RANGES_FIELD};
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

impl I64Records {
    /// Byte ranges: each record is `group` `(offset, length, line)` triples of non-blank lines.
    pub(crate) fn ranges(
        path: &Path,
        group: usize,
        part: usize,
        parts: usize,
    ) -> Result<I64Records, SourceError> {
        let triples: Vec<[i64; 3]> = non_blank_lines(path, part, parts)?
            .into_iter()
            .map(|(line, r)| [r.start as i64, r.len() as i64, line])
            .collect();
        Ok(I64Records {
            field: RANGES_FIELD,
            records: triples.chunks(group).map(|c| c.concat()).collect(),
        })
    }

    /// Line numbers: each record is `group` line numbers of non-blank lines.
    pub(crate) fn indices(
        path: &Path,
        group: usize,
        part: usize,
        parts: usize,
    ) -> Result<I64Records, SourceError> {
        let numbers: Vec<i64> = non_blank_lines(path, part, parts)?
            .into_iter()
            .map(|(line, _)| line)
            .collect();
        Ok(I64Records {
            field: LINES_FIELD,
            records: numbers.chunks(group).map(<[i64]>::to_vec).collect(),
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

/// Raw lines: each record is the bytes of `group` consecutive lines, parsed by the workers.
pub(super) struct LinesSource {
    data: Vec<u8>,
    /// Per record: byte range (whole lines) and 1-based number of its first line.
    records: Vec<(Range<usize>, u64)>,
}

impl LinesSource {
    pub(super) fn open(
        path: &Path,
        group: usize,
        part: usize,
        parts: usize,
    ) -> Result<LinesSource, SourceError> {
        let Part {
            data,
            lines,
            first_line,
        } = read_part(path, part, parts)?;
        let records = lines
            .chunks(group)
            .enumerate()
            .map(|(k, c)| {
                (
                    c[0].start..c[c.len() - 1].end,
                    first_line + (k * group) as u64,
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

/// Entries parsed once at start, served from memory in groups. A malformed line is
/// reported when its group is read, so the pipeline's bad-record policy applies
/// (skipping drops the whole group).
pub(super) struct ParsedSource {
    items: Vec<Result<Item, SourceError>>,
}

impl ParsedSource {
    pub(super) fn open(
        path: &Path,
        freq: Result<Freq, String>,
        group: usize,
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
        // Group `group` series per record; a group with a bad line is that line's error.
        let mut grouped = Vec::with_capacity(items.len().div_ceil(group));
        let mut it = items.into_iter().peekable();
        while it.peek().is_some() {
            let chunk: Result<Vec<Item>, SourceError> = it.by_ref().take(group).collect();
            grouped.push(chunk.map(group_items));
        }
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
