//! One copy of a parsed dataset for every worker: a sealed memfd read in place.
//!
//! PyTorch's forked `DataLoader` workers each end up with their own copy of a Python
//! dataset (reference counts written on access unshare the pages), and so do our
//! workers that parse the file themselves. Here the parent lays the parsed entries
//! out once in an anonymous memfd, seals it (`F_SEAL_WRITE | F_SEAL_SHRINK |
//! F_SEAL_GROW | F_SEAL_SEAL`: from then on nobody, the parent included, can change,
//! shrink or grow it). The pipeline hands the memfd itself to the workers
//! ([`shmpipe::PipelineBuilder::share_fd`], through each worker's control socket; never a
//! descriptor number, which another dataset may take a moment later); they check the
//! seals, map it read-only and validate it once. Every process maps the same pages: the
//! summed PSS of parent and workers stays about one dataset, whatever the number of
//! workers.
//!
//! # Layout (little-endian; offsets, never pointers)
//! ```text
//! offset        size                what
//! 0             128                 Header: magic "SHMPTSD1", version, section offsets and
//!                                   lengths, total length, frequency (a string ref)
//! series_off    40 * n_series       SeriesRec: start, forecast_start, first field, field
//!                                   count, flags, item_id string ref
//! fields_off    48 * n_fields       FieldRec: name string ref, ndim, dims[4], data offset
//!                                   (bytes into the data section, 64-aligned), length
//! strings_off   strings_len         UTF-8 bytes of names, item ids and the frequency
//! data_off      data_len            f32 values, each array 64-aligned (data_off 4096-aligned)
//! ```
//! [`SharedDataset::open_fd`] refuses a memfd without all four seals, then checks every
//! offset, length, shape and string of the whole layout against the mapping once
//! ([`Layout::parse`]); accessors still index with checked slicing.
//!
//! # Examples
//! ```
//! use shmpipe_timeseries::{jsonl, shared::SharedDataset};
//! let freq = "h".parse().unwrap();
//! let entries = jsonl::parse_lines(br#"{"start": "2021-01-01", "target": [1, 2, 3]}"#, freq).unwrap();
//! let ds = SharedDataset::create(&entries, freq).unwrap();
//! // A worker opens the memfd it received (see `rows::RowStore::shared`).
//! use std::os::fd::AsFd;
//! let again = SharedDataset::open_fd(ds.as_fd().try_clone_to_owned().unwrap()).unwrap();
//! assert_eq!(again.values(0, "target").unwrap(), Some(&[1.0f32, 2.0, 3.0][..]));
//! assert_eq!(again.entry(0).unwrap(), entries[0]);
//! ```

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

mod error;
pub(crate) mod memfd;

pub use error::SharedError;

use crate::entry::{DataEntry, FieldArray, MAX_NDIM};
use crate::period::{Freq, Period};

/// First bytes of a shared dataset.
pub const MAGIC: [u8; 8] = *b"SHMPTSD1";
/// Layout version; a different one is refused.
pub const VERSION: u32 = 1;
/// Name of the memfd (shown in `/proc/<pid>/maps` as `/memfd:<name> (deleted)`).
pub const MEMFD_NAME: &str = "shmpipe-ts-dataset";
const HEADER_SIZE: usize = std::mem::size_of::<Header>();
const SERIES_SIZE: usize = std::mem::size_of::<SeriesRec>();
const FIELD_SIZE: usize = std::mem::size_of::<FieldRec>();
/// Alignment of each array in the data section (a cache line).
const ARRAY_ALIGN: usize = 64;
const PAGE: usize = 4096;
const HAS_START: u32 = 1;
const HAS_FORECAST_START: u32 = 2;
const HAS_ITEM_ID: u32 = 4;

/// The header at offset 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
struct Header {
    magic: [u8; 8],
    version: u32,
    header_size: u32,
    n_series: u64,
    n_fields: u64,
    /// Byte offsets and lengths of the sections, from the start of the memfd.
    series_off: u64,
    fields_off: u64,
    strings_off: u64,
    strings_len: u64,
    /// 4096-aligned.
    data_off: u64,
    data_len: u64,
    /// Size of the memfd.
    total_len: u64,
    /// The frequency string (a ref into the strings section).
    freq: StrRef,
    creator_pid: u32,
    _pad: [u8; 20],
}

/// A UTF-8 string in the strings section: offset and length relative to `strings_off`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct StrRef {
    off: u32,
    len: u32,
}

