//! The heap array of an item and the dtype-dynamic view of any of its arrays: [`Array`] (one
//! `ndarray` variant per [`DType`]) and its conversions to and from bytes and typed `ndarray`s,
//! and [`ArrayRef`], which reads an array wherever it lives without a copy.
//!
//! The element types are shm-ring's ([`DType`], [`Element`]); the item that holds these arrays
//! is in [`item`](crate::item).

use ndarray::{ArrayD, ArrayViewD, Dimension, IxDyn};
use shm_ring::{DType, Element};

macro_rules! dtypes {
    ($($variant:ident $t:ty;)*) => {
        /// A dtype-dynamic owned array on the heap (row-major, any dimension), one variant
        /// per [`DType`].
        #[derive(Debug, Clone, PartialEq)]
        pub enum Array {
            $(
                #[doc = concat!("An array of `", stringify!($t), "`.")]
                $variant(ArrayD<$t>),
            )*
        }

        impl Array {
            /// The element type.
            pub fn dtype(&self) -> DType {
                match self { $(Array::$variant(_) => DType::$variant,)* }
            }
            /// Shape of the array.
            pub fn shape(&self) -> &[usize] {
                match self { $(Array::$variant(x) => x.shape(),)* }
            }
            /// The array in row-major layout (copied once if it is not).
            pub(crate) fn standard(self) -> Array {
                match self {
                    $(Array::$variant(x) => Array::$variant(if x.is_standard_layout() {
                        x
                    } else {
                        x.as_standard_layout().into_owned()
                    }),)*
                }
            }
            /// The payload bytes (`None` when not in row-major layout).
            fn bytes(&self) -> Option<&[u8]> {
                match self { $(Array::$variant(x) => x.as_slice().map(as_bytes),)* }
            }
        }

        $(
            impl<D: Dimension> From<ndarray::Array<$t, D>> for Array {
                fn from(a: ndarray::Array<$t, D>) -> Array {
                    Array::$variant(a.into_dyn())
                }
            }
        )*
    };
}

dtypes! {
    F32 f32;
    F64 f64;
    I8 i8;
    I16 i16;
    I32 i32;
    I64 i64;
    U8 u8;
    U16 u16;
    U32 u32;
    U64 u64;
    F16 half::f16;
    BF16 half::bf16;
    Bool bool;
}

/// The bytes of a slice of plain values (bool included: one byte, 0 or 1).
fn as_bytes<T: Copy>(s: &[T]) -> &[u8] {
    // SAFETY: `T` is one of the dtype types above: plain values without padding, each of its
    // bytes initialised; the slice covers exactly the same memory, read-only.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// The bytes of a slice of plain old data, writable.
fn as_bytes_mut<T: bytemuck::Pod>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

impl Array {
    /// The payload bytes, writable (`None` when not in row-major layout). Never for bool
    /// (not every byte is a bool).
    pub(crate) fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        macro_rules! pod {
            ($($v:ident),*) => {
                match self {
                    $(Array::$v(x) => x.as_slice_mut().map(as_bytes_mut),)*
                    Array::Bool(_) => None,
                }
            };
        }
        pod!(F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16)
    }

    /// The `ndarray` inside, writable, when it is one of `T` (`None` for a foreign `Element`
    /// type sharing the dtype).
    pub(crate) fn typed_mut<T: Element>(&mut self) -> Option<&mut ArrayD<T>> {
        macro_rules! cast {
            ($($v:ident),*) => {
                match self {
                    $(Array::$v(x) => (x as &mut dyn std::any::Any).downcast_mut::<ArrayD<T>>(),)*
                }
            };
        }
        cast!(
            F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, Bool
        )
    }

    /// Payload size in bytes.
    pub fn nbytes(&self) -> usize {
        self.shape().iter().product::<usize>() * self.dtype().size()
    }

    /// A view of the array (no copy). Only for arrays in row-major layout (every array in an
    /// item is).
    pub(crate) fn raw(&self) -> ArrayRef<'_> {
        ArrayRef {
            dtype: self.dtype(),
            shape: self.shape(),
            bytes: self.bytes().unwrap_or(&[]),
            shared: false,
        }
    }

    /// A typed view; `None` when the dtype is not `T`'s.
    pub fn view<T: Element>(&self) -> Option<ArrayViewD<'_, T>> {
        macro_rules! cast {
            ($($v:ident),*) => {
                match self {
                    $(Array::$v(x) => (x as &dyn std::any::Any).downcast_ref::<ArrayD<T>>(),)*
                }
            };
        }
        cast!(
            F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, Bool
        )
        .map(|a| a.view())
    }

    /// The array as an `ndarray` of `T` (no copy), or itself back when the dtype differs.
    pub fn into_typed<T: Element>(self) -> Result<ArrayD<T>, Array> {
        if self.dtype() != T::DTYPE {
            return Err(self);
        }
        macro_rules! cast {
            ($($v:ident),*) => {
                match self {
                    $(Array::$v(x) => downcast::<_, ArrayD<T>>(x).map_err(Array::$v),)*
                }
            };
        }
        // Fails only for a foreign `Element` type sharing a dtype (e.g. a newtype of f32):
        // then the bytes are copied into it.
        cast!(
            F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, Bool
        )
        .or_else(|a| {
            let v: Vec<T> = bytemuck::pod_collect_to_vec(a.bytes().unwrap_or(&[]));
            ArrayD::from_shape_vec(IxDyn(a.shape()), v).map_err(|_| a)
        })
    }

    /// Builds an array of `dtype` from row-major bytes (one copy).
    ///
    /// # Errors
    /// A message when the byte count does not match the shape, or a bool byte is not 0 or 1.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Array, String> {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n.and_then(|n| n.checked_mul(dtype.size())) != Some(bytes.len()) {
            return Err(format!(
                "{} bytes do not fit shape {shape:?} of {dtype}",
                bytes.len()
            ));
        }
        fn build<T: bytemuck::Pod>(shape: &[usize], bytes: &[u8]) -> Result<ArrayD<T>, String> {
            let v: Vec<T> = copy_pod(bytes);
            if let [_] = shape {
                // The common small case, without the dynamic-shape checks (the length was
                // checked above).
                return Ok(ndarray::Array1::from_vec(v).into_dyn());
            }
            ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| e.to_string())
        }
        Ok(match dtype {
            DType::F32 => Array::F32(build(shape, bytes)?),
            DType::F64 => Array::F64(build(shape, bytes)?),
            DType::I8 => Array::I8(build(shape, bytes)?),
            DType::I16 => Array::I16(build(shape, bytes)?),
            DType::I32 => Array::I32(build(shape, bytes)?),
            DType::I64 => Array::I64(build(shape, bytes)?),
            DType::U8 => Array::U8(build(shape, bytes)?),
            DType::U16 => Array::U16(build(shape, bytes)?),
            DType::U32 => Array::U32(build(shape, bytes)?),
            DType::U64 => Array::U64(build(shape, bytes)?),
            DType::F16 => Array::F16(build(shape, bytes)?),
            DType::BF16 => Array::BF16(build(shape, bytes)?),
            DType::Bool => {
                let v = bytes
                    .iter()
                    .map(|&b| match b {
                        0 => Ok(false),
                        1 => Ok(true),
                        b => Err(format!("byte {b} is not a bool")),
                    })
                    .collect::<Result<Vec<bool>, String>>()?;
                Array::Bool(ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| e.to_string())?)
            }
        })
    }
}

