//! The bytes of a schema region (little-endian, unaligned, read only from a private copy):
//!
//! ```text
//! 0   magic u32 "SRS1" | 4 kind u32 (1 value, 2 fields) | 8 length u32 (= region) | 12 count u32
//! 16  entries:
//!     value (count = 1): size u32 | align u32 | dtype u8 (0 opaque) | rank u8 | name_len u16 |
//!                        dims u32 x rank | type name (UTF-8)
//!     field (count of them): kind u8 (1 array, 2 meta) | dtype u8 | rank u8 | fixed u8 (0/1) |
//!                        name_len u16 | 0 u16 | dims u64 x rank if fixed | name (UTF-8)
//! ```

use smallvec::SmallVec;

use super::value::MAX_VALUE_RANK;
use super::{ChannelSchema, FieldKind, FieldSpec, MAX_FIELD_RANK, MAX_FIELDS, MAX_NAME, Schema};
use super::{SchemaError, ValueType};
use crate::dtype::DType;

pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"SRS1");
pub(crate) const MAGIC_AT: usize = 0;
pub(crate) const KIND_AT: usize = 4;
pub(crate) const LEN_AT: usize = 8;
pub(crate) const COUNT_AT: usize = 12;
pub(crate) const ENTRIES_AT: usize = 16;
pub(crate) const KIND_VALUE: u32 = 1;
pub(crate) const KIND_FIELDS: u32 = 2;
/// Offsets inside a value entry.
pub(crate) const VALUE_SIZE_AT: usize = 0;
pub(crate) const VALUE_ALIGN_AT: usize = 4;
pub(crate) const VALUE_DTYPE_AT: usize = 8;
pub(crate) const VALUE_RANK_AT: usize = 9;
pub(crate) const VALUE_NAME_LEN_AT: usize = 10;
pub(crate) const VALUE_DIMS_AT: usize = 12;
/// Offsets inside a field entry.
pub(crate) const FIELD_KIND_AT: usize = 0;
pub(crate) const FIELD_DTYPE_AT: usize = 1;
pub(crate) const FIELD_RANK_AT: usize = 2;
pub(crate) const FIELD_NAME_LEN_AT: usize = 4;
pub(crate) const FIELD_DIMS_AT: usize = 8;
const FIELD_ARRAY: u8 = 1;
const FIELD_META: u8 = 2;
/// Longest type name recorded for a typed value (longer ones are cut).
const MAX_TYPE_NAME: usize = 1024;

/// The bytes of `schema`'s region. The schema must have passed [`Schema::check`].
pub(crate) fn encode(schema: &ChannelSchema) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    let (kind, count) = match schema {
        ChannelSchema::Value(_) => (KIND_VALUE, 1),
        ChannelSchema::Fields(s) => (KIND_FIELDS, s.len() as u32),
    };
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // length, patched below
    out.extend_from_slice(&count.to_le_bytes());
    match schema {
        ChannelSchema::Value(v) => {
            let mut end = v.name.len().min(MAX_TYPE_NAME);
            while !v.name.is_char_boundary(end) {
                end -= 1;
            }
            let name = &v.name.as_bytes()[..end];
            out.extend_from_slice(&v.size.to_le_bytes());
            out.extend_from_slice(&v.align.to_le_bytes());
            let (code, dims) = match &v.array {
                Some((d, shape)) => (*d as u8, &shape[..]),
                None => (0, &[][..]),
            };
            out.push(code);
            out.push(dims.len() as u8);
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(name);
        }
        ChannelSchema::Fields(s) => {
            for f in s.fields() {
                let (kind, dtype, rank, shape) = match &f.kind {
                    FieldKind::Array { dtype, rank, shape } => {
                        (FIELD_ARRAY, *dtype as u8, *rank as u8, shape.as_deref())
                    }
                    FieldKind::Meta => (FIELD_META, 0, 0, None),
                };
                out.extend_from_slice(&[kind, dtype, rank, shape.is_some() as u8]);
                out.extend_from_slice(&(f.name.len() as u16).to_le_bytes());
                out.extend_from_slice(&[0, 0]);
                for &d in shape.unwrap_or(&[]) {
                    out.extend_from_slice(&(d as u64).to_le_bytes());
                }
                out.extend_from_slice(f.name.as_bytes());
            }
        }
    }
    let len = out.len() as u32;
    out[LEN_AT..LEN_AT + 4].copy_from_slice(&len.to_le_bytes());
    out
}

