//! Messages: a tag and 1..n records, each a set of named arrays and small metadata values.
//!
//! # Encoding
//! A message body is a little-endian byte string, 8-byte aligned throughout:
//! ```text
//! body     := BodyHeader record*            BodyHeader = magic u32, tag u32, n_records u32, body_len u32,
//!                                                        block_refs u32 (arrays in pool blocks), reserved u32
//! record   := RecordHeader field*           RecordHeader = record_len u32, n_fields u32
//! field    := FieldHeader shape name str data
//!   FieldHeader (24 bytes) = kind u8, name_len u8, ndim u8, dtype u8, loc u8, pad[3], a u64, b u64
//!   shape    = ndim x u64                   (arrays only)
//!   name, str                               (str for kind Str only; b = its length), padded to 8
//!   data     = b bytes, padded to 8         (inline arrays only; a = offset of data in the body)
//! kind: 1 = i64 (a), 2 = f64 (a = bits), 3 = str, 4 = array
//! loc:  0 = inline in the body, 1 = in pool block a (b bytes from its start)
//! ```
//! Every field of this encoding is validated when read: lengths against the body, offsets
//! against the body or the pool, dtypes against the table, shapes against the byte length.

use std::borrow::Cow;
use std::marker::PhantomData;

use ndarray::{ArrayD, ArrayViewD, IxDyn};
use smallvec::SmallVec;

use crate::dtype::{DType, Element};
use crate::error::{Error, corrupt};
use crate::pool::{ArrayLoan, LoanToken};

pub(crate) const BODY_MAGIC: u32 = u32::from_le_bytes(*b"SRB1");
pub(crate) const BODY_HEADER: usize = 24;
pub(crate) const RECORD_HEADER: usize = 8;
pub(crate) const FIELD_HEADER: usize = 24;
const MAX_NDIM: usize = 16;

const KIND_I64: u8 = 1;
const KIND_F64: u8 = 2;
const KIND_STR: u8 = 3;
const KIND_ARRAY: u8 = 4;
pub(crate) const LOC_INLINE: u8 = 0;
pub(crate) const LOC_BLOCK: u8 = 1;

#[inline]
const fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue<'a> {
    /// An integer (ids, timestamps, counts).
    I64(i64),
    /// A float.
    F64(f64),
    /// A short string (at most 65,535 bytes).
    Str(Cow<'a, str>),
}

#[derive(Debug)]
pub(crate) enum ArraySrc<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
    Loan(Box<LoanToken>),
}

#[derive(Debug)]
pub(crate) enum FieldSrc<'a> {
    Meta(MetaValue<'a>),
    Array {
        dtype: DType,
        shape: SmallVec<[u64; 4]>,
        data: ArraySrc<'a>,
    },
}

#[derive(Debug)]
pub(crate) struct FieldB<'a> {
    pub name: Cow<'a, str>,
    pub src: FieldSrc<'a>,
}

/// Builds a message: a tag and one or more records of named arrays and metadata.
///
/// Arrays given by reference travel according to the sender's [`crate::Transfer`] policy
/// (copied inline, or copied once into a pool block that the consumer reads in place); loaned
/// arrays ([`crate::ArrayLoan`]) are always zero-copy.
///
/// # Examples
/// ```
/// use shm_ring::MessageBuilder;
/// let x = ndarray::arr2(&[[1.0f32, 2.0], [3.0, 4.0]]);
/// let msg = MessageBuilder::new()
///     .tag(7)
///     .meta_str("item_id", "A-17")
///     .meta_i64("start", 1_700_000_000)
///     .array("x", &x)
///     .next_record()
///     .meta_i64("start", 1_700_003_600);
/// assert_eq!(msg.records(), 2);
/// ```
#[derive(Debug, Default)]
pub struct MessageBuilder<'a> {
    pub(crate) tag: u32,
    pub(crate) fields: SmallVec<[FieldB<'a>; 2]>,
    /// Index in `fields` where each record after the first starts.
    pub(crate) record_starts: SmallVec<[u32; 2]>,
}

impl<'a> MessageBuilder<'a> {
    /// An empty message (one empty record, tag 0).
    #[inline]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the tag (free for the application: message kinds, sequence numbers, ...).
    #[inline]
    pub fn tag(mut self, tag: u32) -> Self {
        self.tag = tag;
        self
    }

    /// Number of records so far.
    #[inline]
    pub fn records(&self) -> usize {
        self.record_starts.len() + 1
    }

    /// Number of fields (arrays and metadata) over all records.
    #[inline]
    pub fn fields(&self) -> usize {
        self.fields.len()
    }

    /// Ends the current record and starts the next one.
    #[inline]
    pub fn next_record(mut self) -> Self {
        self.record_starts.push(self.fields.len() as u32);
        self
    }

    #[inline]
    fn push(mut self, name: impl Into<Cow<'a, str>>, src: FieldSrc<'a>) -> Self {
        self.fields.push(FieldB {
            name: name.into(),
            src,
        });
        self
    }

    /// Adds an integer.
    #[inline]
    pub fn meta_i64(self, name: impl Into<Cow<'a, str>>, v: i64) -> Self {
        self.push(name, FieldSrc::Meta(MetaValue::I64(v)))
    }