/// One series.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
struct SeriesRec {
    /// Period ordinals (valid when the flags say so).
    start: i64,
    forecast_start: i64,
    /// Index of its first field in the field table; `first_field + n_fields <= header.n_fields`.
    first_field: u64,
    n_fields: u32,
    /// `HAS_START | HAS_FORECAST_START | HAS_ITEM_ID`.
    flags: u32,
    item_id: StrRef,
}

/// One named array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
struct FieldRec {
    name: StrRef,
    /// In range `0 ..= MAX_NDIM`; the product of `dims[..ndim]` is `len`.
    ndim: u32,
    _pad: u32,
    dims: [u32; 4],
    /// Byte offset into the data section, a multiple of 64.
    data_off: u64,
    /// Number of `f32` elements.
    len: u64,
}

fn corrupt(m: impl Into<String>) -> SharedError {
    SharedError::Corrupt(m.into())
}

/// `a + b <= limit`, without overflow.
fn fits(a: u64, b: u64, limit: u64) -> bool {
    a.checked_add(b).is_some_and(|end| end <= limit)
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// A validated view of a layout in some bytes (a mapping, or any slice in tests).
#[derive(Clone, Copy, Debug)]
pub struct Layout<'a> {
    bytes: &'a [u8],
    header: Header,
    freq: Freq,
}

impl<'a> Layout<'a> {
    /// Checks the whole layout in `bytes`: header, every section, every series, every
    /// field (name, shape, data range, alignment) and every string.
    ///
    /// # Errors
    /// [`SharedError::Corrupt`] naming the first problem; never a panic.
    pub fn parse(bytes: &'a [u8]) -> Result<Layout<'a>, SharedError> {
        let h: Header = bytemuck::pod_read_unaligned(
            bytes
                .get(..HEADER_SIZE)
                .ok_or_else(|| corrupt("shorter than the header"))?,
        );
        if h.magic != MAGIC {
            return Err(corrupt("bad magic"));
        }
        if h.version != VERSION || h.header_size as usize != HEADER_SIZE {
            return Err(corrupt(format!(
                "layout version {} (header {} bytes); this build reads version {VERSION}",
                h.version, h.header_size
            )));
        }
        let total = bytes.len() as u64;
        if h.total_len != total {
            return Err(corrupt(format!(
                "total_len {} but {total} bytes",
                h.total_len
            )));
        }
        let table = |off: u64, n: u64, size: usize, what: &str| -> Result<(), SharedError> {
            let len = n
                .checked_mul(size as u64)
                .ok_or_else(|| corrupt(format!("{what} table size overflows")))?;
            if !off.is_multiple_of(8) || !fits(off, len, total) {
                return Err(corrupt(format!("{what} table outside the mapping")));
            }
            Ok(())
        };
        table(h.series_off, h.n_series, SERIES_SIZE, "series")?;
        table(h.fields_off, h.n_fields, FIELD_SIZE, "field")?;
        if !fits(h.strings_off, h.strings_len, total) || h.strings_len > u64::from(u32::MAX) {
            return Err(corrupt("strings outside the mapping"));
        }
        if !h.data_off.is_multiple_of(PAGE as u64) || !fits(h.data_off, h.data_len, total) {
            return Err(corrupt("data section outside the mapping or misaligned"));
        }
        let mut l = Layout {
            bytes,
            header: h,
            freq: Freq {
                unit: crate::period::FreqUnit::Hour,
                multiple: 1,
            },
        };
        l.freq = l
            .str(h.freq)?
            .parse()
            .map_err(|e| corrupt(format!("frequency: {e}")))?;
        for i in 0..h.n_series as usize {
            let s = l.series(i)?;
            if !fits(s.first_field, u64::from(s.n_fields), h.n_fields) {
                return Err(corrupt(format!(
                    "series {i}: fields outside the field table"
                )));
            }
            if s.flags & HAS_ITEM_ID != 0 {
                l.str(s.item_id)?;
            }
        }
        for k in 0..h.n_fields as usize {
            let f = l.field(k)?;
            l.str(f.name)?;
            l.data(&f).map_err(|e| corrupt(format!("field {k}: {e}")))?;
        }
        Ok(l)
    }

    /// Number of series.
    pub fn len(&self) -> usize {
        self.header.n_series as usize
    }

    /// Whether there are no series.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frequency of the periods.
    pub fn freq(&self) -> Freq {
        self.freq
    }

    fn str(&self, r: StrRef) -> Result<&'a str, SharedError> {
        let h = &self.header;
        if !fits(u64::from(r.off), u64::from(r.len), h.strings_len) {
            return Err(corrupt("string outside the strings section"));
        }
        let start = (h.strings_off + u64::from(r.off)) as usize;
        let b = self
            .bytes
            .get(start..start + r.len as usize)
            .ok_or_else(|| corrupt("string outside the mapping"))?;
        std::str::from_utf8(b).map_err(|_| corrupt("string is not UTF-8"))
    }

