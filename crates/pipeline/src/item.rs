//! The unit that flows through a pipeline: named arrays plus small metadata.
//!
//! The element types are shm-ring's ([`DType`], [`Element`]): every dtype a channel carries
//! (f16, bf16 and bool included) crosses a pipeline unchanged. An [`Item`] keeps its fields in
//! small inline vectors (no map, no allocation for a few fields with short names). Its heap
//! arrays and their conversions are in [`array`](crate::array).

use std::sync::Arc;

use ndarray::{ArrayViewD, ArrayViewMutD, IxDyn};
use smallvec::SmallVec;

use shm_ring::{DType, Element};

use crate::array::{Array, ArrayRef};
use crate::name::Name;

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

macro_rules! meta_from {
    ($($t:ty => |$v:ident| $e:expr;)*) => {$(
        impl From<$t> for Meta {
            fn from($v: $t) -> Meta {
                $e
            }
        }
    )*};
}
meta_from! {
    i64 => |v| Meta::I64(v);
    i32 => |v| Meta::I64(i64::from(v));
    u32 => |v| Meta::I64(i64::from(v));
    f64 => |v| Meta::F64(v);
    &str => |v| Meta::Str(v.to_owned());
    &String => |v| Meta::Str(v.clone());
    String => |v| Meta::Str(v);
}

/// Memory an item's array may be read from in place besides the heap and shared memory: a
/// buffer owned by something else, e.g. a numpy array of a Python host. An item holding one
/// ([`Item::insert_external`]) reads it without a copy until it is sent (the bytes are copied
/// once, into the message) or written ([`Item::array_mut`] copies it to the heap first).
///
/// The buffer's values may change while the item holds it (it is not ours), but its length
/// must not: an item that finds fewer bytes than its shape needs reads the array as empty.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use shmpipe::{ArrayOwner, DType, Item};
/// struct Bytes(Vec<u8>);
/// impl ArrayOwner for Bytes {
///     fn bytes(&self) -> &[u8] {
///         &self.0
///     }
/// }
/// let owner = Arc::new(Bytes(bytemuck::cast_slice(&[1.5f32, 2.0]).to_vec()));
/// let mut it = Item::new();
/// it.insert_external("x", DType::F32, &[2], owner).unwrap();
/// assert_eq!(it.array::<f32>("x").unwrap()[1], 2.0);
/// ```
pub trait ArrayOwner: Send + Sync + 'static {
    /// The array's bytes, row-major.
    fn bytes(&self) -> &[u8];
}

/// An array in an [`ArrayOwner`]'s buffer: its dtype, shape and byte count as checked when
/// it entered the item.
struct External {
    dtype: DType,
    shape: SmallVec<[usize; 4]>,
    len: usize,
    owner: Arc<dyn ArrayOwner>,
}

impl std::fmt::Debug for External {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("External")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

/// Where an item's array lives.
#[derive(Debug, Clone)]
enum Slot {
    /// On the heap (always in row-major layout). Boxed: an `ndarray` array is over a hundred
    /// bytes, and items move by value through batches and steps several times per hop.
    Owned(Box<Array>),
    /// In a shared-memory pool block of a received message (zero-copy), read in place.
    Leased(Arc<Leased>),
    /// A small array of a received batch, in the batch's heap buffer (see [`crate::arena`]).
    Batch(crate::arena::Shared, u32),
    /// In a buffer of an [`ArrayOwner`], read in place.
    External(Arc<External>),
}

impl Slot {
    fn raw(&self) -> ArrayRef<'_> {
        match self {
            Slot::Owned(a) => a.raw(),
            Slot::Leased(l) => ArrayRef {
                dtype: l.dtype,
                shape: &l.shape,
                bytes: l.bytes(),
                shared: true,
            },
            Slot::Batch(b, i) => {
                // The cell is set before any item of the batch is handed out.
                let (dtype, shape, bytes) = b
                    .get()
                    .map_or((DType::U8, &[0][..], &[][..]), |b| b.get(*i));
                ArrayRef {
                    dtype,
                    shape,
                    bytes,
                    shared: false,
                }
            }
            Slot::External(x) => ArrayRef {
                dtype: x.dtype,
                shape: &x.shape,
                // A buffer that shrank reads as empty (never out of bounds).
                bytes: x.owner.bytes().get(..x.len).unwrap_or(&[]),
                shared: false,
            },
        }
    }
}

/// An array read in place from a received shared-memory message. The message (and with it
/// the producer's pool block) is held until every item referring to it is dropped.
pub(crate) struct Leased {
    msg: Arc<shm_ring::Message>,
    record: usize,
    name: Name,
    dtype: DType,
    shape: SmallVec<[usize; 4]>,
}