    /// Adds a float.
    #[inline]
    pub fn meta_f64(self, name: impl Into<Cow<'a, str>>, v: f64) -> Self {
        self.push(name, FieldSrc::Meta(MetaValue::F64(v)))
    }

    /// Adds a short string (at most 65,535 bytes; checked when sent).
    #[inline]
    pub fn meta_str(self, name: impl Into<Cow<'a, str>>, v: impl Into<Cow<'a, str>>) -> Self {
        self.push(name, FieldSrc::Meta(MetaValue::Str(v.into())))
    }

    /// Adds a metadata value.
    #[inline]
    pub fn meta(self, name: impl Into<Cow<'a, str>>, v: MetaValue<'a>) -> Self {
        self.push(name, FieldSrc::Meta(v))
    }

    /// Adds an array of any dimension. A standard-layout view is borrowed as it is; any other
    /// layout is first gathered into row-major order.
    #[inline]
    pub fn array<T, S, D>(
        self,
        name: impl Into<Cow<'a, str>>,
        a: &'a ndarray::ArrayBase<S, D>,
    ) -> Self
    where
        T: Element,
        S: ndarray::Data<Elem = T>,
        D: ndarray::Dimension,
    {
        let shape = a.shape().iter().map(|&d| d as u64).collect();
        let data = match a.as_slice() {
            Some(s) => ArraySrc::Borrowed(bytemuck::cast_slice(s)),
            None => ArraySrc::Owned(
                a.iter()
                    .flat_map(|x| bytemuck::bytes_of(x).to_vec())
                    .collect(),
            ),
        };
        self.push(
            name,
            FieldSrc::Array {
                dtype: T::DTYPE,
                shape,
                data,
            },
        )
    }

    /// Adds an array given as a row-major slice and a shape.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the shape does not match the slice length.
    #[inline]
    pub fn array_slice<T: Element>(
        self,
        name: impl Into<Cow<'a, str>>,
        shape: &[usize],
        data: &'a [T],
    ) -> Result<Self, Error> {
        self.array_raw(name, T::DTYPE, shape, bytemuck::cast_slice(data))
    }

    /// Adds an array whose dtype is only known at run time, as raw little-endian bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the byte length does not match shape and dtype.
    #[inline]
    pub fn array_raw(
        self,
        name: impl Into<Cow<'a, str>>,
        dtype: DType,
        shape: &[usize],
        bytes: &'a [u8],
    ) -> Result<Self, Error> {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n.and_then(|n| n.checked_mul(dtype.size())) != Some(bytes.len())
            || shape.len() > MAX_NDIM
        {
            return Err(Error::InvalidArgument(format!(
                "shape {shape:?} of {dtype} does not match {} bytes",
                bytes.len()
            )));
        }
        Ok(self.push(
            name,
            FieldSrc::Array {
                dtype,
                shape: shape.iter().map(|&d| d as u64).collect(),
                data: ArraySrc::Borrowed(bytes),
            },
        ))
    }

    /// Adds a boolean array (travels as one byte per element).
    #[inline]
    pub fn array_bool<S, D>(
        self,
        name: impl Into<Cow<'a, str>>,
        a: &ndarray::ArrayBase<S, D>,
    ) -> Self
    where
        S: ndarray::Data<Elem = bool>,
        D: ndarray::Dimension,
    {
        let shape = a.shape().iter().map(|&d| d as u64).collect();
        let bytes = a.iter().map(|&b| b as u8).collect();
        self.push(
            name,
            FieldSrc::Array {
                dtype: DType::Bool,
                shape,
                data: ArraySrc::Owned(bytes),
            },
        )
    }

    /// Adds a loaned array (zero-copy: the consumer reads the block it was written in).
    #[inline]
    pub fn array_loan<T: Element>(self, name: impl Into<Cow<'a, str>>, loan: ArrayLoan<T>) -> Self {
        let token = loan.token;
        let shape = token.shape.iter().map(|&d| d as u64).collect();
        self.push(
            name,
            FieldSrc::Array {
                dtype: T::DTYPE,
                shape,
                data: ArraySrc::Loan(Box::new(token)),
            },
        )
    }

    /// Fields of record `r` (for the encoder).
    pub(crate) fn record_range(&self, r: usize) -> std::ops::Range<usize> {
        let start = if r == 0 {
            0
        } else {
            self.record_starts[r - 1] as usize
        };
        let end = self
            .record_starts
            .get(r)
            .map_or(self.fields.len(), |&e| e as usize);
        start..end
    }
}

impl ArraySrc<'_> {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            ArraySrc::Borrowed(b) => b,
            ArraySrc::Owned(v) => v,
            ArraySrc::Loan(_) => &[],
        }
    }
    pub(crate) fn len(&self) -> usize {
        match self {
            ArraySrc::Loan(t) => t.bytes(),
            s => s.bytes().len(),
        }
    }
}

/// Where one array goes (decided by the sender per its transfer policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Not an array.
    None,
    /// Copied into the body.
    Inline,
    /// In pool block `n`.
    Block(u32),
}

