//! Python objects <-> shmpipe `Item`.
//!
//! **Flat dicts** (str keys; values numpy arrays of any shape, 0-d included, int, float and
//! str) convert here in one pass: arrays become the item's arrays, the rest its metadata. This
//! is the per-item path of a pipeline, so it makes no Python-level call.
//!
//! **Anything else** (bool, None, numpy scalars, nested dicts, lists and tuples, bytes, ints
//! beyond 64 bits, long strings, a value that is not a dict) goes through
//! `shmpipe._tree`: its arrays (and long strings and bytes, as uint8 arrays) become fields
//! named by their path, and the metadata field [`PY_META`] holds a small JSON description from
//! which [`to_py`] rebuilds the same Python object. Values that cannot travel are refused
//! there with a message naming the key and what to do.

use numpy::PyUntypedArray;
use numpy::npyffi::PyArray_Check;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyFloat, PyInt, PyString};
use shmpipe::{Array, Item, Meta};

use crate::{dtype, item_arrays};

/// The metadata field that holds the Python structure of an item that is not a flat dict
/// (read and written by `shmpipe._tree`).
pub const PY_META: &str = "__shmpipe_py__";

/// Longest key (bytes) a flat item keeps as a field name (the wire format's limit is 255).
const MAX_NAME: usize = 255;
/// Longest str (bytes) kept as metadata; longer ones travel as arrays (the limit is 65,535).
const MAX_STR: usize = 60_000;
/// Arrays up to this size are copied into a fresh numpy array on the way out; larger heap
/// arrays are handed over to numpy without a copy. On the way in, larger arrays are read in
/// place from their numpy buffer until they are sent ([`item_arrays::NumpyOwner`]): smaller ones
/// are copied into the batch's message anyway, and a reference costs more than their copy.
const COPY_MAX: usize = 64 << 10;

/// Keeps an item whose arrays are read in place (shared memory) alive for numpy views.
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen, weakref)]
pub struct ItemLease {
    item: Item,
}

/// The module `shmpipe._tree`, imported once.
fn tree(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static TREE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    TREE.get_or_try_init(py, || py.import("shmpipe._tree").map(Bound::unbind))
        .map(|m| m.bind(py))
}

/// Whether the fast path stored every field of the dict.
enum Flat {
    Done,
    /// A value (or key) only `shmpipe._tree` handles: start over there.
    NeedsTree,
}

/// Stores the fields of a flat dict in `item`; [`Flat::NeedsTree`] at the first value that
/// is not a fast-path value.
fn flat_fields(py: Python<'_>, d: &Bound<'_, PyDict>, item: &mut Item) -> PyResult<Flat> {
    for (k, v) in d.iter() {
        let Ok(k) = k.cast_exact::<PyString>() else {
            return Ok(Flat::NeedsTree);
        };
        let name = k.to_cow()?;
        let name: &str = &name;
        if name.len() > MAX_NAME || name == PY_META {
            return Ok(Flat::NeedsTree);
        }
        // SAFETY: `v` is a live object; `PyArray_Check` only reads its type.
        if unsafe { PyArray_Check(py, v.as_ptr()) } != 0 {
            // SAFETY: the cast is checked just above.
            let a = unsafe { v.cast_unchecked::<PyUntypedArray>() };
            if !array_field(py, name, a, item)? {
                return Ok(Flat::NeedsTree);
            }
        } else if v.is_exact_instance_of::<PyInt>() {
            match v.extract::<i64>() {
                Ok(x) => item.insert_meta(name, Meta::I64(x)),
                Err(_) => return Ok(Flat::NeedsTree),
            }
        } else if v.is_exact_instance_of::<PyFloat>() {
            // SAFETY: checked to be exactly a float.
            let f = unsafe { v.cast_unchecked::<PyFloat>() };
            item.insert_meta(name, Meta::F64(f.value()));
        } else if let Ok(s) = v.cast_exact::<PyString>() {
            let s = s.to_cow()?;
            let s: &str = &s;
            if s.len() > MAX_STR {
                return Ok(Flat::NeedsTree);
            }
            item.insert_meta(name, Meta::Str(s.to_owned()));
        } else {
            return Ok(Flat::NeedsTree);
        }
    }
    Ok(Flat::Done)
}

