//! The unit that flows through a pipeline: named arrays plus small metadata.

use std::sync::{Arc, OnceLock};

use ndarray::{ArrayD, ArrayViewD, ArrayViewMutD, Dimension, IxDyn};

mod sealed {
    pub trait Sealed {}
}

/// Element types an [`Item`] array may hold.
///
/// Implemented for `f32 f64 i8 i16 i32 i64 u8 u16 u32 u64`; store `bool` as `u8`.
/// The trait is sealed: the set of dtypes is fixed by the wire format.
pub trait Element: sealed::Sealed + bytemuck::Pod + Send + Sync + 'static {
    /// Wire code of this dtype.
    const CODE: u8;
    /// Wraps an owned array of this element type.
    fn wrap(a: ArrayD<Self>) -> Array;
    /// Borrows `a` if it holds this element type.
    fn peek(a: &Array) -> Option<&ArrayD<Self>>;
    /// Mutably borrows `a` if it holds this element type.
    fn peek_mut(a: &mut Array) -> Option<&mut ArrayD<Self>>;
    /// Unwraps `a` if it holds this element type, or hands it back.
    fn unwrap(a: Array) -> Result<ArrayD<Self>, Array>;
}

macro_rules! dtypes {
    ($($variant:ident $t:ty = $code:expr;)*) => {
        /// A dtype-dynamic owned array (row-major, any dimension).
        #[derive(Debug, Clone, PartialEq)]
        pub enum Array {
            $(
                #[doc = concat!("An array of `", stringify!($t), "`.")]
                $variant(ArrayD<$t>),
            )*
        }

        $(
            impl sealed::Sealed for $t {}
            impl Element for $t {
                const CODE: u8 = $code;
                fn wrap(a: ArrayD<Self>) -> Array {
                    Array::$variant(a)
                }
                fn peek(a: &Array) -> Option<&ArrayD<Self>> {
                    match a {
                        Array::$variant(x) => Some(x),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    }
                }
                fn peek_mut(a: &mut Array) -> Option<&mut ArrayD<Self>> {
                    match a {
                        Array::$variant(x) => Some(x),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    }
                }
                fn unwrap(a: Array) -> Result<ArrayD<Self>, Array> {
                    match a {
                        Array::$variant(x) => Ok(x),
                        #[allow(unreachable_patterns)]
                        other => Err(other),
                    }
                }
            }
        )*

        impl Array {
            /// Wire code of the dtype (see [`Element::CODE`]).
            pub fn code(&self) -> u8 {
                match self { $(Array::$variant(_) => $code,)* }
            }
            /// Name of the dtype, e.g. `"f32"`.
            pub fn dtype_name(&self) -> &'static str {
                match self { $(Array::$variant(_) => stringify!($t),)* }
            }
            /// Shape of the array.
            pub fn shape(&self) -> &[usize] {
                match self { $(Array::$variant(x) => x.shape(),)* }
            }
            /// Payload size in bytes.
            pub fn nbytes(&self) -> usize {
                match self { $(Array::$variant(x) => x.len() * std::mem::size_of::<$t>(),)* }
            }
            /// Element size in bytes.
            pub fn elem_size(&self) -> usize {
                match self { $(Array::$variant(_) => std::mem::size_of::<$t>(),)* }
            }
            /// Calls `f` with the payload bytes in row-major order (borrowed when the array is
            /// contiguous, copied into a temporary otherwise).
            pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
                match self {
                    $(Array::$variant(x) => match x.as_slice() {
                        Some(s) => f(bytemuck::cast_slice(s)),
                        None => {
                            let v: Vec<$t> = x.iter().copied().collect();
                            f(bytemuck::cast_slice(&v))
                        }
                    },)*
                }
            }
            /// Builds an array of dtype `code` from row-major bytes.
            ///
            /// # Errors
            /// A message when the code is unknown or the byte count does not match the shape.
            pub fn from_bytes(code: u8, shape: &[usize], bytes: &[u8]) -> Result<Array, String> {
                match code {
                    $($code => {
                        let n: usize = shape.iter().product();
                        if n.checked_mul(std::mem::size_of::<$t>()) != Some(bytes.len()) {
                            return Err(format!(
                                "{} bytes do not fit shape {:?} of {}", bytes.len(), shape, stringify!($t)
                            ));
                        }
                        let v: Vec<$t> = bytemuck::pod_collect_to_vec(bytes);
                        ArrayD::from_shape_vec(shape.to_vec(), v)
                            .map(Array::$variant)
                            .map_err(|e| e.to_string())
                    })*
                    other => Err(format!("unknown dtype code {other}")),
                }
            }
        }
    };
}

