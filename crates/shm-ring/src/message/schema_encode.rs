//! Data-only message bodies for channels with a [`Schema`]: the schema (names, dtypes, ranks,
//! fixed shapes) is in the segment once, so a body carries only what varies.
//!
//! ```text
//! body   := Header record*        Header (24) = magic u32 "SRD1", tag u32, n_records u32,
//!                                               body_len u32, block_refs u32, n_fields u32
//! record := value*                one per schema field, in schema order
//! array  := dims ArrayRef data    dims = rank x u64, for `array_dyn` fields only
//!   ArrayRef (16) = loc u32 (0 inline, 1 block), block u32, len u64 (bytes)
//!   data          = len bytes padded to 8 (inline only; they follow the ArrayRef)
//! meta   := MetaRef str           MetaRef (16) = kind u32 (1 i64, 2 f64, 3 str), str_len u32,
//!                                                value u64 (i64, f64 bits; 0 for str)
//!   str           = str_len bytes padded to 8
//! ```
//! The receiver checks every value against its private copy of the schema
//! (`message::schema_decode`).

use smallvec::SmallVec;

use super::{ArraySrc, LOC_BLOCK, LOC_INLINE, MetaValue, Place, pad8};
use crate::dtype::{DType, Element};
use crate::error::Error;
use crate::pool::{ArrayLoan, LoanToken};
use crate::schema::{FieldError, FieldId, FieldKind, Schema};

/// Magic of a data-only body (a self-describing body starts with `SRB2`).
pub(crate) const DATA_MAGIC: u32 = u32::from_le_bytes(*b"SRD1");
/// Bytes of the body header.
pub const DATA_HEADER: usize = 24;
/// Body header offsets (from the body's start).
pub const DATA_MAGIC_AT: usize = 0;
/// u32 tag.
pub const DATA_TAG_AT: usize = 4;
/// u32 number of records.
pub const DATA_RECORDS_AT: usize = 8;
/// u32 bytes of the body.
pub const DATA_LEN_AT: usize = 12;
/// u32 arrays in pool blocks.
pub const DATA_BLOCK_REFS_AT: usize = 16;
/// u32 fields per record (the schema's length).
pub const DATA_FIELDS_AT: usize = 20;
/// Bytes of an array reference (after the dims of a dynamic array).
pub const ARRAY_REF: usize = 16;
/// ArrayRef offsets: u32 loc.
pub const ARRAY_LOC_AT: usize = 0;
/// u32 block index (loc 1).
pub const ARRAY_BLOCK_AT: usize = 4;
/// u64 byte length.
pub const ARRAY_LEN_AT: usize = 8;
/// Bytes of a metadata reference.
pub const META_REF: usize = 16;
/// MetaRef offsets: u32 kind.
pub const META_KIND_AT: usize = 0;
/// u32 string length.
pub const META_STR_LEN_AT: usize = 4;
/// u64 value.
pub const META_VALUE_AT: usize = 8;
/// Meta kinds.
pub const META_I64: u32 = 1;
/// f64 (bits).
pub const META_F64: u32 = 2;
/// A string.
pub const META_STR: u32 = 3;
/// Most dimensions of a data-only array.
pub const DATA_MAX_NDIM: usize = 16;
const _: () = assert!(DATA_FIELDS_AT + 4 == DATA_HEADER);

#[derive(Debug)]
pub(crate) enum PosVal<'a> {
    Meta(MetaValue<'a>),
    Array {
        dtype: DType,
        shape: SmallVec<[u64; 4]>,
        data: ArraySrc<'a>,
    },
}