fn field_size(f: &FieldB<'_>, place: Place) -> usize {
    let name = f.name.len();
    match &f.src {
        FieldSrc::Meta(MetaValue::Str(s)) => FIELD_HEADER + pad8(name + s.len()),
        FieldSrc::Meta(_) => FIELD_HEADER + pad8(name),
        FieldSrc::Array { shape, data, .. } => {
            let inline = if place == Place::Inline {
                pad8(data.len())
            } else {
                0
            };
            FIELD_HEADER + 8 * shape.len() + pad8(name) + inline
        }
    }
}

/// Names must be unique within a record (or two lookups of one name could disagree).
#[cold]
fn check_unique(m: &MessageBuilder<'_>) -> Result<(), Error> {
    for r in 0..m.records() {
        let fields = &m.fields[m.record_range(r)];
        for (i, f) in fields.iter().enumerate().skip(1) {
            if fields[..i].iter().any(|g| g.name == f.name) {
                return Err(Error::InvalidArgument(format!(
                    "field '{}' appears twice in record {r}: names must be unique per record",
                    f.name
                )));
            }
        }
    }
    Ok(())
}

/// Checks limits of the encoding (name and string lengths, dimensions) before encoding.
pub(crate) fn check_limits(m: &MessageBuilder<'_>) -> Result<(), Error> {
    if m.fields.len() > 1 {
        check_unique(m)?;
    }
    for f in &m.fields {
        if f.name.len() > 255 {
            return Err(Error::InvalidArgument(format!(
                "field name of {} bytes (limit 255)",
                f.name.len()
            )));
        }
        match &f.src {
            FieldSrc::Meta(MetaValue::Str(s)) if s.len() > 65535 => {
                return Err(Error::InvalidArgument(format!(
                    "metadata string '{}' of {} bytes (limit 65535)",
                    f.name,
                    s.len()
                )));
            }
            FieldSrc::Array { shape, .. } if shape.len() > MAX_NDIM => {
                return Err(Error::InvalidArgument(format!(
                    "array '{}' has {} dimensions (limit {MAX_NDIM})",
                    f.name,
                    shape.len()
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Encoded size of the body with the given placement of each field.
pub(crate) fn body_len(m: &MessageBuilder<'_>, places: &[Place]) -> usize {
    BODY_HEADER
        + RECORD_HEADER * m.records()
        + m.fields
            .iter()
            .zip(places)
            .map(|(f, &p)| field_size(f, p))
            .sum::<usize>()
}

/// Writes the body into `dst` (exactly `body_len` bytes, 8-aligned). Arrays placed in blocks
/// are only referenced here; the caller copies their data.
pub(crate) fn encode(m: &MessageBuilder<'_>, places: &[Place], dst: &mut [u8]) {
    let total = dst.len();
    let mut w = Writer { dst, pos: 0 };
    w.u32(BODY_MAGIC);
    w.u32(m.tag);
    w.u32(m.records() as u32);
    w.u32(total as u32);
    w.u32(
        places
            .iter()
            .filter(|p| matches!(p, Place::Block(_)))
            .count() as u32,
    );
    w.u32(0);
    for r in 0..m.records() {
        let range = m.record_range(r);
        let len = RECORD_HEADER
            + range
                .clone()
                .map(|i| field_size(&m.fields[i], places[i]))
                .sum::<usize>();
        w.u32(len as u32);
        w.u32(range.len() as u32);
        for i in range {
            let f = &m.fields[i];
            let name = f.name.as_bytes();
            match &f.src {
                FieldSrc::Meta(v) => {
                    let (kind, a, s): (u8, u64, &[u8]) = match v {
                        MetaValue::I64(x) => (KIND_I64, *x as u64, &[]),
                        MetaValue::F64(x) => (KIND_F64, x.to_bits(), &[]),
                        MetaValue::Str(s) => (KIND_STR, 0, s.as_bytes()),
                    };
                    w.bytes(&[kind, name.len() as u8, 0, 0, 0, 0, 0, 0]);
                    w.u64(a);
                    w.u64(s.len() as u64);
                    w.bytes(name);
                    w.bytes(s);
                    w.align8();
                }
                FieldSrc::Array { dtype, shape, data } => {
                    let (loc, a) = match places[i] {
                        Place::Block(b) => (LOC_BLOCK, b as u64),
                        _ => {
                            let data_at = w.pos + FIELD_HEADER + 8 * shape.len() + pad8(name.len());
                            (LOC_INLINE, data_at as u64)
                        }
                    };
                    w.bytes(&[
                        KIND_ARRAY,
                        name.len() as u8,
                        shape.len() as u8,
                        *dtype as u8,
                        loc,
                        0,
                        0,
                        0,
                    ]);
                    w.u64(a);
                    w.u64(data.len() as u64);
                    for &d in shape {
                        w.u64(d);
                    }
                    w.bytes(name);
                    w.align8();
                    if loc == LOC_INLINE {
                        debug_assert_eq!(w.pos as u64, a);
                        w.bytes(data.bytes());
                        w.align8();
                    }
                }
            }
        }
    }
    debug_assert_eq!(w.pos, total);
}

struct Writer<'d> {
    dst: &'d mut [u8],
    pos: usize,
}

impl Writer<'_> {
    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        self.dst[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
    #[inline]
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    #[inline]
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    #[inline]
    fn align8(&mut self) {
        let n = pad8(self.pos) - self.pos;
        self.dst[self.pos..self.pos + n].fill(0);
        self.pos += n;
    }
}

// ------------------------------------------------------------------------------------------
// Decoding

/// The pool a message's block references resolve against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolRef<'a> {
    pub base: *const u8,
    pub block_size: usize,
    pub blocks: u32,
    pub _life: PhantomData<&'a [u8]>,
}

impl<'a> PoolRef<'a> {
    /// A pool with no blocks (messages that reference one are corrupt).
    pub(crate) fn empty() -> Self {
        PoolRef {
            base: std::ptr::null(),
            block_size: 0,
            blocks: 0,
            _life: PhantomData,
        }
    }

    fn block(&self, idx: u64, len: u64) -> Result<&'a [u8], Error> {
        if idx >= self.blocks as u64 || len > self.block_size as u64 {
            return Err(corrupt(format!(
                "array in block {idx} of {len} bytes (pool: {} blocks of {} bytes)",
                self.blocks, self.block_size
            )));
        }
        // SAFETY: idx < blocks and len <= block_size, so the range lies inside the pool, which
        // is mapped for 'a (the lifetime of the guard or receiver that made this PoolRef). The
        // bytes are plain data: any value is a valid u8.
        Ok(unsafe {
            std::slice::from_raw_parts(self.base.add(idx as usize * self.block_size), len as usize)
        })
    }
}

/// Bodies up to this size are copied whole for an in-place read; larger ones get their
/// headers copied and their inline array data read in place.
const COPY_WHOLE: usize = 4096;

/// Copies a message body of `len` bytes at `src` (memory another process may write) into
/// `dst` for parsing: every header, name, string and shape byte is copied, each read once;
/// the data of large inline arrays is not (it is read in place, through [`DataRef`]). If the
/// source is inconsistent, the walk stops and the parser reports what it finds in `dst`
/// (private bytes either way).
///
/// # Safety
/// `src` must be valid for reads of `len` bytes; `dst.len() == len`.
#[inline]
pub(crate) unsafe fn copy_for_parse(src: *const u8, len: usize, dst: &mut [u8]) {
    debug_assert_eq!(dst.len(), len);
    let cp = |dst: &mut [u8], from: usize, to: usize| {
        let to = to.min(len);
        if from < to {
            // SAFETY: from < to <= len: inside both buffers (caller's contract).
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(from), dst.as_mut_ptr().add(from), to - from)
            };
        }
    };
    if len <= COPY_WHOLE {
        cp(dst, 0, len);
        return;
    }
    // SAFETY: forwarded contract.
    unsafe { copy_headers(src, len, dst) }
}

/// The large-body half of [`copy_for_parse`].
///
/// # Safety
/// As [`copy_for_parse`].
#[inline(never)]
unsafe fn copy_headers(src: *const u8, len: usize, dst: &mut [u8]) {
    let cp = |dst: &mut [u8], from: usize, to: usize| {
        let to = to.min(len);
        if from < to {
            // SAFETY: from < to <= len: inside both buffers (caller's contract).
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(from), dst.as_mut_ptr().add(from), to - from)
            };
        }
    };
    cp(dst, 0, BODY_HEADER);
    let n_records = rd_u32(dst, 8);
    let end = (rd_u32(dst, 12) as usize).min(len);
    let mut p = BODY_HEADER;
    for _ in 0..n_records {
        if p + RECORD_HEADER > end {
            break;
        }
        cp(dst, p, p + RECORD_HEADER);
        let rlen = rd_u32(dst, p) as usize;
        let n_fields = rd_u32(dst, p + 4);
        if rlen < RECORD_HEADER {
            break;
        }
        let rend = p.saturating_add(rlen).min(end);
        let mut q = p + RECORD_HEADER;
        for _ in 0..n_fields {
            if q + FIELD_HEADER > rend {
                break;
            }
            cp(dst, q, q + FIELD_HEADER);
            let (kind, name_len, ndim, loc) =
                (dst[q], dst[q + 1] as usize, dst[q + 2] as usize, dst[q + 4]);
            let b = rd_u64(dst, q + 16);
            let shape = if kind == KIND_ARRAY { 8 * ndim } else { 0 };
            let str_len = if kind == KIND_STR {
                b.min(65536) as usize
            } else {
                0
            };
            let head_end = (q + FIELD_HEADER + shape + pad8(name_len + str_len)).min(rend);
            cp(dst, q + FIELD_HEADER, head_end);
            q = head_end;
            if kind == KIND_ARRAY && loc == LOC_INLINE {
                let data = pad8(b.min(rend as u64) as usize);
                // The data itself is read in place (`DataRef`), never from the copy.
                q = q.saturating_add(data).min(rend);
            }
        }
        p = rend;
    }
}

