//! Reading a data-only body (see `schema_encode` for the format) against the receiver's
//! private copy of the channel's schema: every value read from the body is checked once, when
//! the message is parsed, and an index of the values (one entry per field per record) is built
//! then; lookups by [`FieldId`] are an index into it, with no name comparison.

use ndarray::{ArrayViewD, IxDyn};
use smallvec::SmallVec;

use super::decode::{rd_u32, rd_u64};
use super::schema_encode::*;
use super::{DataRef, LOC_BLOCK, LOC_INLINE, MetaValue, PoolRef, pad8};
use crate::dtype::Element;
use crate::error::{Error, corrupt};
use crate::schema::{FieldError, FieldId, FieldKind, FieldSpec, Schema};

/// Where one value of a data-only body is (validated).
#[derive(Debug, Clone, Copy)]
enum Entry {
    /// Inline array: `len` bytes at `at` in the body; dims at `dims` (dynamic shapes).
    Inline {
        at: usize,
        len: usize,
        dims: usize,
    },
    /// Array in pool block `block`, `len` bytes.
    Block {
        block: u32,
        len: usize,
        dims: usize,
    },
    I64(i64),
    F64(f64),
    Str {
        at: usize,
        len: usize,
    },
}

/// A data-only message read in place, its values indexed by position.
///
/// As for [`MessageView`](crate::MessageView): everything but array data comes from a private
/// copy; array data is read where it lies, so a hostile producer may change values while you
/// read them, never their bounds (checked on the private copy against the schema).
#[derive(Debug, Clone)]
pub struct PositionalView<'a> {
    body: &'a [u8],
    data: DataRef<'a>,
    pool: PoolRef<'a>,
    schema: &'a Schema,
    tag: u32,
    records: usize,
    index: SmallVec<[Entry; 4]>,
}

/// One record of a [`PositionalView`]: values by [`FieldId`].
#[derive(Debug, Clone, Copy)]
pub struct PositionalRecord<'v, 'a> {
    view: &'v PositionalView<'a>,
    entries: &'v [Entry],
}

impl<'a> PositionalView<'a> {
    /// Validates the whole body (`body`: private bytes) against `schema` and indexes its values;
    /// inline array data is read from `data` (as many bytes as `body`, laid out the same).
    pub(crate) fn parse(
        body: &'a [u8],
        data: DataRef<'a>,
        pool: PoolRef<'a>,
        schema: &'a Schema,
    ) -> Result<Self, Error> {
        if body.len() < DATA_HEADER {
            return Err(corrupt(format!("data-only body of {} bytes", body.len())));
        }
        let magic = rd_u32(body, DATA_MAGIC_AT);
        if magic != DATA_MAGIC {
            return Err(corrupt(format!(
                "body magic {magic:#x} on a schema channel (a data-only body starts with SRD1)"
            )));
        }
        let len = rd_u32(body, DATA_LEN_AT) as usize;
        if len > body.len() || len < DATA_HEADER {
            return Err(corrupt(format!(
                "data-only body claims {len} bytes, has {}",
                body.len()
            )));
        }
        let body = &body[..len];
        let n_fields = rd_u32(body, DATA_FIELDS_AT) as usize;
        if n_fields != schema.len() {
            return Err(corrupt(format!(
                "data-only body of {n_fields} fields per record; the schema has {}",
                schema.len()
            )));
        }
        let records = rd_u32(body, DATA_RECORDS_AT) as usize;
        // Every value takes at least 16 bytes: bounds the index before it is allocated.
        let values = records.checked_mul(n_fields).filter(|&v| {
            v.checked_mul(ARRAY_REF.min(META_REF))
                .is_some_and(|b| b <= len - DATA_HEADER)
        });
        let Some(values) = values else {
            return Err(corrupt(format!(
                "{records} records of {n_fields} fields in a body of {len} bytes"
            )));
        };
        let mut index = SmallVec::with_capacity(values);
        let mut pos = DATA_HEADER;
        let mut blocks = 0u32;
        for v in 0..values {
            let spec = &schema.fields()[v % n_fields];
            let e = match &spec.kind {
                FieldKind::Meta => read_meta(body, &mut pos, spec)?,
                FieldKind::Array { dtype, rank, shape } => {
                    let (elems, dims) = match shape {
                        Some(s) => (s.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64)), 0),
                        None => {
                            if *rank > DATA_MAX_NDIM {
                                return Err(corrupt(format!(
                                    "field '{}': rank {rank} over {DATA_MAX_NDIM}",
                                    spec.name
                                )));
                            }
                            let dims = pos;
                            let end = need(body, pos, 8 * rank, spec)?;
                            let n = (0..*rank)
                                .try_fold(1u64, |a, i| a.checked_mul(rd_u64(body, dims + 8 * i)));
                            pos = end;
                            (n, dims)
                        }
                    };
                    let at = need(body, pos, ARRAY_REF, spec)?;
                    let loc = rd_u32(body, pos + ARRAY_LOC_AT);
                    let block = rd_u32(body, pos + ARRAY_BLOCK_AT);
                    let blen = rd_u64(body, pos + ARRAY_LEN_AT);
                    let want = elems.and_then(|n| n.checked_mul(dtype.size() as u64));
                    if want != Some(blen) {
                        return Err(corrupt(format!(
                            "field '{}': {blen} bytes for {elems:?} elements of {dtype}",
                            spec.name
                        )));
                    }
                    let blen = usize::try_from(blen).map_err(|_| corrupt("array length"))?;
                    pos = at;
                    match loc {
                        l if l == LOC_INLINE as u32 => {
                            let padded = blen.checked_add(7).map(|n| n & !7).unwrap_or(usize::MAX);
                            pos = need(body, at, padded, spec)?;
                            Entry::Inline {
                                at,
                                len: blen,
                                dims,
                            }
                        }
                        l if l == LOC_BLOCK as u32 => {
                            pool.block(block as u64, blen as u64)?;
                            blocks += 1;
                            Entry::Block {
                                block,
                                len: blen,
                                dims,
                            }
                        }
                        l => {
                            return Err(corrupt(format!(
                                "field '{}': array location {l}",
                                spec.name
                            )));
                        }
                    }
                }
            };
            index.push(e);
        }
        if pos != len {
            return Err(corrupt(format!(
                "data-only body of {len} bytes ends its values at {pos}"
            )));
        }
        let refs = rd_u32(body, DATA_BLOCK_REFS_AT);
        if refs != blocks {
            return Err(corrupt(format!(
                "data-only body counts {refs} block arrays, holds {blocks}"
            )));
        }
        Ok(PositionalView {
            body,
            data,
            pool,
            schema,
            tag: rd_u32(body, DATA_TAG_AT),
            records,
            index,
        })
    }

    /// The message tag.
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records
    }

    /// Whether the message has no record.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The schema the values were checked against.
    pub fn schema(&self) -> &'a Schema {
        self.schema
    }

    /// Record `i`.
    ///
    /// # Errors
    /// [`FieldError::NoSuchRecord`] past the end.
    pub fn record(&self, i: usize) -> Result<PositionalRecord<'_, 'a>, Error> {
        let n = self.schema.len();
        if i >= self.records {
            return Err(Error::Field(FieldError::NoSuchRecord {
                index: i,
                len: self.records,
            }));
        }
        Ok(PositionalRecord {
            view: self,
            entries: &self.index[i * n..(i + 1) * n],
        })
    }

    /// Every pool block an array of the message lies in.
    pub(crate) fn for_each_block(&self, mut f: impl FnMut(u32)) {
        for e in &self.index {
            if let Entry::Block { block, .. } = e {
                f(*block);
            }
        }
    }
}