    fn record<T: Pod>(&self, off: u64, i: usize, n: u64) -> Result<T, SharedError> {
        if i as u64 >= n {
            return Err(corrupt(format!("record {i} of {n}")));
        }
        let size = std::mem::size_of::<T>();
        let start = off as usize + i * size;
        // Read once into a local (the table was checked against the mapping).
        Ok(bytemuck::pod_read_unaligned(
            self.bytes
                .get(start..start + size)
                .ok_or_else(|| corrupt("record outside the mapping"))?,
        ))
    }

    fn series(&self, i: usize) -> Result<SeriesRec, SharedError> {
        self.record(self.header.series_off, i, self.header.n_series)
    }

    fn field(&self, k: usize) -> Result<FieldRec, SharedError> {
        self.record(self.header.fields_off, k, self.header.n_fields)
    }

    /// The values and shape of a field, checked against the data section.
    fn data<'f>(&self, f: &'f FieldRec) -> Result<(&'a [f32], &'f [u32]), SharedError> {
        let ndim = f.ndim as usize;
        if ndim > MAX_NDIM {
            return Err(corrupt(format!("{ndim} dimensions")));
        }
        let dims = &f.dims[..ndim];
        let product = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(u64::from(d)));
        if product != Some(f.len) {
            return Err(corrupt(format!("shape {dims:?} but {} values", f.len)));
        }
        let nbytes = f
            .len
            .checked_mul(4)
            .ok_or_else(|| corrupt("length overflows"))?;
        if !f.data_off.is_multiple_of(ARRAY_ALIGN as u64)
            || !fits(f.data_off, nbytes, self.header.data_len)
        {
            return Err(corrupt("values outside the data section or misaligned"));
        }
        let start = (self.header.data_off + f.data_off) as usize;
        let b = self
            .bytes
            .get(start..start + nbytes as usize)
            .ok_or_else(|| corrupt("values outside the mapping"))?;
        let v: &[f32] =
            bytemuck::try_cast_slice(b).map_err(|e| corrupt(format!("values: {e:?}")))?;
        Ok((v, dims))
    }

    fn check_index(&self, i: usize) -> Result<SeriesRec, SharedError> {
        if i >= self.len() {
            return Err(SharedError::OutOfRange {
                index: i,
                len: self.len(),
            });
        }
        self.series(i)
    }

    /// The values of field `name` of series `i`, in place (row-major); `None` if the
    /// series has no such field.
    ///
    /// # Errors
    /// Out-of-range `i`, or a corrupt layout.
    pub fn values(&self, i: usize, name: &str) -> Result<Option<&'a [f32]>, SharedError> {
        let s = self.check_index(i)?;
        for k in 0..s.n_fields as usize {
            let f = self.field(s.first_field as usize + k)?;
            if self.str(f.name)? == name {
                return Ok(Some(self.data(&f)?.0));
            }
        }
        Ok(None)
    }

    /// Series `i` as an owned entry (its arrays copied out of the mapping).
    ///
    /// # Errors
    /// Out-of-range `i`, or a corrupt layout.
    pub fn entry(&self, i: usize) -> Result<DataEntry, SharedError> {
        let s = self.check_index(i)?;
        let mut e = DataEntry::default();
        let period = |ordinal| Period {
            freq: self.freq,
            ordinal,
        };
        e.start = (s.flags & HAS_START != 0).then(|| period(s.start));
        e.forecast_start = (s.flags & HAS_FORECAST_START != 0).then(|| period(s.forecast_start));
        if s.flags & HAS_ITEM_ID != 0 {
            e.item_id = Some(Arc::from(self.str(s.item_id)?));
        }
        for k in 0..s.n_fields as usize {
            let f = self.field(s.first_field as usize + k)?;
            let (v, dims) = self.data(&f)?;
            let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
            e.insert(self.str(f.name)?, FieldArray::new(&shape, v.to_vec()));
        }
        Ok(e)
    }
}

/// The strings section while it is built: names and the frequency interned, item ids
/// appended as they come (they are mostly distinct).
#[derive(Default)]
struct Strings {
    bytes: Vec<u8>,
    interned: HashMap<String, StrRef>,
}