#[inline]
fn rd_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}
#[inline]
fn rd_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// A received message read in place: valid while the borrow lasts.
///
/// Names, metadata, shapes and every other header value come from a private copy that no
/// other process can change. Array data is read where it lies (zero-copy): in a pool block, or
/// in the channel's ring for a large array copied inline. A hostile producer can change those
/// values while you read them, never their bounds (shape, length, location were validated on
/// the private copy).
#[derive(Debug, Clone, Copy)]
pub struct MessageView<'a> {
    body: &'a [u8],
    /// Where inline array data is read: `body.len()` bytes, the body itself or the
    /// peer-writable original it was copied from.
    data: DataRef<'a>,
    pool: PoolRef<'a>,
    tag: u32,
    records: u32,
    /// Arrays in pool blocks, as the sender counted them (0: no block to find or release).
    block_refs: u32,
}

/// The bytes inline array data is read from: `len` bytes at `ptr`, valid for `'a`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DataRef<'a> {
    ptr: *const u8,
    len: usize,
    _life: PhantomData<&'a [u8]>,
}

impl<'a> DataRef<'a> {
    /// Array data read from `body` itself (private bytes).
    #[inline]
    pub(crate) fn private(body: &'a [u8]) -> Self {
        DataRef {
            ptr: body.as_ptr(),
            len: body.len(),
            _life: PhantomData,
        }
    }

