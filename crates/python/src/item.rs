//! shmpipe `Item` <-> Python dict (numpy arrays and int/float/str metadata in one flat dict).

use numpy::{PyArray, PyUntypedArray};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};
use shmpipe::{Array, Item, Meta};

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
        Array::F16(x) => PyArray::from_owned_array(py, x).into_any(),
        Array::Bool(x) => PyArray::from_owned_array(py, x).into_any(),
        // numpy has no bf16: its bits, as the channel binding hands them out.
        Array::BF16(x) => PyArray::from_owned_array(py, x.mapv(half::bf16::to_bits)).into_any(),
    }
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
    let names: Vec<String> = item.arrays().map(|(n, _)| n.to_owned()).collect();
    let mut shared = Vec::new();
    for n in names {
        if item.get(&n).is_some_and(|a| a.is_shared()) {
            shared.push(n);
        } else if let Some(a) = item.remove(&n) {
            d.set_item(&n, owned_to_py(py, a))?;
        }
    }
    if !shared.is_empty() {
        let owner = Bound::new(py, ItemLease { item })?;
        let it = &owner.get().item;
        for n in shared {
            let Some(a) = it.get(&n) else { continue };
            // SAFETY: the bytes are in a pool block held by the item, which `owner` keeps
            // alive and never touches again (only drops it); the block is this consumer's
            // alone until then, so numpy may write to it.
            let a = unsafe {
                dtype::array_over(
                    py,
                    a.dtype(),
                    a.shape(),
                    a.bytes(),
                    owner.clone().into_any(),
                    true,
                )?
            };
            d.set_item(&n, a)?;
        }
    }
    Ok(d)
}

/// A flat dict (numpy arrays or array-likes, and int/float/str metadata) as an item.
///
/// Pipelines carry arrays of every dtype a channel carries (float16/32/64, bfloat16, int8..64,
/// uint8..64, bool).
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
            item.insert_meta(&name, Meta::I64(v.extract()?));
        } else if v.is_instance_of::<PyFloat>() {
            item.insert_meta(&name, Meta::F64(v.extract()?));
        } else if v.is_instance_of::<PyString>() {
            item.insert_meta(&name, Meta::Str(v.extract()?));
        } else {
            let arr = np.call_method1("ascontiguousarray", (&v,))?;
            let a = arr.cast::<PyUntypedArray>()?;
            // SAFETY: `arr` is alive for the whole use of `bytes` (copied just below).
            let (dt, shape, bytes) = unsafe { dtype::raw_parts(a)? };
            let a = Array::from_bytes(dt, &shape, bytes).map_err(PyTypeError::new_err)?;
            item.insert(&name, a);
        }
    }
    Ok(item)
}
