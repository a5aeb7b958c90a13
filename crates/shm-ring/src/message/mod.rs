//! Messages: a tag and 1..n records, each a set of named arrays and small metadata values.
//!
//! # Encoding
//! A message body is a little-endian byte string, 8-byte aligned throughout:
//! ```text
//! body     := BodyHeader record*            BodyHeader = magic u32, tag u32, n_records u32, body_len u32,
//!                                                        block_refs u32 (arrays in pool blocks), reserved u32
//! record   := RecordHeader field*           RecordHeader = record_len u32, n_fields u32, tag u64
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

use smallvec::SmallVec;

use crate::dtype::{DType, Element};
use crate::pool::{ArrayLoan, LoanToken};

pub(crate) const BODY_MAGIC: u32 = u32::from_le_bytes(*b"SRB2");
pub(crate) const BODY_HEADER: usize = 24;
pub(crate) const RECORD_HEADER: usize = 16;
pub(crate) const FIELD_HEADER: usize = 24;
const MAX_NDIM: usize = 16;

#[cfg(feature = "unstable-internals")]
/// Offsets of the message encoding's header fields (see the module doc), for tests and tools
/// that poke at a live channel: reached through `ChannelLayout::body_wire`. Not a stable API.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyWire {
    /// Body header (from the body's start), u32: `b"SRB2"`.
    pub magic: usize,
    /// Body header, u32: the message tag.
    pub tag: usize,
    /// Body header, u32: number of records.
    pub n_records: usize,
    /// Body header, u32: bytes of the body.
    pub len: usize,
    /// Body header, u32: arrays in pool blocks.
    pub block_refs: usize,
    /// Bytes of the body header (the first record header follows).
    pub header: usize,
    /// Record header (from the record's start), u32: bytes of the record, header included.
    pub record_len: usize,
    /// Record header, u32: number of fields.
    pub record_fields: usize,
    /// Record header, u64: the record tag.
    pub record_tag: usize,
    /// Bytes of a record header (its first field header follows).
    pub record_header: usize,
    /// Field header (from the field's start), u8: 1 i64, 2 f64, 3 str, 4 array.
    pub field_kind: usize,
    /// Field header, u8: bytes of the name.
    pub field_name_len: usize,
    /// Field header, u8: dimensions of an array.
    pub field_ndim: usize,
    /// Field header, u8: dtype code of an array.
    pub field_dtype: usize,
    /// Field header, u8: `loc_inline` or `loc_block`.
    pub field_loc: usize,
    /// Field header, u64: the value (i64, f64 bits), or where an array's data is (its offset
    /// in the body, or its block).
    pub field_a: usize,
    /// Field header, u64: bytes of a string or of an array's data.
    pub field_b: usize,
    /// Bytes of a field header: an array's shape follows, then the name (and a string's bytes).
    pub field_header: usize,
    /// Bytes of one shape entry (u64).
    pub dim: usize,
    /// Names, strings and inline data are each padded to a multiple of this.
    pub align: usize,
    /// `loc` of an array whose data follows its name in the body.
    pub loc_inline: u8,
    /// `loc` of an array in a pool block.
    pub loc_block: u8,
}

#[cfg(feature = "unstable-internals")]
/// Where each header field lies: the encoder (`encode.rs`) writes them in this order, the
/// decoder (`decode.rs`, `copy.rs`) reads them at these offsets.
pub(crate) const BODY_WIRE: BodyWire = BodyWire {
    magic: 0,
    tag: 4,
    n_records: 8,
    len: 12,
    block_refs: 16,
    header: BODY_HEADER,
    record_len: 0,
    record_fields: 4,
    record_tag: 8,
    record_header: RECORD_HEADER,
    field_kind: 0,
    field_name_len: 1,
    field_ndim: 2,
    field_dtype: 3,
    field_loc: 4,
    field_a: 8,
    field_b: 16,
    field_header: FIELD_HEADER,
    dim: 8,
    align: 8,
    loc_inline: LOC_INLINE,
    loc_block: LOC_BLOCK,
};
#[cfg(feature = "unstable-internals")]
const _: () = {
    // The last field of each header ends where the header does (a u32 pad after block_refs).
    assert!(BODY_WIRE.block_refs + 8 == BODY_HEADER);
    assert!(BODY_WIRE.record_tag + 8 == RECORD_HEADER);
    assert!(BODY_WIRE.field_b + 8 == FIELD_HEADER);
};