/// The values in `bytes` (a whole number of `T`s, checked by the caller), copied once into a
/// new vector: no zero-filling first as `bytemuck::pod_collect_to_vec` does (it costs a pass
/// over the memory, a tenth of a large item's trip through a pipeline).
fn copy_pod<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut v: Vec<T> = Vec::with_capacity(n);
    // SAFETY: `v` has room for `n` values, i.e. `n * size_of::<T>() <= bytes.len()` bytes;
    // the regions cannot overlap (`v` is new); every bit pattern is a valid `T` (`Pod`), so
    // the `n` values are initialised once copied.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            v.as_mut_ptr().cast::<u8>(),
            n * std::mem::size_of::<T>(),
        );
        v.set_len(n);
    }
    v
}

/// `a` as a `B` when `A` and `B` are the same type.
fn downcast<A: 'static, B: 'static>(a: A) -> Result<B, A> {
    let mut slot = Some(a);
    match (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<B>>() {
        Some(b) => Ok(b.take().expect("just filled")),
        None => Err(slot.expect("untouched")),
    }
}

/// A dtype-dynamic view of an item's array, wherever it lives (heap or shared memory): no
/// copy. [`ArrayRef::to_owned`] copies it when a copy is meant.
#[derive(Debug, Clone, Copy)]
pub struct ArrayRef<'a> {
    pub(crate) dtype: DType,
    pub(crate) shape: &'a [usize],
    pub(crate) bytes: &'a [u8],
    pub(crate) shared: bool,
}

impl<'a> ArrayRef<'a> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The shape (row-major).
    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }
    /// The payload, row-major (bool: one byte per element, 0 or 1).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
    /// Payload size in bytes.
    pub fn nbytes(&self) -> usize {
        self.bytes.len()
    }
    /// Whether the array is read in place from shared memory (zero-copy).
    pub fn is_shared(&self) -> bool {
        self.shared
    }
    /// A typed view; `None` when the dtype is not `T`'s.
    pub fn view<T: Element>(&self) -> Option<ArrayViewD<'a, T>> {
        if T::DTYPE != self.dtype {
            return None;
        }
        // Heap arrays and pool blocks are aligned for every dtype; anything else is refused.
        let data = bytemuck::try_cast_slice::<u8, T>(self.bytes).ok()?;
        ArrayViewD::from_shape(IxDyn(self.shape), data).ok()
    }
    /// A heap copy.
    pub fn to_owned(&self) -> Array {
        // The shape and byte count were checked when the array entered the item.
        Array::from_bytes(self.dtype, self.shape, self.bytes)
            .unwrap_or_else(|_| Array::U8(ArrayD::zeros(IxDyn(&[0]))))
    }
}