impl std::fmt::Debug for Leased {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leased")
            .field("name", &self.name.as_str())
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish()
    }
}

impl Leased {
    /// `dtype` must not be bool (its bytes are checked when copied out, never viewed).
    pub(crate) fn new(
        msg: Arc<shm_ring::Message>,
        record: usize,
        name: &str,
        dtype: DType,
        shape: &[usize],
    ) -> Leased {
        Leased {
            msg,
            record,
            name: Name::new(name),
            dtype,
            shape: shape.into(),
        }
    }

    fn bytes(&self) -> &[u8] {
        // Validated when the message was received and decoded; never fails afterwards.
        self.msg
            .record(self.record)
            .and_then(|r| r.array_bytes(self.name.as_str()))
            .unwrap_or(&[])
    }
}

/// One element of a pipeline: named arrays plus small named metadata.
///
/// One name per operation, for arrays and for metadata alike:
///
/// | operation | arrays | metadata |
/// |---|---|---|
/// | add or replace | [`insert`](Item::insert) / builder [`with`](Item::with) | [`insert_meta`](Item::insert_meta) / builder [`with_meta`](Item::with_meta) |
/// | read (no copy) | [`array`](Item::array) (typed), [`get`](Item::get) (any dtype) | [`meta`](Item::meta), typed [`i64`](Item::i64) [`f64`](Item::f64) [`str`](Item::str) |
/// | write | [`array_mut`](Item::array_mut) | `insert_meta` |
/// | take out | [`remove`](Item::remove) | [`remove_meta`](Item::remove_meta) |
/// | list | [`arrays`](Item::arrays) | [`metas`](Item::metas) |
///
/// Arrays that arrived zero-copy stay in shared memory: reading them (`array`, `get`,
/// `arrays`) never copies; `array_mut` and `remove` copy them to the heap (they hand out
/// something writable or owned), as does [`ArrayRef::to_owned`].
///
/// # Examples
/// ```
/// use shmpipe::{Item, ndarray::array};
/// let mut it = Item::new().with("x", array![1.0f32, 2.0]).with_meta("id", 7);
/// it.array_mut::<f32>("x").unwrap()[0] = 5.0;
/// assert_eq!(it.array::<f32>("x").unwrap()[0], 5.0);
/// assert!(it.array::<f64>("x").is_none());
/// assert_eq!(it.get("x").unwrap().dtype(), shmpipe::DType::F32);
/// assert_eq!(it.i64("id"), Some(7));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Item {
    arrays: SmallVec<[(Name, Slot); 2]>,
    metas: SmallVec<[(Name, Meta); 2]>,
}

impl PartialEq for Item {
    fn eq(&self, other: &Item) -> bool {
        self.metas == other.metas
            && self.arrays.len() == other.arrays.len()
            && self
                .arrays
                .iter()
                .zip(&other.arrays)
                .all(|((n, a), (m, b))| {
                    let (a, b) = (a.raw(), b.raw());
                    n == m && a.dtype == b.dtype && a.shape == b.shape && a.bytes == b.bytes
                })
    }
}

impl Item {
    /// An empty item.
    pub fn new() -> Item {
        Item::default()
    }

    /// Adds (or replaces) array `name`, builder style. Takes any owned `ndarray` array of a
    /// [`DType`] element type (bool included), or an [`Array`].
    pub fn with(mut self, name: &str, a: impl Into<Array>) -> Item {
        self.insert(name, a);
        self
    }

    /// Adds or replaces array `name` (an array not in row-major layout is copied into it).
    pub fn insert(&mut self, name: &str, a: impl Into<Array>) {
        let a = a.into().standard();
        self.insert_slot(name, Slot::Owned(Box::new(a)));
    }