/// Copies array `a` into `item` as field `name`; `false` when its dtype or rank cannot
/// travel (the tree path then says why). A non-contiguous array is made contiguous first.
fn array_field(
    py: Python<'_>,
    name: &str,
    a: &Bound<'_, PyUntypedArray>,
    item: &mut Item,
) -> PyResult<bool> {
    // SAFETY: `a` is alive for this whole function and the GIL is held; before returning the
    // bytes are copied into the item, or the item holds a reference to `a` (`store`).
    if let Some(p) = unsafe { item_arrays::parts(a) } {
        store(name, a, &p, item)?;
        return Ok(true);
    }
    if dtype::of_descr(&numpy::PyUntypedArrayMethods::dtype(a)).is_none() {
        return Ok(false);
    }
    // Strided (a slice, a transpose): one C-ordered copy, same shape (ndim >= 1 here: a 0-d
    // array is always contiguous).
    let np = py.import("numpy")?;
    let c = np.call_method1("ascontiguousarray", (a,))?;
    let c = c.cast::<PyUntypedArray>()?;
    // SAFETY: as above, for `c`.
    match unsafe { item_arrays::parts(c) } {
        Some(p) => {
            store(name, c, &p, item)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Stores the contents `p` of array `a` in `item`: a large one read in place, the rest copied.
fn store(
    name: &str,
    a: &Bound<'_, PyUntypedArray>,
    p: &item_arrays::Parts<'_>,
    item: &mut Item,
) -> PyResult<()> {
    if p.bytes.len() > COPY_MAX && p.dtype != shmpipe::DType::Bool {
        let owner = std::sync::Arc::new(item_arrays::NumpyOwner::new(a, p));
        item.insert_external(name, p.dtype, &p.shape, owner)
            .map_err(PyTypeError::new_err)
    } else {
        let arr = Array::from_bytes(p.dtype, &p.shape, p.bytes).map_err(PyTypeError::new_err)?;
        item.insert(name, arr);
        Ok(())
    }
}

/// A Python object as an item: a flat dict directly, anything else through `shmpipe._tree`
/// (which refuses what cannot travel with a `TypeError` naming the key and the fix).
pub fn from_py(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Item> {
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut item = Item::new();
        if let Flat::Done = flat_fields(py, d, &mut item)? {
            return Ok(item);
        }
    }
    let r = tree(py)?.call_method1("flatten", (obj,))?;
    let (flat, desc): (Bound<'_, PyDict>, String) = r.extract()?;
    let mut item = Item::new();
    match flat_fields(py, &flat, &mut item)? {
        Flat::Done => {}
        Flat::NeedsTree => {
            return Err(PyTypeError::new_err(
                "shmpipe._tree.flatten left a value the flat path cannot store (a bug)",
            ));
        }
    }
    item.insert_meta(PY_META, Meta::Str(desc));
    Ok(item)
}

/// A heap array handed to numpy without a copy.
fn owned_to_py(py: Python<'_>, a: Array) -> Bound<'_, PyAny> {
    use numpy::PyArray;
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

/// The item's fields as a dict (metadata first, then arrays; [`PY_META`] left out) and the
/// description in [`PY_META`], if any. Arrays are writable numpy arrays: small ones copied
/// out, large heap ones handed over, ones in shared memory viewed in place (the views keep
/// the item, and with it the pool block, alive).
fn fields<'py>(py: Python<'py>, mut item: Item) -> PyResult<(Bound<'py, PyDict>, Option<String>)> {
    let d = PyDict::new(py);
    let mut desc = None;
    for (n, m) in item.metas() {
        match m {
            Meta::Str(s) if n == PY_META => desc = Some(s.clone()),
            Meta::I64(x) => d.set_item(n, *x)?,
            Meta::F64(x) => d.set_item(n, *x)?,
            Meta::Str(s) => d.set_item(n, s.as_str())?,
        }
    }
    let mut shared = false;
    let mut large = Vec::new();
    for (n, a) in item.arrays() {
        if a.is_shared() {
            shared = true;
        } else if a.nbytes() <= COPY_MAX {
            d.set_item(n, item_arrays::copy_out(py, &a)?)?;
        } else {
            large.push(n.to_owned());
        }
    }
    for n in large {
        if let Some(a) = item.remove(&n) {
            d.set_item(&n, owned_to_py(py, a))?;
        }
    }
    if shared {
        let owner = Bound::new(py, ItemLease { item })?;
        let it = &owner.get().item;
        for (n, a) in it.arrays().filter(|(_, a)| a.is_shared()) {
            // SAFETY: the bytes are in a pool block held by the item, which `owner` keeps
            // alive and never touches again (only drops it); the block is this consumer's
            // alone until then, so numpy may write to it.
            let v = unsafe {
                dtype::array_over(
                    py,
                    a.dtype(),
                    a.shape(),
                    a.bytes(),
                    owner.clone().into_any(),
                    true,
                )?
            };
            d.set_item(n, v)?;
        }
    }
    Ok((d, desc))
}

/// The Python object an item stands for: a flat dict, or what [`PY_META`] describes.
pub fn to_py(py: Python<'_>, item: Item) -> PyResult<Bound<'_, PyAny>> {
    let (d, desc) = fields(py, item)?;
    match desc {
        None => Ok(d.into_any()),
        Some(desc) => tree(py)?.call_method1("unflatten", (d, desc)),
    }
}
