//! GluonTS's Arrow and Parquet datasets (`gluonts.dataset.arrow`), read with arrow-rs.
//!
//! GluonTS's `ArrowWriter` (IPC file, `.feather`, or IPC stream) and `ParquetWriter`
//! write one row per series, one column per field of the first entry:
//! - `start`: `timestamp[us]` (GluonTS turns the `Period` into its start time), or the
//!   string the user gave when writing raw records;
//! - `item_id`: string (or integer);
//! - `target`, `feat_static_real`, ...: `list<float>` (`list<double>` with nulls from raw
//!   Python lists; `list<int32>` for categorical fields);
//! - a 2-D field (`feat_dynamic_real`, a multivariate `target`) is flattened row-major
//!   into its column, its shape in a `<field>._np_shape` column (`list<int64>`), so it
//!   reads back without copying; with `flatten_arrays=False` it is `list<list<float>>`.
//!
//! [`ArrowDataset`] holds the record batches and reads row `i` as the same
//! [`DataEntry`] the JSON-lines reader gives for that series (`target` first, then the
//! known fields in column order; other columns skipped; Arrow nulls inside arrays
//! become NaN). [`ArrowDataset::map`] memory-maps an IPC file: the arrays point into
//! the mapping, and [`ArrowDataset::values`] hands a `float32` array without nulls out
//! as a borrowed slice of it (no copy). Compressed IPC buffers (`compression="lz4"` or
//! `"zstd"`) are not supported: arrow-rs reports them as an error.
//!
//! Parquet needs the `parquet` cargo feature ([`ArrowDataset::open_parquet`]).
//!
//! # Examples
//! ```
//! use shmpipe_timeseries::arrow::ArrowDataset;
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/arrow/daily.feather");
//! let ds = ArrowDataset::open(path, "D".parse().unwrap()).unwrap();
//! assert_eq!(ds.len(), 3);
//! let e = ds.entry(0).unwrap();
//! assert_eq!(e.item_id.as_deref(), Some("x"));
//! assert_eq!(e.get("target").unwrap().time_len(), 400);
//! ```

use std::borrow::Cow;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_schema::SchemaRef;

mod columns;
use columns::{Dim, list_values, read_array, read_item_id, read_start};

use crate::entry::{DataEntry, field};
use crate::period::Freq;

/// Suffix GluonTS gives the shape column of a flattened n-d field.
pub const SHAPE_SUFFIX: &str = "._np_shape";

/// The array fields read from a dataset (as the JSON-lines reader), and whether
/// each is static (1-D) or dynamic (2-D). `target` may be 1-D or 2-D.
const KNOWN_FIELDS: [(&str, Dim); 6] = [
    (field::TARGET, Dim::Either),
    (field::FEAT_STATIC_CAT, Dim::One),
    (field::FEAT_STATIC_REAL, Dim::One),
    (field::FEAT_DYNAMIC_REAL, Dim::Two),
    (field::FEAT_DYNAMIC_CAT, Dim::Two),
    (field::PAST_FEAT_DYNAMIC_REAL, Dim::Two),
];

