//! Element types of arrays that cross processes.

use std::fmt;

/// The element type of an array, as stored in a message (one byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// `f32`
    F32 = 1,
    /// `f64`
    F64 = 2,
    /// `i8`
    I8 = 3,
    /// `i16`
    I16 = 4,
    /// `i32`
    I32 = 5,
    /// `i64`
    I64 = 6,
    /// `u8`
    U8 = 7,
    /// `u16`
    U16 = 8,
    /// `u32`
    U32 = 9,
    /// `u64`
    U64 = 10,
    /// `half::f16`
    F16 = 11,
    /// `half::bf16`
    BF16 = 12,
    /// `bool`, travelling as one `u8` per element (0 or 1, checked on reading).
    Bool = 13,
}

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::Bool,
    ];

    /// Bytes per element (also its alignment).
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The dtype of a code byte, if valid.
    pub(crate) const fn from_code(code: u8) -> Option<DType> {
        if code >= 1 && code <= 13 {
            Some(DType::ALL[code as usize - 1])
        } else {
            None
        }
    }

    /// Short name (`"f32"`, `"bool"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A type whose arrays can cross processes: plain old data, every bit pattern valid.
/// `bool` is not one (not every byte is a valid bool): send it as [`DType::Bool`] via
/// `MessageBuilder::array_bool`, read it back with `RecordView::array_bool`.
///
/// Sealed: implemented for the element types of [`DType`] only. A loan's memory is a pool
/// block, 64-aligned, and a received array's bytes are read as the dtype the message names:
/// another type (say one aligned to 128 bytes, or of another size than its dtype) would make
/// misaligned or mis-sized slices, so it cannot be an `Element`:
///
/// ```compile_fail
/// #[repr(C, align(128))]
/// #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
/// struct Wide([u8; 128]);
/// impl shm_ring::Element for Wide {
///     const DTYPE: shm_ring::DType = shm_ring::DType::U8;
/// }
/// ```
pub trait Element: sealed::Sealed + bytemuck::Pod + Send + Sync + 'static {
    /// The dtype code.
    const DTYPE: DType;
}

mod sealed {
    /// Implemented only here, for the element types of `DType`.
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}
element!(f32 => F32, f64 => F64, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8,
    u16 => U16, u32 => U32, u64 => U64, half::f16 => F16, half::bf16 => BF16);