const KIND_I64: u8 = 1;
const KIND_F64: u8 = 2;
const KIND_STR: u8 = 3;
const KIND_ARRAY: u8 = 4;
pub(crate) const LOC_INLINE: u8 = 0;
pub(crate) const LOC_BLOCK: u8 = 1;

mod build_mut;
mod copy;
mod decode;
mod encode;
mod error;
mod inline;
mod unique;

pub(crate) use crate::pool::PoolRef;
pub(crate) use copy::copy_for_parse;
#[cfg(feature = "unstable-internals")]
pub use copy::read_in_place;
pub use decode::{ArrayInfo, FieldRef, Fields, MessageView, RecordView, Records};
pub(crate) use encode::{body_len, check_limits, encode};
pub use error::{DecodeError, EncodeError};

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
///     .meta_i64("start", 1_700_003_600); // two records
/// # drop(msg);
/// ```
#[derive(Debug, Default)]
pub struct MessageBuilder<'a> {
    pub(crate) tag: u32,
    pub(crate) fields: SmallVec<[FieldB<'a>; 2]>,
    /// Index in `fields` where each record after the first starts.
    pub(crate) record_starts: SmallVec<[u32; 2]>,
    /// Tag of each record that has one set (record index, tag); the rest are 0.
    pub(crate) record_tags: SmallVec<[(u32, u64); 2]>,
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
    pub(crate) fn len(&self) -> usize {
        self.record_starts.len() + 1
    }

    /// Sets the tag of the current record (free for the application, like the message tag;
    /// 0 unless set). Read back with [`RecordView::tag`](crate::RecordView::tag).
    #[inline]
    pub fn record_tag(mut self, tag: u64) -> Self {
        let r = self.record_starts.len() as u32;
        match self.record_tags.last_mut() {
            Some((last, t)) if *last == r => *t = tag,
            _ => self.record_tags.push((r, tag)),
        }
        self
    }

    /// The tag of record `r` (0 unless set).
    pub(crate) fn tag_of(&self, r: usize) -> u64 {
        self.record_tags
            .iter()
            .find(|(i, _)| *i as usize == r)
            .map_or(0, |&(_, t)| t)
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
    /// [`EncodeError::ShapeMismatch`] if the shape does not match the slice length,
    /// [`EncodeError::TooManyDims`].
    #[inline]
    pub fn array_slice<T: Element>(
        self,
        name: impl Into<Cow<'a, str>>,
        shape: &[usize],
        data: &'a [T],
    ) -> Result<Self, EncodeError> {
        self.array_raw(name, T::DTYPE, shape, bytemuck::cast_slice(data))
    }

    /// Adds an array whose dtype is only known at run time, as raw little-endian bytes.
    ///
    /// # Errors
    /// [`EncodeError::ShapeMismatch`] if the byte length does not match shape and dtype,
    /// [`EncodeError::TooManyDims`].
    #[inline]
    pub fn array_raw(
        self,
        name: impl Into<Cow<'a, str>>,
        dtype: DType,
        shape: &[usize],
        bytes: &'a [u8],
    ) -> Result<Self, EncodeError> {
        let name = name.into();
        error::check_array(&name, dtype, shape, bytes.len())?;
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

    /// Adds a loaned byte array that travels as a boolean array ([`DType::Bool`], zero-copy).
    /// Every byte must be 0 or 1: receivers that read it as bool refuse any other byte.
    #[inline]
    pub fn array_loan_bool(self, name: impl Into<Cow<'a, str>>, loan: ArrayLoan<u8>) -> Self {
        let token = loan.token;
        let shape = token.shape.iter().map(|&d| d as u64).collect();
        self.push(
            name,
            FieldSrc::Array {
                dtype: DType::Bool,
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
    /// In pool block (or large extent) `n`; before the send allocates it, [`NEW_BLOCK`] or
    /// [`NEW_EXTENT`] (never real indices: a channel's indices stay below them).
    Block(u32),
}

/// [`Place::Block`] of an array still to be copied into a new pool block.
pub(crate) const NEW_BLOCK: u32 = u32::MAX;
/// [`Place::Block`] of an array still to be copied into a new extent of the large size class.
pub(crate) const NEW_EXTENT: u32 = u32::MAX - 1;