    /// Array data read from `len` bytes at `ptr`, which another process may write.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `len` bytes for `'a` (mapped, not unmapped meanwhile).
    #[inline]
    pub(crate) unsafe fn shared(ptr: *const u8, len: usize) -> Self {
        DataRef {
            ptr,
            len,
            _life: PhantomData,
        }
    }

    /// The array bytes `at..at + len`, bounds-checked.
    #[inline]
    fn slice(&self, at: usize, len: usize) -> Option<&'a [u8]> {
        if at.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: inside the `len` readable bytes (checked), valid for 'a (constructor). This
        // is a zero-copy array view: a hostile producer may change the values while they are
        // read (documented on `MessageView`); bounds and layout were validated on private bytes.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(at), len) })
    }
}

impl<'a> MessageView<'a> {
    /// Validates the body header (private bytes; inline array data is read from them too).
    pub(crate) fn parse(body: &'a [u8], pool: PoolRef<'a>) -> Result<Self, Error> {
        Self::parse_with(body, DataRef::private(body), pool)
    }

    /// Validates the body header of `body` (private bytes); inline array data is read from
    /// `data`, which must hold at least `body.len()` bytes laid out the same.
    #[inline]
    pub(crate) fn parse_with(
        body: &'a [u8],
        data: DataRef<'a>,
        pool: PoolRef<'a>,
    ) -> Result<Self, Error> {
        if data.len < body.len() {
            return Err(corrupt("message data shorter than its body"));
        }
        if body.len() < BODY_HEADER {
            return Err(corrupt(format!("message body of {} bytes", body.len())));
        }
        let magic = rd_u32(body, 0);
        if magic != BODY_MAGIC {
            return Err(corrupt(format!("message magic {magic:#x}")));
        }
        let len = rd_u32(body, 12) as usize;
        if len > body.len() || len < BODY_HEADER {
            return Err(corrupt(format!(
                "message claims {len} bytes, has {}",
                body.len()
            )));
        }
        Ok(MessageView {
            body: &body[..len],
            data,
            pool,
            tag: rd_u32(body, 4),
            records: rd_u32(body, 8),
            block_refs: rd_u32(body, 16),
        })
    }

    /// The tag given by the sender.
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records as usize
    }

    /// Whether the message has no record.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The records, in order; a record that fails validation ends the iteration with an error.
    pub fn records(&self) -> Records<'a> {
        Records {
            body: self.body,
            data: self.data,
            pool: self.pool,
            pos: BODY_HEADER,
            left: self.records,
        }
    }

    /// Record `i`.
    ///
    /// # Errors
    /// [`Error::NoSuchField`] past the end; [`Error::Corrupt`] on invalid encoding.
    pub fn record(&self, i: usize) -> Result<RecordView<'a>, Error> {
        self.records()
            .nth(i)
            .unwrap_or_else(|| Err(Error::NoSuchField(format!("record {i}"))))
    }

    /// Calls `f` with the index of every pool block the message references (all records),
    /// validating the whole encoding on the way. A message whose header counts no block
    /// reference is not scanned: if the sender lied, it only withholds its own blocks, and
    /// every access to an array is validated anyway.
    pub(crate) fn for_each_block(&self, f: impl FnMut(u32)) -> Result<(), Error> {
        if self.block_refs == 0 {
            return Ok(());
        }
        self.validate_all(f)
    }

    /// Parses and validates every record and field, calling `f` for every block reference.
    pub(crate) fn validate_all(&self, mut f: impl FnMut(u32)) -> Result<(), Error> {
        let mut names: SmallVec<[&str; 8]> = SmallVec::new();
        for r in self.records() {
            names.clear();
            for field in r?.fields() {
                let field = field?;
                let name = field.name_a();
                if names.contains(&name) {
                    return Err(duplicate(name));
                }
                names.push(name);
                if let FieldRef::Array(a) = field
                    && let Some(b) = a.block
                {
                    f(b);
                }
            }
        }
        Ok(())
    }

    /// The raw body bytes.
    pub fn body(&self) -> &'a [u8] {
        self.body
    }
}