dtypes! {
    F32 f32 = 1;
    F64 f64 = 2;
    I8 i8 = 3;
    I16 i16 = 4;
    I32 i32 = 5;
    I64 i64 = 6;
    U8 u8 = 7;
    U16 u16 = 8;
    U32 u32 = 9;
    U64 u64 = 10;
}

/// A small metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Meta {
    /// A signed integer.
    I64(i64),
    /// A float.
    F64(f64),
    /// A string.
    Str(String),
}

/// One element of a pipeline: named arrays plus small named metadata.
///
/// Names starting with `__` are reserved for the pipeline.
///
/// # Examples
/// ```
/// use shmpipe::{Item, ndarray::array};
/// let mut it = Item::new().with_array("x", array![1.0f32, 2.0]).with_i64("id", 7);
/// it.array_mut::<f32>("x").unwrap()[0] = 5.0;
/// assert_eq!(it.array::<f32>("x").unwrap()[0], 5.0);
/// assert!(it.array::<f64>("x").is_none());
/// assert_eq!(it.i64("id"), Some(7));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Item {
    arrays: Vec<(String, Slot)>,
    metas: Vec<(String, Meta)>,
}

impl PartialEq for Item {
    fn eq(&self, other: &Item) -> bool {
        self.metas == other.metas
            && self.arrays.len() == other.arrays.len()
            && self
                .arrays
                .iter()
                .zip(&other.arrays)
                .all(|((n, a), (m, b))| n == m && a.get() == b.get())
    }
}

/// An array as stored in an item (see [`Item::raw_arrays`]).
pub(crate) enum RawArray<'a> {
    /// On the heap.
    Owned(&'a Array),
    /// In shared memory: dtype code, shape and row-major bytes.
    InPlace {
        code: u8,
        shape: &'a [usize],
        bytes: &'a [u8],
    },
}

/// Where an item's array lives.
#[derive(Debug, Clone)]
enum Slot {
    /// On the heap.
    Owned(Array),
    /// In a shared-memory pool block of a received message (zero-copy), read in place.
    Leased(Arc<Leased>),
}

impl Slot {
    fn get(&self) -> &Array {
        match self {
            Slot::Owned(a) => a,
            Slot::Leased(l) => l.materialized(),
        }
    }
    fn into_owned(self) -> Array {
        match self {
            Slot::Owned(a) => a,
            Slot::Leased(l) => l.to_heap(),
        }
    }
    fn shape(&self) -> &[usize] {
        match self {
            Slot::Owned(a) => a.shape(),
            Slot::Leased(l) => &l.shape,
        }
    }
    fn nbytes(&self) -> usize {
        match self {
            Slot::Owned(a) => a.nbytes(),
            Slot::Leased(l) => l.bytes().len(),
        }
    }
}

/// An array read in place from a received shared-memory message. The message (and with it
/// the producer's pool block) is held until every item referring to it is dropped.
pub(crate) struct Leased {
    pub(crate) msg: Arc<shm_ring::Message>,
    pub(crate) record: usize,
    pub(crate) name: String,
    pub(crate) code: u8,
    pub(crate) shape: Vec<usize>,
    /// A heap copy, made on first dtype-dynamic access (`Item::get`).
    cache: OnceLock<Array>,
}