/// A cursor over a private copy of the region: every read is bounds-checked.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, entry: usize) -> Result<&[u8], SchemaError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(SchemaError::Truncated {
                at: entry,
                len: self.b.len(),
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self, entry: usize) -> Result<u8, SchemaError> {
        Ok(self.take(1, entry)?[0])
    }
    fn u16(&mut self, entry: usize) -> Result<u16, SchemaError> {
        Ok(u16::from_le_bytes(
            self.take(2, entry)?.try_into().expect("2"),
        ))
    }
    fn u32(&mut self, entry: usize) -> Result<u32, SchemaError> {
        Ok(u32::from_le_bytes(
            self.take(4, entry)?.try_into().expect("4"),
        ))
    }
    fn u64(&mut self, entry: usize) -> Result<u64, SchemaError> {
        Ok(u64::from_le_bytes(
            self.take(8, entry)?.try_into().expect("8"),
        ))
    }
    fn name(&mut self, len: usize, entry: usize, field: usize) -> Result<String, SchemaError> {
        let b = self.take(len, entry)?;
        std::str::from_utf8(b)
            .map(str::to_string)
            .map_err(|e| SchemaError::BadName {
                field,
                why: format!("not UTF-8 ({e})"),
            })
    }
}

/// Parses and validates a private copy of a schema region (every length, offset, code and
/// rank is checked; nothing is trusted).
pub(crate) fn decode(b: &[u8]) -> Result<ChannelSchema, SchemaError> {
    let mut r = Reader { b, at: 0 };
    let magic = r.u32(MAGIC_AT)?;
    if magic != MAGIC {
        return Err(SchemaError::BadMagic { found: magic });
    }
    let kind = r.u32(KIND_AT)?;
    let len = r.u32(LEN_AT)?;
    let count = r.u32(COUNT_AT)?;
    if len as usize != b.len() {
        return Err(SchemaError::LengthMismatch {
            declared: len as u64,
            region: b.len() as u64,
        });
    }
    let schema = match kind {
        KIND_VALUE => {
            if count != 1 {
                return Err(SchemaError::Inconsistent(format!(
                    "a typed value schema with {count} entries (must be 1)"
                )));
            }
            ChannelSchema::Value(decode_value(&mut r)?)
        }
        KIND_FIELDS => {
            if count as usize > MAX_FIELDS {
                return Err(SchemaError::TooManyFields(count as u64));
            }
            let mut fields = Vec::with_capacity(count as usize);
            for i in 0..count as usize {
                fields.push(decode_field(&mut r, i)?);
            }
            let s = Schema { fields };
            s.check()?;
            ChannelSchema::Fields(s)
        }
        k => return Err(SchemaError::UnknownKind(k)),
    };
    if r.at != b.len() {
        return Err(SchemaError::TrailingBytes {
            at: r.at,
            len: b.len(),
        });
    }
    Ok(schema)
}

