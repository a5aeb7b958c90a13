//! The bytes of a schema region (little-endian, unaligned, read only from a private copy):
//!
//! ```text
//! 0   magic u32 "SRS1" | 4 kind u32 (1: a value) | 8 length u32 (= region) | 12 count u32 (1)
//! 16  the value's entry: size u32 | align u32 | dtype u8 (0 opaque) | rank u8 | name_len u16 |
//!                        dims u32 x rank | type name (UTF-8)
//! ```
//!
//! Kind 2 (named fields read by position) was removed with that encoding: such a segment is
//! refused as [`SchemaError::UnknownKind`].

use smallvec::SmallVec;

use super::value::MAX_VALUE_RANK;
use super::{SchemaError, ValueType};
use crate::dtype::DType;

pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"SRS1");
pub(crate) const MAGIC_AT: usize = 0;
pub(crate) const KIND_AT: usize = 4;
pub(crate) const LEN_AT: usize = 8;
pub(crate) const COUNT_AT: usize = 12;
#[cfg(feature = "unstable-internals")]
pub(crate) const ENTRIES_AT: usize = 16;
pub(crate) const KIND_VALUE: u32 = 1;
// Offsets inside a value entry (for the layout's corruption tests; the
// encoder writes the same order, checked by `offsets_match_the_encoder`).
#[cfg(feature = "unstable-internals")]
pub(crate) const VALUE_SIZE_AT: usize = 0;
#[cfg(feature = "unstable-internals")]
pub(crate) const VALUE_ALIGN_AT: usize = 4;
#[cfg(feature = "unstable-internals")]
pub(crate) const VALUE_DTYPE_AT: usize = 8;
#[cfg(feature = "unstable-internals")]
pub(crate) const VALUE_RANK_AT: usize = 9;
#[cfg(feature = "unstable-internals")]
pub(crate) const VALUE_NAME_LEN_AT: usize = 10;
#[cfg(feature = "unstable-internals")]
pub(crate) const VALUE_DIMS_AT: usize = 12;
/// Longest type name recorded for a typed value (longer ones are cut).
const MAX_TYPE_NAME: usize = 1024;

/// The bytes of the schema region of a typed channel of `v`.
pub(crate) fn encode(v: &ValueType) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&KIND_VALUE.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // length, patched below
    out.extend_from_slice(&1u32.to_le_bytes());
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
pub(crate) fn decode(b: &[u8]) -> Result<ValueType, SchemaError> {
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
            decode_value(&mut r)?
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for cs in [
            ValueType::of::<[[i16; 3]; 5]>(),
            ValueType::of::<[u8; 24]>(),
            ValueType::of::<u64>(),
        ] {
            assert_eq!(decode(&encode(&cs)).unwrap(), cs);
        }
    }

    #[cfg(feature = "unstable-internals")]
    #[test]
    fn offsets_match_the_encoder() {
        let b = encode(&ValueType::of::<[u16; 5]>());
        let e = &b[ENTRIES_AT..];
        assert_eq!(e[VALUE_SIZE_AT..VALUE_SIZE_AT + 4], 10u32.to_le_bytes());
        assert_eq!(e[VALUE_ALIGN_AT..VALUE_ALIGN_AT + 4], 2u32.to_le_bytes());
        assert_eq!(e[VALUE_DTYPE_AT], DType::U16 as u8);
        assert_eq!(e[VALUE_RANK_AT], 1);
        assert_eq!(
            e[VALUE_NAME_LEN_AT..VALUE_NAME_LEN_AT + 2],
            8u16.to_le_bytes()
        );
        assert_eq!(e[VALUE_DIMS_AT..VALUE_DIMS_AT + 4], 5u32.to_le_bytes());
        assert_eq!(&e[VALUE_DIMS_AT + 4..], b"[u16; 5]");
    }

    #[test]
    fn every_truncation_is_refused() {
        let b = encode(&ValueType::of::<[f32; 16]>());
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