impl std::fmt::Debug for Leased {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leased")
            .field("name", &self.name)
            .field("code", &self.code)
            .field("shape", &self.shape)
            .finish()
    }
}

impl Leased {
    pub(crate) fn new(
        msg: Arc<shm_ring::Message>,
        record: usize,
        name: &str,
        code: u8,
        shape: Vec<usize>,
    ) -> Leased {
        Leased {
            msg,
            record,
            name: name.to_owned(),
            code,
            shape,
            cache: OnceLock::new(),
        }
    }

    fn bytes(&self) -> &[u8] {
        // Validated when the message was received and decoded; never fails afterwards.
        self.msg
            .record(self.record)
            .and_then(|r| r.array_bytes(&self.name))
            .unwrap_or(&[])
    }

    fn view<T: Element>(&self) -> Option<ArrayViewD<'_, T>> {
        if T::CODE != self.code {
            return None;
        }
        match bytemuck::try_cast_slice::<u8, T>(self.bytes()) {
            Ok(data) => ArrayViewD::from_shape(IxDyn(&self.shape), data).ok(),
            // Misaligned for T (never for pool blocks): read the heap copy.
            Err(_) => T::peek(self.materialized()).map(|a| a.view()),
        }
    }

    /// A heap copy (one copy: from the cache if there is one, else from shared memory).
    fn to_heap(&self) -> Array {
        match self.cache.get() {
            Some(a) => a.clone(),
            None => Array::from_bytes(self.code, &self.shape, self.bytes())
                .unwrap_or_else(|_| Array::U8(ArrayD::zeros(IxDyn(&[0])))),
        }
    }

    fn materialized(&self) -> &Array {
        self.cache.get_or_init(|| {
            Array::from_bytes(self.code, &self.shape, self.bytes())
                .unwrap_or_else(|_| Array::U8(ArrayD::zeros(IxDyn(&[0]))))
        })
    }
}

impl Item {
    /// An empty item.
    pub fn new() -> Item {
        Item::default()
    }

    /// Adds (or replaces) array `name`, builder style.
    pub fn with_array<T: Element, D: Dimension>(
        mut self,
        name: &str,
        a: ndarray::Array<T, D>,
    ) -> Item {
        self.set_array(name, a);
        self
    }

    /// Adds or replaces array `name`.
    pub fn set_array<T: Element, D: Dimension>(&mut self, name: &str, a: ndarray::Array<T, D>) {
        self.insert(name, T::wrap(a.into_dyn()));
    }

    /// Adds or replaces a dtype-dynamic array.
    pub fn insert(&mut self, name: &str, a: Array) {
        self.insert_slot(name, Slot::Owned(a));
    }

