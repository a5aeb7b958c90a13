//! The schema of a typed channel: one fixed-size plain-old-data value per slot.

use std::fmt;

use smallvec::SmallVec;

use crate::dtype::DType;

/// What one value of a typed channel is: its size and alignment, and, when the Rust type is
/// an element ([`Element`](crate::Element)) or a (nested) array of one (`[f32; 16]`,
/// `[[u8; 3]; 4]`), its dtype and fixed shape. Any other `bytemuck::Pod` type (a user
/// struct) is *opaque*: only its size and alignment are checked.
///
/// Two values match when their size, alignment and (if known) dtype and shape agree; the type
/// name is recorded for error messages only (two programs defining the same struct in
/// different modules can share a channel). Internal: users see it only in the texts of
/// [`SchemaError::Mismatch`](crate::SchemaError::Mismatch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueType {
    pub(crate) size: u32,
    pub(crate) align: u32,
    pub(crate) array: Option<(DType, SmallVec<[u32; 4]>)>,
    pub(crate) name: String,
}

/// Most dimensions a typed value's shape may have.
pub(crate) const MAX_VALUE_RANK: usize = 8;

impl ValueType {
    /// The description of `T`.
    ///
    /// The dtype and shape are recognised from [`std::any::type_name`] (`"[f32; 16]"`); a type
    /// not recognised that way is opaque, which is never unsound, only less precise.
    ///
    /// # Panics
    /// If `T` is larger than 4 GiB.
    pub fn of<T: bytemuck::Pod>() -> ValueType {
        let size = u32::try_from(std::mem::size_of::<T>()).expect("a value under 4 GiB");
        let align = std::mem::align_of::<T>() as u32;
        let name = std::any::type_name::<T>();
        let array = parse_array(name).filter(|(dtype, shape)| {
            shape.len() <= MAX_VALUE_RANK
                && shape
                    .iter()
                    .try_fold(dtype.size() as u64, |a, &d| a.checked_mul(d as u64))
                    == Some(size as u64)
                && dtype.size() as u32 == align
        });
        ValueType {
            size,
            align,
            array,
            name: name.to_string(),
        }
    }

    /// Bytes per value.
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// Alignment of the Rust type.
    pub fn align(&self) -> usize {
        self.align as usize
    }

    /// The element type, if the value is an array of elements (None: opaque).
    pub fn dtype(&self) -> Option<DType> {
        self.array.as_ref().map(|a| a.0)
    }

    /// The fixed shape (`[]` for a scalar), if the value is an array of elements.
    pub fn shape(&self) -> Option<&[u32]> {
        self.array.as_ref().map(|a| &a.1[..])
    }

    /// The Rust type name recorded by the creator (for messages; never compared).
    pub fn type_name(&self) -> &str {
        &self.name
    }

    /// Whether a channel of `self` may be read as `other`.
    pub fn matches(&self, other: &ValueType) -> bool {
        self.size == other.size && self.align == other.align && self.array == other.array
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.array {
            Some((d, shape)) => write!(
                f,
                "{d} array of shape {:?} ({} bytes)",
                &shape[..],
                self.size
            ),
            None => write!(
                f,
                "opaque {}-byte value (align {}, `{}`)",
                self.size, self.align, self.name
            ),
        }
    }
}

/// `"[[f32; 4]; 2]"` -> (F32, [2, 4]); an element name -> (dtype, []).
fn parse_array(name: &str) -> Option<(DType, SmallVec<[u32; 4]>)> {
    let name = name.trim();
    if let Some(inner) = name.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        let (elem, n) = inner.rsplit_once(';')?;
        let n: u32 = n.trim().parse().ok()?;
        let (dtype, mut shape) = parse_array(elem)?;
        shape.insert(0, n);
        return Some((dtype, shape));
    }
    let dtype = match name {
        "f32" => DType::F32,
        "f64" => DType::F64,
        "i8" => DType::I8,
        "i16" => DType::I16,
        "i32" => DType::I32,
        "i64" => DType::I64,
        "u8" => DType::U8,
        "u16" => DType::U16,
        "u32" => DType::U32,
        "u64" => DType::U64,
        n if n.starts_with("half::") && n.ends_with("::f16") => DType::F16,
        n if n.starts_with("half::") && n.ends_with("::bf16") => DType::BF16,
        _ => return None,
    };
    Some((dtype, SmallVec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_scalars_and_opaque_types() {
        let v = ValueType::of::<[[f32; 4]; 2]>();
        assert_eq!(
            (v.dtype(), v.shape()),
            (Some(DType::F32), Some(&[2, 4][..]))
        );
        let v = ValueType::of::<u16>();
        assert_eq!((v.dtype(), v.shape()), (Some(DType::U16), Some(&[][..])));
        let v = ValueType::of::<[half::bf16; 3]>();
        assert_eq!(v.dtype(), Some(DType::BF16));
        #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
        #[repr(C)]
        struct P {
            a: u64,
            b: f32,
            c: u32,
        }
        let v = ValueType::of::<P>();
        assert_eq!((v.dtype(), v.size(), v.align()), (None, 16, 8));
        assert!(v.to_string().contains("opaque 16-byte value"));
        assert!(!v.matches(&ValueType::of::<[u64; 2]>()));
        assert!(!ValueType::of::<[f32; 16]>().matches(&ValueType::of::<[f64; 8]>()));
        assert!(ValueType::of::<[f32; 16]>().matches(&ValueType::of::<[f32; 16]>()));
        let v = ValueType::of::<[f32; 16]>();
        assert_eq!(v.to_string(), "f32 array of shape [16] (64 bytes)");
        assert!(!v.matches(&ValueType::of::<[u32; 16]>()));
    }
}