/// Builds a message for a channel with a [`Schema`]: fields are filled by position
/// ([`FieldId`], found once with [`Schema::field`]); only values travel, no names or dtypes.
/// Every field of every record must be set; [`Sender::send`](crate::Sender::send) checks each
/// against the channel's schema.
///
/// # Examples
/// ```
/// use shm_ring::{ChannelConfig, DType, Receiver, Schema, SchemaMessage, Sender};
/// let schema = Schema::new().array("x", DType::F32, &[4]).meta("id");
/// let (x, id) = (schema.field("x")?, schema.field("id")?);
/// let name = format!("doc-pos-{}", std::process::id());
/// let mut tx = Sender::with_schema(&name, &ChannelConfig::default(), &schema)?;
/// let mut rx = Receiver::open(&name)?;
/// let data = [1.0f32, 2.0, 3.0, 4.0];
/// tx.send(SchemaMessage::new(&schema).slice(x, &data).meta_i64(id, 17))?;
/// rx.recv_positional(1, None, |m| {
///     let r = m.record(0).unwrap();
///     assert_eq!(r.slice::<f32>(x).unwrap(), &data);
///     assert_eq!(r.meta_i64(id).unwrap(), 17);
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SchemaMessage<'a> {
    pub(crate) tag: u32,
    pub(crate) n_fields: usize,
    /// A [`FieldId`] past the schema that was given (refused at send).
    pub(crate) bad_field: Option<usize>,
    /// `n_fields` values per record, record after record.
    pub(crate) vals: SmallVec<[Option<PosVal<'a>>; 2]>,
}

impl<'a> SchemaMessage<'a> {
    /// An empty message (one record, no field set) for `schema`.
    pub fn new(schema: &Schema) -> Self {
        let n = schema.len();
        let mut vals = SmallVec::with_capacity(n);
        vals.extend((0..n).map(|_| None));
        SchemaMessage {
            tag: 0,
            n_fields: n,
            bad_field: None,
            vals,
        }
    }

    /// Sets the message tag.
    pub fn tag(mut self, tag: u32) -> Self {
        self.tag = tag;
        self
    }

    /// Number of records so far.
    pub fn len(&self) -> usize {
        self.vals.len().checked_div(self.n_fields).unwrap_or(1)
    }

    /// Always false: a message has at least one record.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Ends the current record and starts the next one.
    pub fn next_record(mut self) -> Self {
        self.vals.extend((0..self.n_fields).map(|_| None));
        self
    }

    fn set(mut self, f: FieldId, v: PosVal<'a>) -> Self {
        let base = self.vals.len() - self.n_fields;
        // An id past the schema is kept aside as an error for `send` (`check`).
        if f.index() < self.n_fields {
            self.vals[base + f.index()] = Some(v);
        } else {
            self.bad_field = Some(f.index());
        }
        self
    }

    /// Sets an integer metadata field.
    pub fn meta_i64(self, f: FieldId, v: i64) -> Self {
        self.set(f, PosVal::Meta(MetaValue::I64(v)))
    }

    /// Sets a float metadata field.
    pub fn meta_f64(self, f: FieldId, v: f64) -> Self {
        self.set(f, PosVal::Meta(MetaValue::F64(v)))
    }

    /// Sets a string metadata field (at most 65,535 bytes).
    pub fn meta_str(self, f: FieldId, v: &'a str) -> Self {
        self.set(f, PosVal::Meta(MetaValue::Str(v.into())))
    }

    /// Sets an array field from an ndarray (standard layout borrowed, others gathered).
    pub fn array<T, S, D>(self, f: FieldId, a: &'a ndarray::ArrayBase<S, D>) -> Self
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
        self.set(
            f,
            PosVal::Array {
                dtype: T::DTYPE,
                shape,
                data,
            },
        )
    }

    /// Sets a one-dimensional array field from a slice (shape `[len]`).
    pub fn slice<T: Element>(self, f: FieldId, data: &'a [T]) -> Self {
        self.set(
            f,
            PosVal::Array {
                dtype: T::DTYPE,
                shape: smallvec::smallvec![data.len() as u64],
                data: ArraySrc::Borrowed(bytemuck::cast_slice(data)),
            },
        )
    }

    /// Sets an array field from a row-major slice and a shape (checked at send).
    pub fn slice_shaped<T: Element>(self, f: FieldId, shape: &[usize], data: &'a [T]) -> Self {
        self.set(
            f,
            PosVal::Array {
                dtype: T::DTYPE,
                shape: shape.iter().map(|&d| d as u64).collect(),
                data: ArraySrc::Borrowed(bytemuck::cast_slice(data)),
            },
        )
    }