/// Reading an Arrow or Parquet dataset failed: where and what.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrowError {
    /// The file.
    pub path: PathBuf,
    /// 0-based row (series) number, when the problem is in one row.
    pub row: Option<usize>,
    /// The column, when known.
    pub field: Option<String>,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for ArrowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(r) = self.row {
            write!(f, ": row {r}")?;
        }
        if let Some(c) = &self.field {
            write!(f, ": field {c:?}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ArrowError {}

/// Which format a file is in, from its first bytes (as GluonTS's `File.infer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// Arrow IPC file (random access), starts with `ARROW1`.
    IpcFile,
    /// Arrow IPC stream.
    IpcStream,
    /// Parquet, starts with `PAR1`.
    Parquet,
}

impl FileKind {
    /// The kind of the file at `path`.
    ///
    /// # Errors
    /// If the file cannot be read.
    pub fn of(path: impl AsRef<Path>) -> std::io::Result<FileKind> {
        let mut head = [0u8; 6];
        let mut f = std::fs::File::open(path)?;
        let n = f.read(&mut head)?;
        Ok(match &head[..n] {
            b"ARROW1" => FileKind::IpcFile,
            h if h.starts_with(b"PAR1") => FileKind::Parquet,
            _ => FileKind::IpcStream,
        })
    }
}

/// Where each known field lives in the schema.
#[derive(Clone, Debug)]
struct Columns {
    start: Option<usize>,
    item_id: Option<usize>,
    /// `(field name, values column, shape column)` in column order, `target` first.
    arrays: Vec<(&'static str, usize, Option<usize>, Dim)>,
}

impl Columns {
    fn resolve(schema: &SchemaRef) -> Columns {
        let idx = |name: &str| schema.index_of(name).ok();
        let mut arrays: Vec<_> = KNOWN_FIELDS
            .iter()
            .filter_map(|&(name, dim)| {
                idx(name).map(|c| (name, c, idx(&format!("{name}{SHAPE_SUFFIX}")), dim))
            })
            .collect();
        arrays.sort_by_key(|&(name, c, _, _)| (name != field::TARGET, c));
        Columns {
            start: idx("start"),
            item_id: idx("item_id"),
            arrays,
        }
    }
}

/// A GluonTS dataset read from an Arrow IPC file or stream, or from Parquet.
#[derive(Debug)]
pub struct ArrowDataset {
    path: PathBuf,
    freq: Freq,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    /// `ends[b]` = rows in batches `0..=b`.
    ends: Vec<usize>,
    columns: Columns,
}

impl ArrowDataset {
    /// Reads the file at `path` (IPC file, IPC stream or, with the `parquet` feature,
    /// Parquet: told apart by their first bytes) into memory.
    ///
    /// # Errors
    /// If the file cannot be read or is not a valid dataset (no `target` column,
    /// compressed IPC buffers, Parquet without the feature).
    pub fn open(path: impl AsRef<Path>, freq: Freq) -> Result<ArrowDataset, ArrowError> {
        let path = path.as_ref();
        match FileKind::of(path).map_err(|e| err(path, e))? {
            FileKind::Parquet => Self::open_parquet(path, freq),
            _ => {
                let bytes = std::fs::read(path).map_err(|e| err(path, e))?;
                Self::from_ipc_buffer(path, Buffer::from_vec(bytes), freq)
            }
        }
    }

    /// Memory-maps the Arrow IPC file or stream at `path`: the arrays are read in place,
    /// and every process that maps the file shares one copy of it (the page cache).
    ///
    /// # Safety
    /// The file must not be modified or truncated while the dataset (or any array taken
    /// from it) is alive: Arrow arrays validated at open would then change under the
    /// reader (undefined behaviour), and a truncated mapping raises SIGBUS. GluonTS
    /// datasets are written once and then only read; for a file that others may
    /// change, use [`ArrowDataset::open`].
    ///
    /// # Errors
    /// As [`ArrowDataset::open`]; a Parquet file is an error (it is not laid out in
    /// memory as Arrow arrays: use `open`).
    pub unsafe fn map(path: impl AsRef<Path>, freq: Freq) -> Result<ArrowDataset, ArrowError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| err(path, e))?;
        // SAFETY: Delegated to the caller (the file is not modified while mapped).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(path, e))?;
        let len = map.len();
        if len == 0 {
            return Err(err(path, "empty file"));
        }
        let ptr = NonNull::new(map.as_ptr().cast_mut()).ok_or_else(|| err(path, "null map"))?;
        // SAFETY: `ptr` is valid for `len` bytes for as long as the mapping lives, and the
        // buffer keeps the mapping alive (it owns the `Arc`); the bytes do not change
        // (the caller's contract above).
        let buf = unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(map)) };
        if buf.as_slice().starts_with(b"PAR1") {
            return Err(err(
                path,
                "a Parquet file cannot be memory-mapped; use open",
            ));
        }
        Self::from_ipc_buffer(path, buf, freq)
    }

    /// Maps an Arrow IPC file or stream held in a sealed memfd (`F_SEAL_WRITE |
    /// F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`; see [`RowStore::arrow_shared`]): the arrays
    /// are read in place, every process that maps the memfd shares one copy, and, unlike
    /// [`ArrowDataset::map`], this is safe: the seals guarantee that the bytes never change
    /// and the mapping is never truncated. `name` names it in errors.
    ///
    /// [`RowStore::arrow_shared`]: crate::rows::RowStore::arrow_shared
    ///
    /// # Errors
    /// A descriptor without the four seals, or as [`ArrowDataset::open`].
    pub fn from_sealed_memfd(
        name: impl AsRef<Path>,
        fd: std::os::fd::OwnedFd,
        freq: Freq,
    ) -> Result<ArrowDataset, ArrowError> {
        let path = name.as_ref();
        crate::shared::memfd::check_sealed(&fd).map_err(|e| err(path, e))?;
        let file = std::fs::File::from(fd);
        // SAFETY: the memfd is sealed against writes, shrinking and growing (checked above;
        // seals cannot be removed): its bytes never change and no page of the mapping can
        // vanish (no SIGBUS).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(path, e))?;
        let len = map.len();
        let ptr = NonNull::new(map.as_ptr().cast_mut())
            .filter(|_| len > 0)
            .ok_or_else(|| err(path, "empty dataset"))?;
        // SAFETY: `ptr` is valid for `len` bytes for as long as the mapping lives, and the
        // buffer keeps the mapping alive (it owns the `Arc`); the bytes never change (sealed).
        let buf = unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(map)) };
        Self::from_ipc_buffer(path, buf, freq)
    }

    /// An Arrow IPC file or stream already in memory (`name` names it in errors).
    ///
    /// # Errors
    /// As [`ArrowDataset::open`].
    pub fn from_ipc_bytes(
        name: impl AsRef<Path>,
        bytes: Vec<u8>,
        freq: Freq,
    ) -> Result<ArrowDataset, ArrowError> {
        Self::from_ipc_buffer(name.as_ref(), Buffer::from_vec(bytes), freq)
    }

    /// Decodes an IPC file or stream held in `buf` (zero-copy: arrays point into it).
    fn from_ipc_buffer(path: &Path, buf: Buffer, freq: Freq) -> Result<ArrowDataset, ArrowError> {
        let (schema, batches) = without_panics(|| {
            if buf.as_slice().starts_with(b"ARROW1") {
                decode_ipc_file(&buf)
            } else {
                decode_ipc_stream(buf)
            }
        })
        .map_err(|e| err(path, e))?;
        Self::from_batches(path, schema, batches, freq)
    }

    /// Reads a Parquet file (needs the `parquet` cargo feature).
    ///
    /// # Errors
    /// If the file cannot be read or decoded, or the feature is off.
    #[cfg(feature = "parquet")]
    pub fn open_parquet(path: impl AsRef<Path>, freq: Freq) -> Result<ArrowDataset, ArrowError> {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| err(path, e))?;
        let (schema, batches) = without_panics(|| {
            let builder =
                ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| e.to_string())?;
            let schema = builder.schema().clone();
            let reader = builder.build().map_err(|e| e.to_string())?;
            let batches = reader
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            Ok((schema, batches))
        })
        .map_err(|e| err(path, e))?;
        Self::from_batches(path, schema, batches, freq)
    }

    /// Reads a Parquet file (needs the `parquet` cargo feature).
    ///
    /// # Errors
    /// Always, without the `parquet` feature.
    #[cfg(not(feature = "parquet"))]
    pub fn open_parquet(path: impl AsRef<Path>, _freq: Freq) -> Result<ArrowDataset, ArrowError> {
        Err(err(
            path.as_ref(),
            "Parquet support is off: build shmpipe-timeseries with --features parquet",
        ))
    }

    /// A dataset over record batches of one schema (`path` names it in errors).
    ///
    /// # Errors
    /// If the schema has no `target` column.
    pub fn from_batches(
        path: impl AsRef<Path>,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        freq: Freq,
    ) -> Result<ArrowDataset, ArrowError> {
        let path = path.as_ref().to_path_buf();
        let columns = Columns::resolve(&schema);
        if columns.arrays.first().map(|a| a.0) != Some(field::TARGET) {
            return Err(ArrowError {
                path,
                row: None,
                field: Some(field::TARGET.into()),
                message: "no such column".into(),
            });
        }
        let mut ends = Vec::with_capacity(batches.len());
        let mut n = 0;
        for b in &batches {
            n += b.num_rows();
            ends.push(n);
        }
        Ok(ArrowDataset {
            path,
            freq,
            schema,
            batches,
            ends,
            columns,
        })
    }

    /// Number of series.
    pub fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Whether the dataset has no series.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The frequency periods are read in.
    pub fn freq(&self) -> Freq {
        self.freq
    }

    /// Batch and row within it of series `i`.
    fn locate(&self, i: usize) -> Result<(&RecordBatch, usize), ArrowError> {
        let b = self.ends.partition_point(|&e| e <= i);
        let batch = self
            .batches
            .get(b)
            .ok_or_else(|| self.row_err(i, None, format!("out of range (len {})", self.len())))?;
        let first = if b == 0 { 0 } else { self.ends[b - 1] };
        Ok((batch, i - first))
    }

    fn row_err(&self, row: usize, field: Option<&str>, message: impl fmt::Display) -> ArrowError {
        ArrowError {
            path: self.path.clone(),
            row: Some(row),
            field: field.map(str::to_owned),
            message: message.to_string(),
        }
    }

    /// The values of array field `name` of series `i`, flat (row-major), as `f32`:
    /// borrowed from the batch (for a memory-mapped file: from the mapping) when the
    /// column is `float32` without nulls in this row, converted otherwise (nulls are
    /// NaN). `None` if the dataset has no such column or the row's value is null.
    ///
    /// # Errors
    /// Out-of-range `i`, or a column of an unsupported type.
    pub fn values(&self, i: usize, name: &str) -> Result<Option<Cow<'_, [f32]>>, ArrowError> {
        let Some(&(_, col, _, _)) = self.columns.arrays.iter().find(|a| a.0 == name) else {
            return Ok(None);
        };
        let (batch, r) = self.locate(i)?;
        list_values(batch.column(col).as_ref(), r).map_err(|m| self.row_err(i, Some(name), m))
    }

    /// Series `i` as the JSON-lines reader would give it.
    ///
    /// # Errors
    /// Out-of-range `i`; a missing `start` or `target`; a value of an unsupported type;
    /// a shape that does not match the values; a dynamic field that is not 2-D.
    pub fn entry(&self, i: usize) -> Result<DataEntry, ArrowError> {
        let (batch, r) = self.locate(i)?;
        let mut e = DataEntry::default();
        let start_col = self
            .columns
            .start
            .ok_or_else(|| self.row_err(i, Some("start"), "no such column"))?;
        e.start = Some(
            read_start(batch.column(start_col).as_ref(), r, self.freq)
                .map_err(|m| self.row_err(i, Some("start"), m))?,
        );
        if let Some(c) = self.columns.item_id {
            e.item_id = read_item_id(batch.column(c).as_ref(), r)
                .map_err(|m| self.row_err(i, Some("item_id"), m))?;
        }
        for &(name, col, shape_col, dim) in &self.columns.arrays {
            let a = read_array(batch, col, shape_col, r, dim)
                .map_err(|m| self.row_err(i, Some(name), m))?;
            match a {
                Some(a) => e.insert(name, a),
                None if name == field::TARGET => {
                    return Err(self.row_err(i, Some(name), "required field is null"));
                }
                None => {}
            }
        }
        Ok(e)
    }

    /// Every series, in order.
    ///
    /// # Errors
    /// The first row that cannot be read.
    pub fn entries(&self) -> Result<Vec<DataEntry>, ArrowError> {
        (0..self.len()).map(|i| self.entry(i)).collect()
    }
}

