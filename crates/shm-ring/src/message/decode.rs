//! Reading a message body: validated views over private bytes (array data may be zero-copy).

use std::borrow::Cow;

use smallvec::SmallVec;

use super::*;
use crate::dtype::{DType, Element};
use crate::error::{Error, corrupt};
use crate::pool::PoolRef;
use crate::ring::bytes::ShmBytes;

mod record;

// ------------------------------------------------------------------------------------------
// Decoding

#[inline]
pub(super) fn rd_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}
#[inline]
pub(super) fn rd_u64(b: &[u8], at: usize) -> u64 {
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
    data: ShmBytes<'a>,
    pool: PoolRef<'a>,
    tag: u32,
    records: u32,
    /// Arrays in pool blocks, as the sender counted them (0: no block to find or release).
    block_refs: u32,
}

impl<'a> MessageView<'a> {
    /// Validates the body header (private bytes; inline array data is read from them too).
    pub(crate) fn parse(body: &'a [u8], pool: PoolRef<'a>) -> Result<Self, Error> {
        Self::parse_with(body, ShmBytes::private(body), pool)
    }

    /// Validates the body header of `body` (private bytes); inline array data is read from
    /// `data` (as many bytes as `body`, laid out the same: the body itself or the
    /// peer-writable original it was copied from).
    #[inline]
    pub(crate) fn parse_with(
        body: &'a [u8],
        data: ShmBytes<'a>,
        pool: PoolRef<'a>,
    ) -> Result<Self, Error> {
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

    /// The records, in order; a record that fails validation ends the iteration with a
    /// [`DecodeError`].
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
    /// [`FieldError::NoSuchRecord`](crate::FieldError::NoSuchRecord) past the end;
    /// [`FieldError::Corrupt`](crate::FieldError::Corrupt) on invalid encoding.
    pub fn record(&self, i: usize) -> Result<RecordView<'a>, crate::FieldError> {
        let len = self.len();
        match self.records().nth(i) {
            Some(r) => r.map_err(crate::FieldError::Corrupt),
            None => Err(crate::FieldError::NoSuchRecord { index: i, len }),
        }
    }

    /// Calls `f` with the index of every pool block the message references (all records),
    /// and the bytes of the array there, validating the whole encoding on the way. A message
    /// whose header counts no block reference is not scanned: if the sender lied, it only
    /// withholds its own blocks, and every access to an array is validated anyway.
    pub(crate) fn for_each_block(&self, f: impl FnMut(u32, usize)) -> Result<(), Error> {
        if self.block_refs == 0 {
            return Ok(());
        }
        self.validate_all(f)
    }

    /// Parses and validates every record and field, calling `f` for every block reference
    /// (block index, bytes of the array).
    pub(crate) fn validate_all(&self, mut f: impl FnMut(u32, usize)) -> Result<(), Error> {
        let mut names = super::unique::UniqueNames::default();
        for r in self.records() {
            names.clear();
            for field in r.map_err(DecodeError::into_internal)?.fields() {
                let field = field.map_err(DecodeError::into_internal)?;
                let name = field.name_a();
                if !names.insert(name) {
                    return Err(duplicate(name));
                }
                if let FieldRef::Array(a) = field
                    && let Some(b) = a.block
                {
                    f(b, a.bytes.len());
                }
            }
        }
        Ok(())
    }
}

/// Iterator over the records of a message.
#[derive(Debug)]
pub struct Records<'a> {
    body: &'a [u8],
    data: ShmBytes<'a>,
    pool: PoolRef<'a>,
    pos: usize,
    left: u32,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<RecordView<'a>, DecodeError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let b = self.body;
        let p = self.pos;
        if p + RECORD_HEADER > b.len() {
            self.left = 0;
            return Some(Err(DecodeError::Malformed(
                "record header past the end of the body".into(),
            )));
        }
        let len = rd_u32(b, p) as usize;
        let n = rd_u32(b, p + 4);
        let tag = rd_u64(b, p + 8);
        if len < RECORD_HEADER || !len.is_multiple_of(8) || len > b.len() - p {
            self.left = 0;
            return Some(Err(DecodeError::Malformed(format!(
                "record of {len} bytes at {p}"
            ))));
        }
        self.pos = p + len;
        Some(Ok(RecordView {
            body: b,
            data: self.data,
            start: p + RECORD_HEADER,
            end: p + len,
            fields: n,
            tag,
            pool: self.pool,
        }))
    }
}