/// Iterator over the records of a message.
#[derive(Debug)]
pub struct Records<'a> {
    body: &'a [u8],
    data: DataRef<'a>,
    pool: PoolRef<'a>,
    pos: usize,
    left: u32,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<RecordView<'a>, Error>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let b = self.body;
        let p = self.pos;
        if p + RECORD_HEADER > b.len() {
            self.left = 0;
            return Some(Err(corrupt("record header past the end of the body")));
        }
        let len = rd_u32(b, p) as usize;
        let n = rd_u32(b, p + 4);
        if len < RECORD_HEADER || !len.is_multiple_of(8) || len > b.len() - p {
            self.left = 0;
            return Some(Err(corrupt(format!("record of {len} bytes at {p}"))));
        }
        self.pos = p + len;
        Some(Ok(RecordView {
            body: b,
            data: self.data,
            start: p + RECORD_HEADER,
            end: p + len,
            fields: n,
            pool: self.pool,
        }))
    }
}

/// One record of a received message: named arrays and metadata.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    body: &'a [u8],
    data: DataRef<'a>,
    start: usize,
    end: usize,
    fields: u32,
    pool: PoolRef<'a>,
}

/// Description of an array in a record.
#[derive(Debug, Clone)]
pub struct ArrayInfo<'a> {
    /// Field name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape (row-major).
    pub shape: SmallVec<[usize; 4]>,
    /// Whether the data lives in its own pool block (zero-copy) rather than in the body.
    pub zero_copy: bool,
    /// The data.
    pub bytes: &'a [u8],
    block: Option<u32>,
}

/// One decoded field.
#[derive(Debug, Clone)]
pub enum FieldRef<'a> {
    /// Metadata.
    Meta(&'a str, MetaValue<'a>),
    /// An array.
    Array(ArrayInfo<'a>),
}

/// `Err` if a field named `name` (or a corrupt field) follows in `fields`.
#[inline(never)]
fn rest_has(mut fields: Fields<'_>, name: &str) -> Result<(), Error> {
    while let Some(g) = fields.find(name) {
        if g?.name() == name {
            return Err(duplicate(name));
        }
    }
    Ok(())
}

fn duplicate(name: &str) -> Error {
    corrupt(format!("field '{name}' appears twice in one record"))
}

impl<'a> FieldRef<'a> {
    fn name_a(&self) -> &'a str {
        match self {
            FieldRef::Meta(n, _) => n,
            FieldRef::Array(a) => a.name,
        }
    }
}

impl FieldRef<'_> {
    /// The field's name.
    pub fn name(&self) -> &str {
        match self {
            FieldRef::Meta(n, _) => n,
            FieldRef::Array(a) => a.name,
        }
    }
}

/// Iterator over the fields of a record.
#[derive(Debug)]
pub struct Fields<'a> {
    rec: RecordView<'a>,
    pos: usize,
    left: u32,
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<FieldRef<'a>, Error>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let r = self.parse();
        if r.is_err() {
            self.left = 0;
        }
        Some(r)
    }
}