/// Runs a decoder of untrusted bytes, turning a panic into an error.
///
/// arrow-rs validates what it decodes but still asserts on some malformed inputs
/// (found by `corrupted_arrow_files_are_errors_never_panics`: buffers whose length does
/// not fit their type after a corrupted schema). The common cases are checked first
/// with clear messages ([`check_message`]); this is the net for the rest. Nothing
/// decoded survives a panic (all state is local to `f`), so no broken invariant leaks.
/// With `panic = "abort"` a malformed file still aborts the process.
fn without_panics<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(format!("malformed file (arrow-rs: {msg})"))
    })
}

fn err(path: &Path, e: impl fmt::Display) -> ArrowError {
    ArrowError {
        path: path.to_path_buf(),
        row: None,
        field: None,
        message: e.to_string(),
    }
}

/// Decodes an IPC file: footer, dictionaries, record batches (arrays point into `buf`).
fn decode_ipc_file(buf: &Buffer) -> Result<(SchemaRef, Vec<RecordBatch>), String> {
    use arrow_ipc::reader::{FileDecoder, read_footer_length};
    let bytes = buf.as_slice();
    let trailer_start = bytes.len().checked_sub(10).ok_or("file too short")?;
    let trailer: [u8; 10] = bytes[trailer_start..]
        .try_into()
        .map_err(|_| "file too short")?;
    let footer_len = read_footer_length(trailer).map_err(|e| e.to_string())?;
    let footer_start = trailer_start
        .checked_sub(footer_len)
        .ok_or("footer longer than the file")?;
    let footer = arrow_ipc::root_as_footer(&bytes[footer_start..trailer_start])
        .map_err(|e| format!("bad footer: {e}"))?;
    let schema = Arc::new(arrow_ipc::convert::fb_to_schema(
        footer.schema().ok_or("footer without a schema")?,
    ));
    let mut decoder = FileDecoder::new(schema.clone(), footer.version());
    let block_slice = |b: &arrow_ipc::Block| -> Result<Buffer, String> {
        let start = usize::try_from(b.offset()).map_err(|_| "negative block offset")?;
        let len = usize::try_from(b.metaDataLength())
            .ok()
            .zip(usize::try_from(b.bodyLength()).ok())
            .and_then(|(m, body)| m.checked_add(body))
            .ok_or("bad block length")?;
        if start.checked_add(len).is_none_or(|end| end > bytes.len()) {
            return Err("block outside the file".into());
        }
        let meta_len = b.metaDataLength() as usize;
        // The format aligns blocks and pads metadata to 8 bytes; misaligned arrays
        // trip assertions in arrow-rs.
        if !start.is_multiple_of(8) || !meta_len.is_multiple_of(8) {
            return Err("misaligned block".into());
        }
        check_message(&bytes[start..start + meta_len], len - meta_len)?;
        Ok(buf.slice_with_length(start, len))
    };
    for block in footer.dictionaries().iter().flatten() {
        decoder
            .read_dictionary(block, &block_slice(block)?)
            .map_err(|e| e.to_string())?;
    }
    let mut batches = Vec::new();
    for block in footer.recordBatches().iter().flatten() {
        if let Some(b) = decoder
            .read_record_batch(block, &block_slice(block)?)
            .map_err(|e| e.to_string())?
        {
            batches.push(b);
        }
    }
    Ok((schema, batches))
}