fn too_large(m: &str) -> SharedError {
    SharedError::TooLarge(m.to_owned())
}

impl Strings {
    /// Appends `s` (`what` names it in the error).
    fn push(&mut self, s: &str, what: &str) -> Result<StrRef, SharedError> {
        let r = StrRef {
            off: u32::try_from(self.bytes.len()).map_err(|_| too_large("strings over 4 GiB"))?,
            len: u32::try_from(s.len()).map_err(|_| too_large(&format!("{what} over 4 GiB")))?,
        };
        self.bytes.extend_from_slice(s.as_bytes());
        Ok(r)
    }

    /// `s`, appended once.
    fn intern(&mut self, s: &str) -> Result<StrRef, SharedError> {
        if let Some(r) = self.interned.get(s) {
            return Ok(*r);
        }
        let r = self.push(s, "string")?;
        self.interned.insert(s.to_owned(), r);
        Ok(r)
    }
}

/// Lays `entries` out: returns the header, tables and strings (everything before the
/// data section, padded to a page) and the data section's length.
fn plan(entries: &[DataEntry], freq: Freq) -> Result<(Vec<u8>, Vec<FieldRec>, usize), SharedError> {
    let mut strings = Strings::default();
    let freq_ref = strings.intern(&freq.to_string())?;
    let mut series = Vec::with_capacity(entries.len());
    let mut fields = Vec::new();
    let mut data_len = 0usize;
    for e in entries {
        let mut flags = 0;
        flags |= if e.start.is_some() { HAS_START } else { 0 };
        flags |= if e.forecast_start.is_some() {
            HAS_FORECAST_START
        } else {
            0
        };
        let item_id = match &e.item_id {
            Some(id) => {
                flags |= HAS_ITEM_ID;
                // Item ids are mostly distinct: not interned.
                strings.push(id, "item_id")?
            }
            None => StrRef::default(),
        };
        series.push(SeriesRec {
            start: e.start.map_or(0, |p| p.ordinal),
            forecast_start: e.forecast_start.map_or(0, |p| p.ordinal),
            first_field: fields.len() as u64,
            n_fields: u32::try_from(e.num_fields()).map_err(|_| too_large("fields"))?,
            flags,
            item_id,
        });
        for (name, a) in e.fields() {
            let mut dims = [1u32; 4];
            for (d, &s) in dims.iter_mut().zip(a.shape()) {
                *d = u32::try_from(s).map_err(|_| too_large("axis over 2^32"))?;
            }
            data_len = align_up(data_len, ARRAY_ALIGN);
            fields.push(FieldRec {
                name: strings.intern(name)?,
                ndim: a.ndim() as u32,
                _pad: 0,
                dims,
                data_off: data_len as u64,
                len: a.data().len() as u64,
            });
            data_len += a.nbytes();
        }
    }
    let head = head(freq_ref, &series, &fields, &strings.bytes, data_len);
    Ok((head, fields, data_len))
}

/// Everything before the data section: the header, the series and field tables and the
/// strings, padded to a page.
fn head(
    freq: StrRef,
    series: &[SeriesRec],
    fields: &[FieldRec],
    strings: &[u8],
    data_len: usize,
) -> Vec<u8> {
    let series_off = HEADER_SIZE;
    let fields_off = series_off + series.len() * SERIES_SIZE;
    let strings_off = fields_off + fields.len() * FIELD_SIZE;
    let data_off = align_up(strings_off + strings.len(), PAGE);
    let total = data_off + data_len;
    let header = Header {
        magic: MAGIC,
        version: VERSION,
        header_size: HEADER_SIZE as u32,
        n_series: series.len() as u64,
        n_fields: fields.len() as u64,
        series_off: series_off as u64,
        fields_off: fields_off as u64,
        strings_off: strings_off as u64,
        strings_len: strings.len() as u64,
        data_off: data_off as u64,
        data_len: data_len as u64,
        total_len: total as u64,
        freq,
        creator_pid: std::process::id(),
        _pad: [0; 20],
    };
    let mut head = Vec::with_capacity(data_off);
    head.extend_from_slice(bytemuck::bytes_of(&header));
    head.extend_from_slice(bytemuck::cast_slice(series));
    head.extend_from_slice(bytemuck::cast_slice(fields));
    head.extend_from_slice(strings);
    head.resize(data_off, 0);
    head
}