impl<'a> Fields<'a> {
    /// Skips to the field called `name` reading only the headers of the fields before it
    /// (every skip is bounds-checked; anything odd falls back to the full parse, which reports
    /// it), then parses that field.
    #[inline]
    fn find(&mut self, name: &str) -> Option<Result<FieldRef<'a>, Error>> {
        let b = self.rec.body;
        let end = self.rec.end;
        while self.left > 0 {
            let p = self.pos;
            if p + FIELD_HEADER > end {
                return self.next();
            }
            let (kind, name_len, ndim, loc) =
                (b[p], b[p + 1] as usize, b[p + 2] as usize, b[p + 4]);
            let blen = rd_u64(b, p + 16);
            let name_at = p + FIELD_HEADER + if kind == KIND_ARRAY { 8 * ndim } else { 0 };
            let str_len = if kind == KIND_STR {
                blen.min(65536) as usize
            } else {
                0
            };
            let after = name_at + pad8(name_len + str_len);
            let data = if kind == KIND_ARRAY && loc == LOC_INLINE {
                pad8(blen.min(end as u64) as usize)
            } else {
                0
            };
            if after + data > end || !(KIND_I64..=KIND_ARRAY).contains(&kind) {
                return self.next();
            }
            if &b[name_at..name_at + name_len] == name.as_bytes() {
                return self.next();
            }
            self.pos = after + data;
            self.left -= 1;
        }
        None
    }

    fn parse(&mut self) -> Result<FieldRef<'a>, Error> {
        let b = self.rec.body;
        let p = self.pos;
        let end = self.rec.end;
        if p + FIELD_HEADER > end {
            return Err(corrupt(format!(
                "field header at {p} past record end {end}"
            )));
        }
        let h = &b[p..p + FIELD_HEADER];
        let (kind, name_len, ndim, dtype, loc) = (h[0], h[1] as usize, h[2] as usize, h[3], h[4]);
        let a = rd_u64(h, 8);
        let blen = rd_u64(h, 16);
        let name_at = p + FIELD_HEADER + if kind == KIND_ARRAY { 8 * ndim } else { 0 };
        let str_len = if kind == KIND_STR { blen as usize } else { 0 };
        if kind == KIND_STR && blen > 65535 {
            return Err(corrupt(format!("string of {blen} bytes")));
        }
        let after = name_at + pad8(name_len + str_len);
        if after > end {
            return Err(corrupt(format!("field at {p} overruns its record")));
        }
        let name = std::str::from_utf8(&b[name_at..name_at + name_len])
            .map_err(|_| corrupt(format!("field name at {p} is not UTF-8")))?;
        self.pos = after;
        match kind {
            KIND_I64 => Ok(FieldRef::Meta(name, MetaValue::I64(a as i64))),
            KIND_F64 => Ok(FieldRef::Meta(name, MetaValue::F64(f64::from_bits(a)))),
            KIND_STR => {
                let s = std::str::from_utf8(&b[name_at + name_len..name_at + name_len + str_len])
                    .map_err(|_| corrupt(format!("string '{name}' is not UTF-8")))?;
                Ok(FieldRef::Meta(name, MetaValue::Str(Cow::Borrowed(s))))
            }
            KIND_ARRAY => {
                let dtype = DType::from_code(dtype)
                    .ok_or_else(|| corrupt(format!("array '{name}': dtype code {dtype}")))?;
                if ndim > MAX_NDIM {
                    return Err(corrupt(format!("array '{name}': {ndim} dimensions")));
                }
                let mut shape = SmallVec::<[usize; 4]>::new();
                let mut n: u64 = 1;
                for d in 0..ndim {
                    let v = rd_u64(b, p + FIELD_HEADER + 8 * d);
                    n = n
                        .checked_mul(v)
                        .ok_or_else(|| corrupt(format!("array '{name}': shape overflows")))?;
                    shape.push(
                        usize::try_from(v)
                            .map_err(|_| corrupt(format!("array '{name}': dim {v}")))?,
                    );
                }
                if n.checked_mul(dtype.size() as u64) != Some(blen) {
                    return Err(corrupt(format!(
                        "array '{name}': shape {shape:?} of {dtype} does not match {blen} bytes"
                    )));
                }
                let (bytes, block) = match loc {
                    LOC_INLINE => {
                        let at = a as usize;
                        if a != after as u64 || blen > (end - after) as u64 || !a.is_multiple_of(8)
                        {
                            return Err(corrupt(format!(
                                "array '{name}': inline data at {a} (+{blen}) outside its record"
                            )));
                        }
                        self.pos = after + pad8(blen as usize);
                        if self.pos > end {
                            return Err(corrupt(format!("array '{name}' overruns its record")));
                        }
                        let bytes = self.rec.data.slice(at, blen as usize).ok_or_else(|| {
                            corrupt(format!("array '{name}': inline data outside the body"))
                        })?;
                        (bytes, None)
                    }
                    LOC_BLOCK => (self.rec.pool.block(a, blen)?, Some(a as u32)),
                    _ => return Err(corrupt(format!("array '{name}': location {loc}"))),
                };
                Ok(FieldRef::Array(ArrayInfo {
                    name,
                    dtype,
                    shape,
                    zero_copy: block.is_some(),
                    bytes,
                    block,
                }))
            }
            _ => Err(corrupt(format!("field kind {kind} at {p}"))),
        }
    }
}