/// Decodes an IPC stream (arrays point into `buf`).
fn decode_ipc_stream(mut buf: Buffer) -> Result<(SchemaRef, Vec<RecordBatch>), String> {
    check_stream(buf.as_slice())?;
    let mut decoder = arrow_ipc::reader::StreamDecoder::new();
    let mut batches = Vec::new();
    while !buf.is_empty() {
        let before = buf.len();
        match decoder.decode(&mut buf).map_err(|e| e.to_string())? {
            Some(b) => batches.push(b),
            None if buf.len() == before => return Err("stream decoder made no progress".into()),
            None => {}
        }
    }
    decoder.finish().map_err(|e| e.to_string())?;
    let schema = decoder.schema().ok_or("stream without a schema")?;
    Ok((schema, batches))
}

/// The flatbuffer of an encapsulated IPC message (`[0xFFFFFFFF] <i32 size> <flatbuffer>`)
/// whose metadata occupies `meta` (prefix and padding included).
fn message_flatbuffer(meta: &[u8]) -> Result<&[u8], String> {
    let word = |at: usize| -> Result<i32, String> {
        meta.get(at..at + 4)
            .map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .ok_or_else(|| "message metadata too short".to_string())
    };
    let (hdr, len) = if word(0)? == -1 {
        (8, word(4)?)
    } else {
        (4, word(0)?)
    };
    let len = usize::try_from(len).map_err(|_| "negative message size")?;
    meta.get(hdr..hdr + len)
        .ok_or_else(|| "message metadata outside its block".to_string())
}