fn decode_value(r: &mut Reader<'_>) -> Result<ValueType, SchemaError> {
    let e = r.at;
    let size = r.u32(e)?;
    let align = r.u32(e)?;
    let code = r.u8(e)?;
    let rank = r.u8(e)?;
    let name_len = r.u16(e)? as usize;
    if !align.is_power_of_two() || size % align != 0 {
        return Err(SchemaError::Inconsistent(format!(
            "typed value of {size} bytes with alignment {align}"
        )));
    }
    if rank as usize > MAX_VALUE_RANK {
        return Err(SchemaError::BadRank {
            field: 0,
            rank: rank as u64,
        });
    }
    let mut dims = SmallVec::<[u32; 4]>::new();
    for _ in 0..rank {
        dims.push(r.u32(e)?);
    }
    let array = match code {
        0 if rank == 0 => None,
        0 => {
            return Err(SchemaError::Inconsistent(format!(
                "an opaque typed value with {rank} dimensions"
            )));
        }
        c => {
            let d = DType::from_code(c).ok_or(SchemaError::BadDType { field: 0, code: c })?;
            let bytes = dims
                .iter()
                .try_fold(d.size() as u64, |a, &n| a.checked_mul(n as u64));
            if bytes != Some(size as u64) || d.size() as u32 != align {
                return Err(SchemaError::Inconsistent(format!(
                    "a typed {d} array of shape {:?} stated as {size} bytes, align {align}",
                    &dims[..]
                )));
            }
            Some((d, dims))
        }
    };
    let name = r.name(name_len, e, 0)?;
    Ok(ValueType {
        size,
        align,
        array,
        name,
    })
}

fn decode_field(r: &mut Reader<'_>, i: usize) -> Result<FieldSpec, SchemaError> {
    let e = r.at;
    let kind = r.u8(e)?;
    let code = r.u8(e)?;
    let rank = r.u8(e)? as usize;
    let fixed = r.u8(e)?;
    let name_len = r.u16(e)? as usize;
    let _zero = r.u16(e)?;
    if name_len == 0 || name_len > MAX_NAME {
        return Err(SchemaError::BadName {
            field: i,
            why: format!("{name_len} bytes long (1 to {MAX_NAME})"),
        });
    }
    let kind = match kind {
        FIELD_ARRAY => {
            let dtype = DType::from_code(code).ok_or(SchemaError::BadDType { field: i, code })?;
            if rank > MAX_FIELD_RANK {
                return Err(SchemaError::BadRank {
                    field: i,
                    rank: rank as u64,
                });
            }
            let shape = match fixed {
                0 => None,
                1 => {
                    let mut s = Vec::with_capacity(rank);
                    for _ in 0..rank {
                        let d = r.u64(e)?;
                        s.push(usize::try_from(d).map_err(|_| {
                            SchemaError::Inconsistent(format!("field {i}: dimension {d}"))
                        })?);
                    }
                    Some(s)
                }
                f => {
                    return Err(SchemaError::Inconsistent(format!(
                        "field {i}: fixed-shape flag {f} (0 or 1)"
                    )));
                }
            };
            FieldKind::Array { dtype, rank, shape }
        }
        FIELD_META if code == 0 && rank == 0 && fixed == 0 => FieldKind::Meta,
        code => return Err(SchemaError::BadFieldKind { field: i, code }),
    };
    let name = r.name(name_len, e, i)?;
    Ok(FieldSpec { name, kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let s = Schema::new()
            .array("x", DType::F32, &[16])
            .array_dyn("y", DType::Bool, 3)
            .meta("id");
        for cs in [
            ChannelSchema::Fields(s),
            ChannelSchema::Fields(Schema::new()),
            ChannelSchema::Value(ValueType::of::<[[i16; 3]; 5]>()),
            ChannelSchema::Value(ValueType::of::<[u8; 24]>()),
        ] {
            assert_eq!(decode(&encode(&cs)).unwrap(), cs);
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let s = Schema::new().array("x", DType::F32, &[16]).meta("id");
        let b = encode(&ChannelSchema::Fields(s));
        for n in 0..b.len() {
            let mut c = b[..n].to_vec();
            if n >= LEN_AT + 4 {
                c[LEN_AT..LEN_AT + 4].copy_from_slice(&(n as u32).to_le_bytes());
            }
            assert!(
                matches!(
                    decode(&c),
                    Err(SchemaError::Truncated { .. }
                        | SchemaError::LengthMismatch { .. }
                        | SchemaError::BadName { .. })
                ),
                "{n}: {:?}",
                decode(&c)
            );
        }
    }
}
