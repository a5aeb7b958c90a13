//! shmpipe `Item` <-> Python dict (numpy arrays and int/float/str metadata in one flat dict).

use numpy::{PyArray, PyUntypedArray};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};
use shm_ring::DType;
use shmpipe::{Array, Element, Item, Meta};

use crate::dtype;

/// Keeps an item whose arrays are read in place (shared memory) alive for numpy views.
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen, weakref)]
pub struct ItemLease {
    item: Item,
}

fn owned_to_py<'py>(py: Python<'py>, a: Array) -> Bound<'py, PyAny> {
    // `from_owned_array` hands the heap buffer to numpy: no copy.
    match a {
        Array::F32(x) => PyArray::from_owned_array(py, x).into_any(),
        Array::F64(x) => PyArray::from_owned_array(py, x).into_any(),
        Array::I8(x) => PyArray::from_owned_array(py, x).into_any(),
        Array::I16(x) => PyArray::from_owned_array(py, x).into_any(),
        Array::I32(x) => PyArray::from_owned_array(py, x).into_any(),
        Array::I64(x) => PyArray::from_owned_array(py, x).into_any(),
        Array::U8(x) => PyArray::from_owned_array(py, x).into_any(),
        Array::U16(x) => PyArray::from_owned_array(py, x).into_any(),
        Array::U32(x) => PyArray::from_owned_array(py, x).into_any(),
        Array::U64(x) => PyArray::from_owned_array(py, x).into_any(),
    }
}

/// The dtype and bytes of array `name` of `item`, read in place.
fn in_place<'a>(item: &'a Item, name: &str) -> Option<(DType, Vec<usize>, &'a [u8])> {
    macro_rules! try_t {
        ($($t:ty => $d:ident),*) => {$(
            if let Some(v) = item.array::<$t>(name) {
                let shape = v.shape().to_vec();
                let s = v.to_slice()?;
                // SAFETY: same memory, reinterpreted as bytes (plain old data).
                let b = unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) };
                return Some((DType::$d, shape, b));
            }
        )*};
    }
    try_t!(f32 => F32, f64 => F64, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8,
        u16 => U16, u32 => U32, u64 => U64);
    None
}

/// The item as a flat dict: arrays (numpy, writable) and metadata. Heap arrays are handed
/// over without copying; arrays in shared memory are views that keep the item (and with it
/// the pool block) alive.
pub fn to_py<'py>(py: Python<'py>, mut item: Item) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (n, m) in item.metas() {
        match m {
            Meta::I64(x) => d.set_item(n, *x)?,
            Meta::F64(x) => d.set_item(n, *x)?,
            Meta::Str(s) => d.set_item(n, s.as_str())?,
        }
    }
    let names: Vec<String> = item.array_names().map(str::to_owned).collect();
    let mut shared = Vec::new();
    for n in names {
        if item.is_shared(&n) {
            shared.push(n);
        } else if let Some(a) = item.remove(&n) {
            d.set_item(&n, owned_to_py(py, a))?;
        }
    }
    if !shared.is_empty() {
        let owner = Bound::new(py, ItemLease { item })?;
        let it = &owner.get().item;
        for n in shared {
            match in_place(it, &n) {
                Some((dt, shape, bytes)) => {
                    // SAFETY: the bytes are in a pool block held by the item, which `owner`
                    // keeps alive and never touches again (only drops it); the block is this
                    // consumer's alone until then, so numpy may write to it.
                    let a = unsafe {
                        dtype::array_over(py, dt, &shape, bytes, owner.clone().into_any(), true)?
                    };
                    d.set_item(&n, a)?;
                }
                None => {
                    if let Some(a) = it.get(&n) {
                        d.set_item(&n, owned_to_py(py, a.clone()))?;
                    }
                }
            }
        }
    }
    Ok(d)
}

/// A flat dict (numpy arrays or array-likes, and int/float/str metadata) as an item.
///
/// Pipelines carry f32, f64, int8..64 and uint8..64 arrays; `bool` arrays travel as uint8.
pub fn from_py(py: Python<'_>, d: &Bound<'_, PyAny>) -> PyResult<Item> {
    let d = d.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "pipeline items are dicts, not {}",
            d.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    let np = py.import("numpy")?;
    let mut item = Item::new();
    for (k, v) in d.iter() {
        let name: String = k.extract()?;
        if v.is_instance_of::<PyBool>() || v.is_instance_of::<PyInt>() {
            item.set_meta(&name, Meta::I64(v.extract()?));
        } else if v.is_instance_of::<PyFloat>() {
            item.set_meta(&name, Meta::F64(v.extract()?));
        } else if v.is_instance_of::<PyString>() {
            item.set_meta(&name, Meta::Str(v.extract()?));
        } else {
            let arr = np.call_method1("ascontiguousarray", (&v,))?;
            let a = arr.cast::<PyUntypedArray>()?;
            // SAFETY: `arr` is alive for the whole use of `bytes` (copied just below).
            let (dt, shape, bytes) = unsafe { dtype::raw_parts(a)? };
            let code = match dt {
                DType::F32 => f32::CODE,
                DType::F64 => f64::CODE,
                DType::I8 => i8::CODE,
                DType::I16 => i16::CODE,
                DType::I32 => i32::CODE,
                DType::I64 => i64::CODE,
                DType::U8 | DType::Bool => u8::CODE,
                DType::U16 => u16::CODE,
                DType::U32 => u32::CODE,
                DType::U64 => u64::CODE,
                other => {
                    return Err(PyTypeError::new_err(format!(
                        "array {name:?}: pipelines carry float32/64, int8..64 and uint8..64 \
                         arrays, not {other} (convert it, e.g. arr.astype(np.float32))"
                    )));
                }
            };
            let a = Array::from_bytes(code, &shape, bytes).map_err(PyTypeError::new_err)?;
            item.insert(&name, a);
        }
    }
    Ok(item)
}