/// A dataset held once in a sealed memfd, mapped read-only.
#[derive(Debug)]
pub struct SharedDataset {
    /// The sealed memfd (shared with pipelines through [`AsFd`]).
    fd: OwnedFd,
    map: memmap2::Mmap,
    /// The header, read once at open (the memfd is sealed: it cannot change).
    n_series: usize,
    freq: Freq,
}

impl SharedDataset {
    /// Lays `entries` out in a new memfd, seals it and maps it read-only.
    ///
    /// # Errors
    /// [`SharedError::Os`] if the memfd cannot be created or reserved (`fallocate`:
    /// out of memory is an error here, never a SIGBUS later), or
    /// [`SharedError::TooLarge`].
    pub fn create(entries: &[DataEntry], freq: Freq) -> Result<SharedDataset, SharedError> {
        let (head, fields, data_len) = plan(entries, freq)?;
        let total = head.len() + data_len;
        let file = memfd::create(MEMFD_NAME, total as u64)?;
        {
            // SAFETY: the memfd is ours alone (anonymous, not yet shared, not sealed
            // against writes until this mapping is gone); it has `total` bytes.
            let mut w =
                unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| SharedError::Os {
                    what: "mmap memfd".into(),
                    source: e,
                })?;
            w[..head.len()].copy_from_slice(&head);
            let data = &mut w[head.len()..];
            let mut k = 0;
            for e in entries {
                for (_, a) in e.fields() {
                    let f = &fields[k];
                    let start = f.data_off as usize;
                    data[start..start + a.nbytes()].copy_from_slice(bytemuck::cast_slice(a.data()));
                    k += 1;
                }
            }
        }
        // No writable mapping is left: F_SEAL_WRITE can be applied.
        Self::open_fd(memfd::seal(OwnedFd::from(file))?)
    }

    /// Maps a sealed memfd read-only and validates its whole layout once.
    ///
    /// # Errors
    /// [`SharedError::NotSealed`] unless all four seals are set (only then can the
    /// bytes be trusted after one validation); [`SharedError::Corrupt`] for a bad
    /// layout; [`SharedError::Os`].
    pub fn open_fd(fd: OwnedFd) -> Result<SharedDataset, SharedError> {
        memfd::check_sealed(&fd)?;
        let file = File::from(fd);
        // Populated: every page is mapped at once (page-table entries to the one copy;
        // nothing is copied), so each mapper is charged its share of all of it.
        // SAFETY: the memfd is sealed against writes, shrinking and growing (checked
        // above, and the seals cannot be removed): its bytes cannot change and the
        // mapping cannot be truncated under us (no SIGBUS).
        let map = unsafe { memmap2::MmapOptions::new().populate().map(&file) }.map_err(|e| {
            SharedError::Os {
                what: "mmap shared dataset".into(),
                source: e,
            }
        })?;
        let l = Layout::parse(&map)?;
        let (n_series, freq) = (l.len(), l.freq());
        Ok(SharedDataset {
            fd: OwnedFd::from(file),
            map,
            n_series,
            freq,
        })
    }

    /// The validated layout.
    pub fn layout(&self) -> Layout<'_> {
        let h: Header = bytemuck::pod_read_unaligned(&self.map[..HEADER_SIZE]);
        Layout {
            bytes: &self.map,
            header: h,
            freq: self.freq,
        }
    }

    /// Number of series.
    pub fn len(&self) -> usize {
        self.n_series
    }

    /// Whether there are no series.
    pub fn is_empty(&self) -> bool {
        self.n_series == 0
    }

    /// Size of the memfd in bytes.
    pub fn size(&self) -> usize {
        self.map.len()
    }

    /// The frequency of the periods.
    pub fn freq(&self) -> Freq {
        self.freq
    }

    /// Field `name` of series `i`, read in place.
    ///
    /// # Errors
    /// See [`Layout::values`].
    pub fn values(&self, i: usize, name: &str) -> Result<Option<&[f32]>, SharedError> {
        self.layout().values(i, name)
    }

    /// Series `i` as an owned entry.
    ///
    /// # Errors
    /// See [`Layout::entry`].
    pub fn entry(&self, i: usize) -> Result<DataEntry, SharedError> {
        self.layout().entry(i)
    }

    /// The address range of the mapping (to find it in `/proc/<pid>/smaps`).
    pub fn mapping_range(&self) -> std::ops::Range<usize> {
        let start = self.map.as_ptr() as usize;
        start..start + self.map.len()
    }
}

impl AsFd for SharedDataset {
    /// The sealed memfd (to share it with a pipeline:
    /// [`PipelineBuilder::share_fd`](shmpipe::PipelineBuilder::share_fd)).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