    /// Sets an array field to a loaned array (zero-copy).
    pub fn loan<T: Element>(self, f: FieldId, loan: ArrayLoan<T>) -> Self {
        let token: LoanToken = loan.token;
        let shape = token.shape.iter().map(|&d| d as u64).collect();
        self.set(
            f,
            PosVal::Array {
                dtype: T::DTYPE,
                shape,
                data: ArraySrc::Loan(Box::new(token)),
            },
        )
    }

    /// Checks every value against `schema`: each field set, of the right kind, dtype, rank,
    /// shape (fixed shapes) and byte length.
    pub(crate) fn check(&self, schema: &Schema) -> Result<(), Error> {
        if let Some(index) = self.bad_field {
            return Err(Error::Field(FieldError::OutOfRange {
                index,
                len: schema.len(),
            }));
        }
        if self.n_fields != schema.len() {
            return Err(Error::InvalidArgument(format!(
                "a SchemaMessage built for a schema of {} fields, sent on one of {}",
                self.n_fields,
                schema.len()
            )));
        }
        for (i, v) in self.vals.iter().enumerate() {
            let spec = &schema.fields()[i % self.n_fields];
            let name = &spec.name;
            let wrong = |found: String| {
                Error::Field(FieldError::WrongType {
                    name: name.clone(),
                    expected: spec_text(&spec.kind),
                    found,
                })
            };
            match (v, &spec.kind) {
                (None, _) => {
                    return Err(Error::Field(FieldError::Missing {
                        name: name.clone(),
                        record: i / self.n_fields,
                    }));
                }
                (Some(PosVal::Meta(MetaValue::Str(s))), FieldKind::Meta) if s.len() > 65535 => {
                    return Err(Error::InvalidArgument(format!(
                        "metadata string '{name}' of {} bytes (limit 65535)",
                        s.len()
                    )));
                }
                (Some(PosVal::Meta(_)), FieldKind::Meta) => {}
                (Some(PosVal::Meta(_)), _) => return Err(wrong("metadata".into())),
                (Some(PosVal::Array { dtype, shape, .. }), FieldKind::Meta) => {
                    return Err(wrong(format!("{dtype} array of shape {shape:?}")));
                }
                (
                    Some(PosVal::Array { dtype, shape, data }),
                    FieldKind::Array {
                        dtype: want,
                        rank,
                        shape: fixed,
                    },
                ) => {
                    let fixed_ok = fixed.as_ref().is_none_or(|f| {
                        f.len() == shape.len() && f.iter().zip(shape).all(|(&a, &b)| a as u64 == b)
                    });
                    if dtype != want || shape.len() != *rank || !fixed_ok {
                        return Err(wrong(format!("{dtype} array of shape {shape:?}")));
                    }
                    if shape.len() > DATA_MAX_NDIM {
                        return Err(Error::InvalidArgument(format!(
                            "array '{name}' has {} dimensions (limit {DATA_MAX_NDIM})",
                            shape.len()
                        )));
                    }
                    let n = shape
                        .iter()
                        .try_fold(dtype.size() as u64, |a, &d| a.checked_mul(d));
                    if n != Some(data.len() as u64) {
                        return Err(Error::InvalidArgument(format!(
                            "array '{name}': shape {shape:?} of {dtype} does not match {} bytes",
                            data.len()
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

fn spec_text(k: &FieldKind) -> String {
    match k {
        FieldKind::Meta => "metadata".into(),
        FieldKind::Array {
            dtype,
            shape: Some(s),
            ..
        } => format!("{dtype} array of shape {s:?}"),
        FieldKind::Array { dtype, rank, .. } => format!("{dtype} array of rank {rank}"),
    }
}

fn dyn_rank(k: &FieldKind) -> usize {
    match k {
        FieldKind::Array {
            rank, shape: None, ..
        } => *rank,
        _ => 0,
    }
}

/// Bytes of the body with the given placement of each value (`check`ed message).
pub(crate) fn data_body_len(m: &SchemaMessage<'_>, schema: &Schema, places: &[Place]) -> usize {
    let mut n = DATA_HEADER;
    for (i, v) in m.vals.iter().enumerate() {
        let kind = &schema.fields()[i % m.n_fields].kind;
        n += match v {
            Some(PosVal::Meta(MetaValue::Str(s))) => META_REF + pad8(s.len()),
            Some(PosVal::Meta(_)) => META_REF,
            Some(PosVal::Array { data, .. }) => {
                8 * dyn_rank(kind)
                    + ARRAY_REF
                    + if places[i] == Place::Inline {
                        pad8(data.len())
                    } else {
                        0
                    }
            }
            None => 0,
        };
    }
    n
}

/// Writes the data-only body of a `check`ed message into `total` bytes at `dst`.
///
/// # Safety
/// `dst` must be valid for writes of `total` bytes, 8-aligned, and `total` must be
/// `data_body_len`. It may be shared memory: it is written through the pointer only.
pub(crate) unsafe fn encode_data_raw(
    m: &SchemaMessage<'_>,
    schema: &Schema,
    places: &[Place],
    dst: *mut u8,
    total: usize,
) {
    let mut w = super::encode::Writer::new(dst, total);
    let blocks = places
        .iter()
        .filter(|p| matches!(p, Place::Block(_)))
        .count();
    w.u32(DATA_MAGIC);
    w.u32(m.tag);
    w.u32(m.len() as u32);
    w.u32(total as u32);
    w.u32(blocks as u32);
    w.u32(m.n_fields as u32);
    for (i, v) in m.vals.iter().enumerate() {
        let kind = &schema.fields()[i % m.n_fields].kind;
        match v {
            Some(PosVal::Meta(v)) => {
                let (k, val, s): (u32, u64, &[u8]) = match v {
                    MetaValue::I64(x) => (META_I64, *x as u64, &[]),
                    MetaValue::F64(x) => (META_F64, x.to_bits(), &[]),
                    MetaValue::Str(s) => (META_STR, 0, s.as_bytes()),
                };
                w.u32(k);
                w.u32(s.len() as u32);
                w.u64(val);
                w.bytes(s);
                w.align8();
            }
            Some(PosVal::Array { shape, data, .. }) => {
                if dyn_rank(kind) > 0 {
                    for &d in shape {
                        w.u64(d);
                    }
                }
                match places[i] {
                    Place::Block(b) => {
                        w.u32(LOC_BLOCK as u32);
                        w.u32(b);
                        w.u64(data.len() as u64);
                    }
                    _ => {
                        w.u32(LOC_INLINE as u32);
                        w.u32(0);
                        w.u64(data.len() as u64);
                        w.bytes(data.bytes());
                        w.align8();
                    }
                }
            }
            None => {}
        }
    }
    debug_assert_eq!(w.pos(), total);
}

/// Encodes a `check`ed message with every array inline into a fresh 8-aligned buffer (tests,
/// tools); returns the buffer and the body length.
pub fn encode_data_inline(
    m: &SchemaMessage<'_>,
    schema: &Schema,
) -> Result<(Vec<u64>, usize), Error> {
    m.check(schema)?;
    let places: SmallVec<[Place; 8]> = m
        .vals
        .iter()
        .map(|v| match v {
            Some(PosVal::Array {
                data: ArraySrc::Loan(_),
                ..
            }) => Err(Error::InvalidArgument(
                "loaned arrays need a channel".into(),
            )),
            Some(PosVal::Array { .. }) => Ok(Place::Inline),
            _ => Ok(Place::None),
        })
        .collect::<Result<_, _>>()?;
    let len = data_body_len(m, schema, &places);
    let mut buf = vec![0u64; len.div_ceil(8)];
    // SAFETY: `buf` is private, 8-aligned and at least `len` bytes.
    unsafe { encode_data_raw(m, schema, &places, buf.as_mut_ptr().cast(), len) };
    Ok((buf, len))
}