/// `pos + n`, if it lies inside the body.
fn need(body: &[u8], pos: usize, n: usize, spec: &FieldSpec) -> Result<usize, Error> {
    pos.checked_add(n)
        .filter(|&e| e <= body.len())
        .ok_or_else(|| {
            corrupt(format!(
                "field '{}': {n} bytes at {pos} run past the body ({})",
                spec.name,
                body.len()
            ))
        })
}

fn read_meta(body: &[u8], pos: &mut usize, spec: &FieldSpec) -> Result<Entry, Error> {
    let p = *pos;
    let end = need(body, p, META_REF, spec)?;
    let kind = rd_u32(body, p + META_KIND_AT);
    let slen = rd_u32(body, p + META_STR_LEN_AT) as usize;
    let val = rd_u64(body, p + META_VALUE_AT);
    let e = match kind {
        META_I64 if slen == 0 => Entry::I64(val as i64),
        META_F64 if slen == 0 => Entry::F64(f64::from_bits(val)),
        META_STR => {
            let e = need(body, end, pad8(slen), spec)?;
            std::str::from_utf8(&body[end..end + slen])
                .map_err(|_| corrupt(format!("field '{}': string not UTF-8", spec.name)))?;
            *pos = e;
            return Ok(Entry::Str { at: end, len: slen });
        }
        k => {
            return Err(corrupt(format!(
                "field '{}': metadata kind {k} (string length {slen})",
                spec.name
            )));
        }
    };
    *pos = end;
    Ok(e)
}