/// One record of a received message: named arrays and metadata.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    body: &'a [u8],
    data: ShmBytes<'a>,
    start: usize,
    end: usize,
    fields: u32,
    tag: u64,
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
    /// The data, where it lies in shared memory (a pool block, or the ring for a large
    /// in-place read): a hostile producer may change these values while you read them, never
    /// their length or location.
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
        if g.map_err(DecodeError::into_internal)?.name() == name {
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
    type Item = Result<FieldRef<'a>, DecodeError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let r = self.parse().map_err(DecodeError::from_internal);
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
    fn find(&mut self, name: &str) -> Option<Result<FieldRef<'a>, DecodeError>> {
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
        let h = FieldHeader::read(&b[p..p + FIELD_HEADER]);
        let name_at = p + FIELD_HEADER + if h.kind == KIND_ARRAY { 8 * h.ndim } else { 0 };
        let str_len = if h.kind == KIND_STR {
            h.blen as usize
        } else {
            0
        };
        if h.kind == KIND_STR && h.blen > 65535 {
            return Err(corrupt(format!("string of {} bytes", h.blen)));
        }
        let after = name_at + pad8(h.name_len + str_len);
        if after > end {
            return Err(corrupt(format!("field at {p} overruns its record")));
        }
        let name = std::str::from_utf8(&b[name_at..name_at + h.name_len])
            .map_err(|_| corrupt(format!("field name at {p} is not UTF-8")))?;
        self.pos = after;
        match h.kind {
            KIND_I64 => Ok(FieldRef::Meta(name, MetaValue::I64(h.a as i64))),
            KIND_F64 => Ok(FieldRef::Meta(name, MetaValue::F64(f64::from_bits(h.a)))),
            KIND_STR => {
                let at = name_at + h.name_len;
                let s = std::str::from_utf8(&b[at..at + str_len])
                    .map_err(|_| corrupt(format!("string '{name}' is not UTF-8")))?;
                Ok(FieldRef::Meta(name, MetaValue::Str(Cow::Borrowed(s))))
            }
            KIND_ARRAY => self.parse_array(&h, name, p, after),
            kind => Err(corrupt(format!("field kind {kind} at {p}"))),
        }
    }

    /// The rest of an array field whose header `h` is at `p` and whose name (`name`) ends at
    /// `after`: its dtype, its shape (checked against its byte length), and where its data is.
    /// It and its helpers are always inlined into `parse`, their only caller, as when they
    /// were part of it (out of line, they cost one 16-float message ~28-54 instructions more).
    #[inline(always)]
    fn parse_array(
        &mut self,
        h: &FieldHeader,
        name: &'a str,
        p: usize,
        after: usize,
    ) -> Result<FieldRef<'a>, Error> {
        let dtype = DType::from_code(h.dtype)
            .ok_or_else(|| corrupt(format!("array '{name}': dtype code {}", h.dtype)))?;
        if h.ndim > MAX_NDIM {
            return Err(corrupt(format!("array '{name}': {} dimensions", h.ndim)));
        }
        let (shape, n) = self.array_shape(name, p, h.ndim)?;
        let blen = h.blen;
        if n.checked_mul(dtype.size() as u64) != Some(blen) {
            return Err(corrupt(format!(
                "array '{name}': shape {shape:?} of {dtype} does not match {blen} bytes"
            )));
        }
        let (bytes, block) = match h.loc {
            LOC_INLINE => (self.inline_data(name, after, h.a, blen)?, None),
            LOC_BLOCK => (self.rec.pool.block(h.a, blen)?, Some(h.a as u32)),
            loc => return Err(corrupt(format!("array '{name}': location {loc}"))),
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

    /// The shape of the array field at `p` (`ndim` dimensions, at most [`MAX_NDIM`]) and its
    /// element count, which must not overflow.
    #[inline(always)]
    fn array_shape(
        &self,
        name: &str,
        p: usize,
        ndim: usize,
    ) -> Result<(SmallVec<[usize; 4]>, u64), Error> {
        let b = self.rec.body;
        let mut shape = SmallVec::<[usize; 4]>::new();
        let mut n: u64 = 1;
        for d in 0..ndim {
            let v = rd_u64(b, p + FIELD_HEADER + 8 * d);
            n = n
                .checked_mul(v)
                .ok_or_else(|| corrupt(format!("array '{name}': shape overflows")))?;
            shape
                .push(usize::try_from(v).map_err(|_| corrupt(format!("array '{name}': dim {v}")))?);
        }
        Ok((shape, n))
    }

    /// The data of an inline array: `blen` bytes at `a`, which must be where its field's
    /// name ends (`after`), 8-aligned, inside the record. Moves past the data.
    #[inline(always)]
    fn inline_data(
        &mut self,
        name: &str,
        after: usize,
        a: u64,
        blen: u64,
    ) -> Result<&'a [u8], Error> {
        let end = self.rec.end;
        let at = a as usize;
        if a != after as u64 || blen > (end - after) as u64 || !a.is_multiple_of(8) {
            return Err(corrupt(format!(
                "array '{name}': inline data at {a} (+{blen}) outside its record"
            )));
        }
        self.pos = after + pad8(blen as usize);
        if self.pos > end {
            return Err(corrupt(format!("array '{name}' overruns its record")));
        }
        // at + blen <= end <= body length (checked just above); the view
        // checks it again against the data's own bounds.
        self.rec
            .data
            .view(at, blen as usize)
            .ok_or_else(|| corrupt(format!("array '{name}': inline data outside the body")))
    }
}

/// The words of a field header, as read (nothing checked yet).
struct FieldHeader {
    kind: u8,
    name_len: usize,
    ndim: usize,
    dtype: u8,
    loc: u8,
    /// The value of a number, or where an array's data is (inline offset or block index).
    a: u64,
    /// A string's or an array's byte length.
    blen: u64,
}

impl FieldHeader {
    /// Reads the `FIELD_HEADER` bytes `h`.
    #[inline(always)]
    fn read(h: &[u8]) -> FieldHeader {
        FieldHeader {
            kind: h[0],
            name_len: h[1] as usize,
            ndim: h[2] as usize,
            dtype: h[3],
            loc: h[4],
            a: rd_u64(h, 8),
            blen: rd_u64(h, 16),
        }
    }
}
/// Decodes a body made by [`encode_inline`] (or received): arrays in blocks are refused.
///
/// # Errors
/// [`DecodeError::Malformed`](DecodeError::Malformed) on any invalid encoding.
pub fn decode(body: &[u8]) -> Result<MessageView<'_>, DecodeError> {
    let v = MessageView::parse(body, PoolRef::empty()).map_err(DecodeError::from_internal)?;
    v.validate_all(|_, _| {})
        .map_err(DecodeError::from_internal)?;
    Ok(v)
}