/// Checks one IPC message against its body of `body_len` bytes before arrow-rs decodes
/// it: arrow-ipc 57 slices buffers at the offsets the message gives without checking
/// them (a corrupt offset panics), so every buffer of a record or dictionary batch must
/// lie inside the body here. Compressed bodies are refused with a clear message.
fn check_message(meta: &[u8], body_len: usize) -> Result<(), String> {
    let m = arrow_ipc::root_as_message(message_flatbuffer(meta)?)
        .map_err(|e| format!("bad message: {e}"))?;
    let batch = match m.header_type() {
        arrow_ipc::MessageHeader::RecordBatch => m.header_as_record_batch(),
        arrow_ipc::MessageHeader::DictionaryBatch => {
            m.header_as_dictionary_batch().and_then(|d| d.data())
        }
        _ => None,
    };
    let Some(batch) = batch else {
        return Ok(());
    };
    if batch.compression().is_some() {
        return Err(
            "compressed IPC buffers are not supported (write with compression=None)".into(),
        );
    }
    for b in batch.buffers().iter().flatten() {
        let ok = usize::try_from(b.offset())
            .ok()
            .zip(usize::try_from(b.length()).ok())
            .and_then(|(o, l)| o.checked_add(l))
            .is_some_and(|end| end <= body_len)
            // The format pads every buffer to 8 bytes; arrow-rs asserts on misaligned ones.
            && b.offset() % 8 == 0;
        if !ok {
            return Err(format!(
                "buffer at {}+{} misaligned or outside the message body ({body_len} bytes)",
                b.offset(),
                b.length()
            ));
        }
    }
    Ok(())
}