impl<'a> PositionalRecord<'_, 'a> {
    fn entry(&self, f: FieldId) -> Result<(&'a FieldSpec, Entry), Error> {
        let spec = self.view.schema.spec(f)?;
        Ok((spec, self.entries[f.index()]))
    }

    fn wrong(spec: &FieldSpec, found: String) -> Error {
        let expected = match &spec.kind {
            FieldKind::Meta => "metadata".to_string(),
            FieldKind::Array { dtype, .. } => format!("{dtype} array"),
        };
        Error::Field(FieldError::WrongType {
            name: spec.name.clone(),
            expected,
            found,
        })
    }

    /// The bytes of array field `f`, its spec and where its dims are (dynamic shapes).
    #[inline]
    fn data(&self, f: FieldId) -> Result<(&'a FieldSpec, &'a [u8], usize), Error> {
        let (spec, e) = self.entry(f)?;
        match e {
            Entry::Inline { at, len, dims } => {
                // SAFETY: `at + len <= body.len()` (checked in `parse` on the private copy;
                // the entry is private too), as `DataRef::slice` requires.
                let bytes = unsafe { self.view.data.slice(at, len) };
                Ok((spec, bytes, dims))
            }
            Entry::Block { block, len, dims } => {
                Ok((spec, self.view.pool.block(block as u64, len as u64)?, dims))
            }
            _ => Err(Error::Field(FieldError::NotAnArray {
                name: spec.name.clone(),
            })),
        }
    }

    /// The raw bytes of array field `f` and its shape.
    ///
    /// # Errors
    /// [`FieldError::OutOfRange`], [`FieldError::NotAnArray`].
    pub fn array_bytes(&self, f: FieldId) -> Result<(&'a [u8], SmallVec<[usize; 4]>), Error> {
        let (spec, bytes, dims) = self.data(f)?;
        let shape = match &spec.kind {
            FieldKind::Array { shape: Some(s), .. } => s.iter().copied().collect(),
            FieldKind::Array { rank, .. } => (0..*rank)
                .map(|i| rd_u64(self.view.body, dims + 8 * i) as usize)
                .collect(),
            FieldKind::Meta => SmallVec::new(),
        };
        Ok((bytes, shape))
    }

    /// Array field `f` as a flat slice (zero-copy; see [`PositionalView`]).
    ///
    /// # Errors
    /// [`FieldError::WrongType`] for another dtype, as [`PositionalRecord::array_bytes`],
    /// [`Error::Corrupt`] for data misaligned for `T`.
    pub fn slice<T: Element>(&self, f: FieldId) -> Result<&'a [T], Error> {
        let (spec, bytes, _) = self.data(f)?;
        if let FieldKind::Array { dtype, .. } = &spec.kind
            && *dtype != T::DTYPE
        {
            return Err(Self::wrong(spec, format!("{} array", T::DTYPE)));
        }
        bytemuck::try_cast_slice(bytes)
            .map_err(|e| corrupt(format!("array '{}': {e:?}", spec.name)))
    }

    /// Array field `f` as an ndarray view (zero-copy; see [`PositionalView`]).
    ///
    /// # Errors
    /// As [`PositionalRecord::slice`].
    pub fn array<T: Element>(&self, f: FieldId) -> Result<ArrayViewD<'a, T>, Error> {
        let data = self.slice::<T>(f)?;
        let (_, shape) = self.array_bytes(f)?;
        ArrayViewD::from_shape(IxDyn(&shape), data).map_err(|e| corrupt(e.to_string()))
    }

    /// Metadata field `f`.
    ///
    /// # Errors
    /// [`FieldError::OutOfRange`]; [`FieldError::WrongType`] for an array field.
    pub fn meta(&self, f: FieldId) -> Result<MetaValue<'a>, Error> {
        let (spec, e) = self.entry(f)?;
        Ok(match e {
            Entry::I64(v) => MetaValue::I64(v),
            Entry::F64(v) => MetaValue::F64(v),
            Entry::Str { at, len } => {
                let s = std::str::from_utf8(&self.view.body[at..at + len])
                    .map_err(|_| corrupt("string not UTF-8"))?;
                MetaValue::Str(s.into())
            }
            _ => return Err(Self::wrong(spec, "metadata".into())),
        })
    }

    /// Integer metadata field `f`.
    ///
    /// # Errors
    /// As [`PositionalRecord::meta`]; [`FieldError::WrongType`] for a value of another kind.
    pub fn meta_i64(&self, f: FieldId) -> Result<i64, Error> {
        match self.meta(f)? {
            MetaValue::I64(v) => Ok(v),
            v => Err(self.meta_kind(f, "integer", &v)),
        }
    }

    /// Float metadata field `f`.
    ///
    /// # Errors
    /// As [`PositionalRecord::meta_i64`].
    pub fn meta_f64(&self, f: FieldId) -> Result<f64, Error> {
        match self.meta(f)? {
            MetaValue::F64(v) => Ok(v),
            v => Err(self.meta_kind(f, "float", &v)),
        }
    }

    /// String metadata field `f`.
    ///
    /// # Errors
    /// As [`PositionalRecord::meta_i64`].
    pub fn meta_str(&self, f: FieldId) -> Result<&'a str, Error> {
        match self.meta(f)? {
            MetaValue::Str(std::borrow::Cow::Borrowed(s)) => Ok(s),
            v => Err(self.meta_kind(f, "string", &v)),
        }
    }

    fn meta_kind(&self, f: FieldId, asked: &str, got: &MetaValue<'_>) -> Error {
        let name = self.view.schema.fields()[f.index()].name.clone();
        Error::Field(FieldError::WrongType {
            name,
            expected: format!("{got:?}"),
            found: format!("{asked} (asked for)"),
        })
    }
}

#[cfg(test)]
mod tests;