    fn insert_slot(&mut self, name: &str, a: Slot) {
        match self.arrays.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = a,
            None => self.arrays.push((name.to_owned(), a)),
        }
    }

    /// Adds an array read in place from shared memory.
    pub(crate) fn insert_leased(&mut self, name: &str, l: Leased) {
        self.insert_slot(name, Slot::Leased(Arc::new(l)));
    }

    /// A view of array `name`; `None` when absent or of another dtype.
    ///
    /// An array that crossed from a worker to the consumer zero-copy is viewed in place in
    /// shared memory (no copy); its pool block is held until the item is dropped.
    pub fn array<T: Element>(&self, name: &str) -> Option<ArrayViewD<'_, T>> {
        match &self.arrays.iter().find(|(n, _)| n == name)?.1 {
            Slot::Owned(a) => T::peek(a).map(|a| a.view()),
            Slot::Leased(l) => l.view::<T>(),
        }
    }

    /// Whether array `name` is read in place from shared memory (zero-copy).
    pub fn is_shared(&self, name: &str) -> bool {
        matches!(
            self.arrays.iter().find(|(n, _)| n == name),
            Some((_, Slot::Leased(_)))
        )
    }

    /// A mutable view of array `name`; `None` when absent or of another dtype. An array in
    /// shared memory is first copied to the heap (copy on write).
    pub fn array_mut<T: Element>(&mut self, name: &str) -> Option<ArrayViewMutD<'_, T>> {
        let slot = &mut self.arrays.iter_mut().find(|(n, _)| n == name)?.1;
        if let Slot::Leased(l) = slot {
            if l.code != T::CODE {
                return None;
            }
            *slot = Slot::Owned(l.to_heap());
        }
        match slot {
            Slot::Owned(a) => T::peek_mut(a).map(|a| a.view_mut()),
            Slot::Leased(_) => None,
        }
    }

    /// Removes and returns array `name` if it has dtype `T` (otherwise leaves it in place).
    pub fn take_array<T: Element>(&mut self, name: &str) -> Option<ArrayD<T>> {
        let pos = self
            .arrays
            .iter()
            .position(|(n, a)| n == name && a.get().code() == T::CODE)?;
        T::unwrap(self.arrays.remove(pos).1.into_owned()).ok()
    }

    /// The dtype-dynamic array `name` (an array in shared memory is copied to the heap on the
    /// first call; prefer [`Item::array`] to read it in place).
    pub fn get(&self, name: &str) -> Option<&Array> {
        self.arrays
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.get())
    }

    /// Removes and returns array `name` of any dtype.
    pub fn remove(&mut self, name: &str) -> Option<Array> {
        let pos = self.arrays.iter().position(|(n, _)| n == name)?;
        Some(self.arrays.remove(pos).1.into_owned())
    }

    /// All arrays in insertion order (dtype-dynamic, see [`Item::get`]).
    pub fn arrays(&self) -> impl Iterator<Item = (&str, &Array)> {
        self.arrays.iter().map(|(n, a)| (n.as_str(), a.get()))
    }

    /// Arrays as they are stored: leased ones as raw bytes in place (no heap copy).
    pub(crate) fn raw_arrays(&self) -> impl Iterator<Item = (&str, RawArray<'_>)> {
        self.arrays.iter().map(|(n, a)| {
            let raw = match a {
                Slot::Owned(a) => RawArray::Owned(a),
                Slot::Leased(l) => RawArray::InPlace {
                    code: l.code,
                    shape: &l.shape,
                    bytes: l.bytes(),
                },
            };
            (n.as_str(), raw)
        })
    }

    /// Names of the arrays in insertion order.
    pub fn array_names(&self) -> impl Iterator<Item = &str> {
        self.arrays.iter().map(|(n, _)| n.as_str())
    }

    /// Sets metadata `name`, replacing any previous value.
    pub fn set_meta(&mut self, name: &str, v: Meta) {
        match self.metas.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = v,
            None => self.metas.push((name.to_owned(), v)),
        }
    }

    /// Metadata `name` of any type.
    pub fn meta(&self, name: &str) -> Option<&Meta> {
        self.metas.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Removes metadata `name`.
    pub fn remove_meta(&mut self, name: &str) -> Option<Meta> {
        let pos = self.metas.iter().position(|(n, _)| n == name)?;
        Some(self.metas.remove(pos).1)
    }

    /// All metadata in insertion order.
    pub fn metas(&self) -> impl Iterator<Item = (&str, &Meta)> {
        self.metas.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// Sets an integer, builder style.
    pub fn with_i64(mut self, name: &str, v: i64) -> Item {
        self.set_i64(name, v);
        self
    }
    /// Sets an integer.
    pub fn set_i64(&mut self, name: &str, v: i64) {
        self.set_meta(name, Meta::I64(v));
    }
    /// Integer metadata `name`.
    pub fn i64(&self, name: &str) -> Option<i64> {
        match self.meta(name) {
            Some(Meta::I64(v)) => Some(*v),
            _ => None,
        }
    }

    /// Sets a float, builder style.
    pub fn with_f64(mut self, name: &str, v: f64) -> Item {
        self.set_f64(name, v);
        self
    }
    /// Sets a float.
    pub fn set_f64(&mut self, name: &str, v: f64) {
        self.set_meta(name, Meta::F64(v));
    }
    /// Float metadata `name`.
    pub fn f64(&self, name: &str) -> Option<f64> {
        match self.meta(name) {
            Some(Meta::F64(v)) => Some(*v),
            _ => None,
        }
    }

    /// Sets a string, builder style.
    pub fn with_str(mut self, name: &str, v: &str) -> Item {
        self.set_str(name, v);
        self
    }
    /// Sets a string.
    pub fn set_str(&mut self, name: &str, v: &str) {
        self.set_meta(name, Meta::Str(v.to_owned()));
    }
    /// String metadata `name`.
    pub fn str(&self, name: &str) -> Option<&str> {
        match self.meta(name) {
            Some(Meta::Str(v)) => Some(v),
            _ => None,
        }
    }

    /// Payload bytes of all arrays.
    pub fn nbytes(&self) -> usize {
        self.arrays.iter().map(|(_, a)| a.nbytes()).sum()
    }

    /// Approximate encoded size: payload plus names and metadata.
    pub(crate) fn wire_size(&self) -> usize {
        let arrays: usize = self
            .arrays
            .iter()
            .map(|(n, a)| n.len() + 16 + 8 * a.shape().len() + a.nbytes())
            .sum();
        let metas: usize = self
            .metas
            .iter()
            .map(|(n, v)| {
                n.len()
                    + 16
                    + match v {
                        Meta::Str(s) => s.len(),
                        _ => 8,
                    }
            })
            .sum();
        16 + arrays + metas
    }

    /// A short description for error messages (the `item_id` metadata when present).
    pub(crate) fn describe(&self) -> String {
        match self.meta("item_id") {
            Some(Meta::Str(s)) => format!("item_id {s:?}"),
            Some(Meta::I64(v)) => format!("item_id {v}"),
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn bytes_round_trip_every_dtype_and_layout() {
        let a = array![[1.5f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
        let t = Array::F32(a.t().to_owned().into_dyn());
        // A transposed (non-contiguous) view goes through the copying path.
        let tv = Array::F32(a.t().into_owned().into_dyn());
        for arr in [
            Array::F32(a.clone().into_dyn()),
            t,
            tv,
            Array::I64(array![-1i64, 2, i64::MAX].into_dyn()),
            Array::U8(array![[1u8], [2]].into_dyn()),
        ] {
            let back = arr
                .with_bytes(|b| Array::from_bytes(arr.code(), arr.shape(), b))
                .unwrap();
            assert_eq!(back, arr);
        }
        let strided = Array::F64(array![[1.0f64, 2.0], [3.0, 4.0]].reversed_axes().into_dyn());
        let back = strided
            .with_bytes(|b| Array::from_bytes(strided.code(), strided.shape(), b))
            .unwrap();
        assert_eq!(back, strided);
        assert!(Array::from_bytes(1, &[3], &[0u8; 8]).is_err());
        assert!(Array::from_bytes(99, &[1], &[0u8; 1]).is_err());
    }

    #[test]
    fn item_accessors_replace_and_take() {
        let mut it = Item::new()
            .with_array("x", array![1i32, 2])
            .with_str("item_id", "A");
        it.set_array("x", array![7i32]);
        assert_eq!(it.arrays().count(), 1);
        assert!(it.take_array::<f32>("x").is_none());
        assert_eq!(it.take_array::<i32>("x").unwrap(), array![7i32].into_dyn());
        assert!(it.get("x").is_none());
        assert_eq!(it.describe(), "item_id \"A\"");
        it.set_f64("s", 0.5);
        assert_eq!(it.f64("s"), Some(0.5));
        assert_eq!(it.i64("s"), None);
    }
}
