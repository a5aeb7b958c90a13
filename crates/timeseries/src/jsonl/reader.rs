//! [`JsonLinesReader`]: entries of a JSON-lines stream, file or buffer.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::parse_entry;
use crate::entry::DataEntry;
use crate::error::ReadError;
use crate::period::Freq;

/// Iterates over the entries of a JSON-lines stream.
///
/// Blank lines are skipped. After an error the iterator continues with the next
/// line, so a caller can choose to fail on the first error or skip and count.
#[derive(Debug)]
pub struct JsonLinesReader<R> {
    reader: R,
    freq: Freq,
    path: PathBuf,
    line: u64,
    buf: Vec<u8>,
    bytes: u64,
}

impl JsonLinesReader<BufReader<File>> {
    /// Opens a file.
    ///
    /// # Errors
    /// [`ReadError::Io`] if it cannot be opened.
    pub fn open(path: impl AsRef<Path>, freq: Freq) -> Result<Self, ReadError> {
        let path = path.as_ref().to_path_buf();
        let f = File::open(&path).map_err(|source| ReadError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(JsonLinesReader::new(
            BufReader::with_capacity(1 << 20, f),
            freq,
            path,
        ))
    }
}

impl<R: BufRead> JsonLinesReader<R> {
    /// Reads from any buffered reader; `path` is used in error messages only.
    pub fn new(reader: R, freq: Freq, path: impl Into<PathBuf>) -> Self {
        JsonLinesReader {
            reader,
            freq,
            path: path.into(),
            line: 0,
            buf: Vec::with_capacity(1 << 16),
            bytes: 0,
        }
    }

    /// Bytes consumed so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }
}

impl<R: BufRead> Iterator for JsonLinesReader<R> {
    type Item = Result<DataEntry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            // Fast path: a whole line in the reader's buffer is parsed in place.
            let avail = match self.reader.fill_buf() {
                Ok(avail) => avail,
                Err(source) => {
                    return Some(Err(ReadError::Io {
                        path: self.path.clone(),
                        source,
                    }));
                }
            };
            if avail.is_empty() {
                return None;
            }
            if let Some(p) = memchr::memchr(b'\n', avail) {
                let line = &avail[..p];
                self.bytes += p as u64 + 1;
                self.line += 1;
                let parsed = (!line.iter().all(u8::is_ascii_whitespace)).then(|| {
                    parse_entry(line, self.freq).map_err(|source| ReadError::Parse {
                        path: self.path.clone(),
                        line: self.line,
                        source,
                    })
                });
                self.reader.consume(p + 1);
                match parsed {
                    Some(r) => return Some(r),
                    None => continue,
                }
            }
            // The line continues past the buffer (or is the last, without `\n`).
            self.buf.clear();
            match self.reader.read_until(b'\n', &mut self.buf) {
                Ok(0) => return None,
                Ok(n) => {
                    self.bytes += n as u64;
                    self.line += 1;
                }
                Err(source) => {
                    return Some(Err(ReadError::Io {
                        path: self.path.clone(),
                        source,
                    }));
                }
            }
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Some(
                parse_entry(&self.buf, self.freq).map_err(|source| ReadError::Parse {
                    path: self.path.clone(),
                    line: self.line,
                    source,
                }),
            );
        }
    }
}

/// The lines of `bytes` without their `\n`, exactly as `bytes.split(|&b| b == b'\n')`
/// (so a trailing newline gives a last empty line), with a vectorized newline search:
/// a byte-by-byte split costs about as much as parsing a line of numbers.
pub fn split_lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(bytes);
    std::iter::from_fn(move || {
        let r = rest?;
        match memchr::memchr(b'\n', r) {
            Some(p) => {
                rest = Some(&r[p + 1..]);
                Some(&r[..p])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

/// Parses every line of an in-memory JSON-lines buffer.
///
/// # Errors
/// The first malformed line, as [`ReadError::Parse`] with an empty path.
pub fn parse_lines(bytes: &[u8], freq: Freq) -> Result<Vec<DataEntry>, ReadError> {
    JsonLinesReader::new(bytes, freq, "").collect()
}

/// Reads a whole JSON-lines file.
///
/// # Errors
/// [`ReadError`] for the first unreadable or malformed line.
pub fn read_file(path: impl AsRef<Path>, freq: Freq) -> Result<Vec<DataEntry>, ReadError> {
    JsonLinesReader::open(path, freq)?.collect()
}