impl<'a> RecordView<'a> {
    /// All fields, in the order they were added.
    pub fn fields(&self) -> Fields<'a> {
        Fields {
            rec: *self,
            pos: self.start,
            left: self.fields,
        }
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.fields as usize
    }

    /// Whether the record has no field.
    pub fn is_empty(&self) -> bool {
        self.fields == 0
    }

    fn find(&self, name: &str) -> Result<FieldRef<'a>, Error> {
        let mut fields = self.fields();
        while let Some(f) = fields.find(name) {
            let f = f?;
            if f.name() == name {
                // A second field of that name would make two lookups disagree (one field's
                // dtype, another's bytes): refuse the record.
                if fields.left > 0 {
                    rest_has(fields, name)?;
                }
                return Ok(f);
            }
        }
        Err(Error::NoSuchField(name.to_string()))
    }

    /// The elements of array `name` in row-major order, without building an ndarray view
    /// (the fastest access; the shape is in [`RecordView::array_info`]).
    ///
    /// # Errors
    /// As [`RecordView::array`].
    pub fn slice<T: Element>(&self, name: &str) -> Result<&'a [T], Error> {
        let a = self.array_info(name)?;
        if a.dtype != T::DTYPE {
            return Err(Error::DTypeMismatch {
                name: name.to_string(),
                found: a.dtype,
                expected: T::DTYPE,
            });
        }
        bytemuck::try_cast_slice(a.bytes).map_err(|e| corrupt(format!("array '{name}': {e:?}")))
    }

    /// Every array of the record.
    pub fn arrays(&self) -> impl Iterator<Item = Result<ArrayInfo<'a>, Error>> + 'a {
        self.fields().filter_map(|f| match f {
            Ok(FieldRef::Array(a)) => Some(Ok(a)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        })
    }

    /// Every metadata value of the record.
    pub fn metas(&self) -> impl Iterator<Item = Result<(&'a str, MetaValue<'a>), Error>> + 'a {
        self.fields().filter_map(|f| match f {
            Ok(FieldRef::Meta(n, v)) => Some(Ok((n, v))),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        })
    }

    /// The array `name` and its description.
    ///
    /// # Errors
    /// [`Error::NoSuchField`], [`Error::Corrupt`].
    pub fn array_info(&self, name: &str) -> Result<ArrayInfo<'a>, Error> {
        match self.find(name)? {
            FieldRef::Array(a) => Ok(a),
            FieldRef::Meta(..) => Err(Error::NoSuchField(format!("{name} (it is metadata)"))),
        }
    }

    /// The array `name` as an ndarray view.
    ///
    /// # Errors
    /// [`Error::NoSuchField`], [`Error::DTypeMismatch`], [`Error::Corrupt`] (also if the data is
    /// misaligned for `T`).
    pub fn array<T: Element>(&self, name: &str) -> Result<ArrayViewD<'a, T>, Error> {
        let a = self.array_info(name)?;
        if a.dtype != T::DTYPE {
            return Err(Error::DTypeMismatch {
                name: name.to_string(),
                found: a.dtype,
                expected: T::DTYPE,
            });
        }
        let data: &'a [T] = bytemuck::try_cast_slice(a.bytes)
            .map_err(|e| corrupt(format!("array '{name}': {e:?}")))?;
        ArrayViewD::from_shape(IxDyn(&a.shape), data)
            .map_err(|e| corrupt(format!("array '{name}': {e}")))
    }

    /// The boolean array `name`, checked (every byte must be 0 or 1) and copied.
    ///
    /// # Errors
    /// As [`RecordView::array`]; [`Error::Corrupt`] for a byte other than 0 or 1.
    pub fn array_bool(&self, name: &str) -> Result<ArrayD<bool>, Error> {
        let a = self.array_info(name)?;
        if a.dtype != DType::Bool {
            return Err(Error::DTypeMismatch {
                name: name.to_string(),
                found: a.dtype,
                expected: DType::Bool,
            });
        }
        let v = a
            .bytes
            .iter()
            .map(|&x| match x {
                0 => Ok(false),
                1 => Ok(true),
                x => Err(corrupt(format!("array '{name}': byte {x} is not a bool"))),
            })
            .collect::<Result<Vec<bool>, Error>>()?;
        ArrayD::from_shape_vec(IxDyn(&a.shape), v).map_err(|e| corrupt(e.to_string()))
    }

    /// The raw bytes of array `name` (any dtype).
    ///
    /// # Errors
    /// [`Error::NoSuchField`], [`Error::Corrupt`].
    pub fn array_bytes(&self, name: &str) -> Result<&'a [u8], Error> {
        Ok(self.array_info(name)?.bytes)
    }

    /// The metadata value `name`, if present and valid.
    pub fn meta(&self, name: &str) -> Option<MetaValue<'a>> {
        match self.find(name) {
            Ok(FieldRef::Meta(_, v)) => Some(v),
            _ => None,
        }
    }

    /// The integer metadata `name`.
    pub fn meta_i64(&self, name: &str) -> Option<i64> {
        match self.meta(name)? {
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The float metadata `name`.
    pub fn meta_f64(&self, name: &str) -> Option<f64> {
        match self.meta(name)? {
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string metadata `name`.
    pub fn meta_str(&self, name: &str) -> Option<&'a str> {
        match self.meta(name)? {
            MetaValue::Str(Cow::Borrowed(s)) => Some(s),
            _ => None,
        }
    }
}

/// Encodes a message with every array inline into a fresh, 8-aligned buffer (for tests,
/// tools and process-local use) and returns the buffer and the body length.
pub fn encode_inline(m: &MessageBuilder<'_>) -> Result<(Vec<u64>, usize), Error> {
    check_limits(m)?;
    if m.fields.iter().any(|f| {
        matches!(
            f.src,
            FieldSrc::Array {
                data: ArraySrc::Loan(_),
                ..
            }
        )
    }) {
        return Err(Error::InvalidArgument(
            "loaned arrays need a channel".into(),
        ));
    }
    let places: SmallVec<[Place; 8]> = m
        .fields
        .iter()
        .map(|f| match f.src {
            FieldSrc::Array { .. } => Place::Inline,
            _ => Place::None,
        })
        .collect();
    let len = body_len(m, &places);
    let mut buf = vec![0u64; len.div_ceil(8)];
    encode(m, &places, &mut bytemuck::cast_slice_mut(&mut buf)[..len]);
    Ok((buf, len))
}

/// Decodes a body made by [`encode_inline`] (or received): arrays in blocks are refused.
///
/// # Errors
/// [`Error::Corrupt`] on any invalid encoding.
pub fn decode(body: &[u8]) -> Result<MessageView<'_>, Error> {
    let v = MessageView::parse(body, PoolRef::empty())?;
    v.validate_all(|_| {})?;
    Ok(v)
}