/// Walks an IPC stream's messages and checks each with [`check_message`].
fn check_stream(bytes: &[u8]) -> Result<(), String> {
    let mut pos = 0;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        let word = |at: usize| {
            rest.get(at..at + 4)
                .map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        };
        let (hdr, len) = match (word(0), word(4)) {
            (Some(-1), Some(len)) => (8, len),
            (Some(-1), None) | (None, _) => return Err("truncated message header".into()),
            (Some(len), _) => (4, len),
        };
        if len == 0 {
            return Ok(()); // end-of-stream marker
        }
        let len = usize::try_from(len).map_err(|_| "negative message size")?;
        let meta_len = hdr + len;
        if !meta_len.is_multiple_of(8) {
            return Err("message metadata not padded to 8 bytes".into());
        }
        let meta = rest.get(..meta_len).ok_or("message outside the stream")?;
        let m = arrow_ipc::root_as_message(message_flatbuffer(meta)?)
            .map_err(|e| format!("bad message: {e}"))?;
        let body_len = usize::try_from(m.bodyLength()).map_err(|_| "negative body length")?;
        if !body_len.is_multiple_of(8)
            || meta_len
                .checked_add(body_len)
                .is_none_or(|end| end > rest.len())
        {
            return Err("message body outside the stream".into());
        }
        check_message(meta, body_len)?;
        pos += meta_len + body_len;
    }
    Ok(())
}