    fn insert_slot(&mut self, name: &str, a: Slot) {
        match self.arrays.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = a,
            None => self.arrays.push((Name::new(name), a)),
        }
    }

    /// Adds or replaces array `name`, read in place from `owner`'s buffer (no copy): the
    /// bytes of `shape` elements of `dtype`, row-major. See [`ArrayOwner`].
    ///
    /// # Errors
    /// A message when the buffer's length does not match the shape, and for bool (not every
    /// byte is a bool, and the buffer may change: copy bool arrays with
    /// [`Array::from_bytes`]).
    pub fn insert_external(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        owner: Arc<dyn ArrayOwner>,
    ) -> Result<(), String> {
        if dtype == DType::Bool {
            return Err("a bool array cannot be read in place from a foreign buffer".into());
        }
        let n = shape
            .iter()
            .try_fold(dtype.size(), |a, &d| a.checked_mul(d));
        let len = owner.bytes().len();
        if n != Some(len) {
            return Err(format!("{len} bytes do not fit shape {shape:?} of {dtype}"));
        }
        let x = External {
            dtype,
            shape: shape.into(),
            len,
            owner,
        };
        self.insert_slot(name, Slot::External(Arc::new(x)));
        Ok(())
    }

    /// Adds an array read in place from shared memory.
    pub(crate) fn insert_leased(&mut self, name: &str, l: Leased) {
        self.insert_slot(name, Slot::Leased(Arc::new(l)));
    }

    /// Adds an array decoded from a message, name already checked to be new.
    pub(crate) fn push_array(&mut self, name: &str, a: Array) {
        self.arrays
            .push((Name::new(name), Slot::Owned(Box::new(a))));
    }

    /// Adds array `i` of a received batch's buffer, name already checked to be new.
    pub(crate) fn push_batch_array(&mut self, name: &str, b: &crate::arena::Shared, i: u32) {
        self.arrays
            .push((Name::new(name), Slot::Batch(Arc::clone(b), i)));
    }

    /// A typed view of array `name` (no copy); `None` when absent or of another dtype.
    ///
    /// An array that crossed from a worker to the consumer zero-copy is viewed in place in
    /// shared memory; its pool block is held until the item is dropped.
    pub fn array<T: Element>(&self, name: &str) -> Option<ArrayViewD<'_, T>> {
        self.get(name)?.view()
    }

    /// A view of array `name` of any dtype (no copy).
    pub fn get(&self, name: &str) -> Option<ArrayRef<'_>> {
        self.arrays
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.raw())
    }

    /// A mutable view of array `name`; `None` when absent or of another dtype. An array in
    /// shared memory is first copied to the heap (copy on write).
    pub fn array_mut<T: Element>(&mut self, name: &str) -> Option<ArrayViewMutD<'_, T>> {
        let slot = &mut self.arrays.iter_mut().find(|(n, _)| n == name)?.1;
        if slot.raw().dtype != T::DTYPE {
            return None;
        }
        if !matches!(slot, Slot::Owned(_)) {
            *slot = Slot::Owned(Box::new(slot.raw().to_owned()));
        }
        let Slot::Owned(a) = slot else { return None };
        if a.typed_mut::<T>().is_some() {
            // A view of the array itself: no shape conversion and no stride checks.
            return a.typed_mut::<T>().map(|x| x.view_mut());
        }
        let shape = IxDyn(a.shape());
        let data = bytemuck::try_cast_slice_mut::<u8, T>(a.bytes_mut()?).ok()?;
        ArrayViewMutD::from_shape(shape, data).ok()
    }

    /// Removes and returns array `name` (an array in shared memory is copied to the heap).
    /// For a typed array: `item.remove("x").map(|a| a.into_typed::<f32>())`.
    pub fn remove(&mut self, name: &str) -> Option<Array> {
        let pos = self.arrays.iter().position(|(n, _)| n == name)?;
        Some(match self.arrays.remove(pos).1 {
            Slot::Owned(a) => *a,
            s => s.raw().to_owned(),
        })
    }

    /// All arrays in insertion order, as views (no copy).
    pub fn arrays(&self) -> impl ExactSizeIterator<Item = (&str, ArrayRef<'_>)> {
        self.arrays.iter().map(|(n, a)| (n.as_str(), a.raw()))
    }

    /// Adds or replaces metadata `name` (an `i64`/`i32`/`u32`, `f64`, string or [`Meta`]).
    pub fn insert_meta(&mut self, name: &str, v: impl Into<Meta>) {
        let v = v.into();
        match self.metas.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = v,
            None => self.metas.push((Name::new(name), v)),
        }
    }

    /// Adds metadata decoded from a message, name already checked to be new.
    pub(crate) fn push_meta(&mut self, name: &str, v: Meta) {
        self.metas.push((Name::new(name), v));
    }

    /// Adds or replaces metadata `name`, builder style.
    pub fn with_meta(mut self, name: &str, v: impl Into<Meta>) -> Item {
        self.insert_meta(name, v);
        self
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
    pub fn metas(&self) -> impl ExactSizeIterator<Item = (&str, &Meta)> {
        self.metas.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// Integer metadata `name`.
    pub fn i64(&self, name: &str) -> Option<i64> {
        match self.meta(name) {
            Some(Meta::I64(v)) => Some(*v),
            _ => None,
        }
    }

    /// Float metadata `name`.
    pub fn f64(&self, name: &str) -> Option<f64> {
        match self.meta(name) {
            Some(Meta::F64(v)) => Some(*v),
            _ => None,
        }
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
        self.arrays.iter().map(|(_, a)| a.raw().nbytes()).sum()
    }

    /// Approximate encoded size (payload plus names and metadata), and how many arrays go
    /// zero-copy under `transfer`: one pass, no copy.
    pub(crate) fn wire_size(&self, transfer: &shm_ring::Transfer) -> (usize, usize) {
        let mut size = 16;
        let mut zero_copy = 0;
        for (n, a) in &self.arrays {
            let a = a.raw();
            size += n.len() + 32 + 8 * a.shape.len() + a.bytes.len();
            zero_copy += usize::from(transfer.zero_copy(a.bytes.len()));
        }
        for (n, v) in &self.metas {
            size += n.len()
                + 32
                + match v {
                    Meta::Str(s) => s.len(),
                    _ => 0,
                };
        }
        (size, zero_copy)
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
        for arr in [
            Array::from(a.clone()),
            Array::from(a.t().to_owned()),
            Array::from(array![-1i64, 2, i64::MAX]),
            Array::from(array![[1u8], [2]]),
            Array::from(array![half::f16::from_f32(1.5), half::f16::MAX]),
            Array::from(array![half::bf16::from_f32(-2.0)]),
            Array::from(array![[true, false], [false, true]]),
        ] {
            let it = Item::new().with("a", arr.clone());
            let r = it.get("a").unwrap();
            assert_eq!(
                Array::from_bytes(r.dtype(), r.shape(), r.bytes()).unwrap(),
                arr
            );
            assert_eq!(r.to_owned(), arr);
        }
        assert_eq!(
            Array::from(a.clone()).view::<f32>().unwrap(),
            a.view().into_dyn()
        );
        assert!(Array::from(a.clone()).view::<f64>().is_none());
        // A non-contiguous array is made row-major when it enters an item.
        let strided = array![[1.0f64, 2.0], [3.0, 4.0]].reversed_axes();
        let it = Item::new().with("s", strided.clone());
        let back = it.get("s").unwrap().to_owned();
        assert_eq!(back, Array::from(strided));
        assert!(Array::from_bytes(DType::F32, &[3], &[0u8; 8]).is_err());
        assert!(Array::from_bytes(DType::Bool, &[2], &[1, 2]).is_err());
    }

    struct Buf(Vec<u8>);
    impl ArrayOwner for Buf {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
    }

    #[test]
    fn external_arrays_are_read_in_place_and_copied_on_write() {
        let owner = Arc::new(Buf(bytemuck::cast_slice(&[1i32, 2, 3, 4, 5, 6]).to_vec()));
        let mut it = Item::new();
        it.insert_external("x", DType::I32, &[2, 3], owner.clone())
            .unwrap();
        let r = it.get("x").unwrap();
        assert_eq!(r.bytes().as_ptr(), owner.0.as_ptr(), "no copy");
        assert!(!r.is_shared());
        assert_eq!(it.array::<i32>("x").unwrap()[[1, 2]], 6);
        it.array_mut::<i32>("x").unwrap()[[0, 0]] = 9;
        assert_eq!(it.array::<i32>("x").unwrap()[[0, 0]], 9);
        assert_eq!(owner.0[0], 1, "the owner's buffer is never written");
        let mut it = Item::new();
        assert!(
            it.insert_external("x", DType::I32, &[4], owner.clone())
                .is_err()
        );
        assert!(
            it.insert_external("x", DType::Bool, &[24], owner.clone())
                .is_err()
        );
        assert!(it.get("x").is_none());
        it.insert_external("y", DType::U8, &[24], owner).unwrap();
        assert_eq!(
            it.remove("y").unwrap().into_typed::<u8>().unwrap().len(),
            24
        );
    }

    #[test]
    fn item_accessors_replace_and_remove() {
        let mut it = Item::new()
            .with("x", array![1i32, 2])
            .with_meta("item_id", "A");
        it.insert("x", array![7i32]);
        assert_eq!(it.arrays().count(), 1);
        assert!(it.array::<f32>("x").is_none());
        let x = it.remove("x").unwrap();
        assert!(it.get("x").is_none());
        let x = x.into_typed::<f32>().unwrap_err();
        assert_eq!(x.into_typed::<i32>().unwrap(), array![7i32].into_dyn());
        assert_eq!(it.describe(), "item_id \"A\"");
        it.insert_meta("s", 0.5);
        assert_eq!(it.f64("s"), Some(0.5));
        assert_eq!(it.i64("s"), None);
        let mut b = Item::new().with("m", array![true, false]);
        assert!(b.array_mut::<u8>("m").is_none(), "bool is not u8");
        assert_eq!(b.get("m").unwrap().bytes(), &[1, 0]);
        assert_eq!(
            b.remove("m").unwrap().into_typed::<u8>().unwrap_err(),
            Array::from(array![true, false])
        );
    }
}
