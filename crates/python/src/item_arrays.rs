//! numpy arrays in and out of pipeline items, one C-API call or two each: the per-item path
//! of a Python pipeline (no Python-level call such as `np.ascontiguousarray` unless the array
//! needs one).

use numpy::npyffi::{self, NPY_ARRAY_C_CONTIGUOUS, PY_ARRAY_API, npy_intp};
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use shmpipe::{ArrayOwner, ArrayRef, DType};
use smallvec::SmallVec;

/// Largest rank an item's array may have (the wire format's limit).
pub const MAX_NDIM: usize = 16;

/// A numpy array's contents, read in place.
pub struct Parts<'a> {
    pub dtype: DType,
    pub shape: SmallVec<[usize; 4]>,
    /// Row-major.
    pub bytes: &'a [u8],
}

/// A numpy array's [`Parts`]; `None` when the array cannot travel as it is (dtype not
/// carried, not C-contiguous, rank over [`MAX_NDIM`]).
///
/// # Safety
/// The slice borrows the array's memory: the caller keeps `a` alive and holds the GIL while
/// the slice is used (numpy frees or moves the data only under the GIL).
pub unsafe fn parts<'a>(a: &Bound<'_, PyUntypedArray>) -> Option<Parts<'a>> {
    let ptr = a.as_array_ptr();
    // SAFETY: `a` is a live numpy array (checked by the cast that made it); its header is
    // read under the GIL.
    let (nd, dims, data, flags) =
        unsafe { ((*ptr).nd, (*ptr).dimensions, (*ptr).data, (*ptr).flags) };
    let nd = usize::try_from(nd).ok()?;
    if nd > MAX_NDIM || flags & NPY_ARRAY_C_CONTIGUOUS == 0 {
        return None;
    }
    let dt = crate::dtype::of_descr(&a.dtype())?;
    // SAFETY: `dimensions` holds `nd` entries for a live array (none to read for nd == 0).
    let dims: &[npy_intp] = if nd == 0 {
        &[]
    } else {
        // SAFETY: see above.
        unsafe { std::slice::from_raw_parts(dims, nd) }
    };
    let shape: SmallVec<[usize; 4]> = dims.iter().map(|&d| d as usize).collect();
    let n = shape
        .iter()
        .try_fold(dt.size(), |acc, &d| acc.checked_mul(d))?;
    let bytes = if n == 0 || data.is_null() {
        &[][..]
    } else {
        // SAFETY: a C-contiguous array holds `prod(shape) * itemsize` bytes at `data`; the
        // caller keeps it alive and holds the GIL (contract above).
        unsafe { std::slice::from_raw_parts(data as *const u8, n) }
    };
    Some(Parts {
        dtype: dt,
        shape,
        bytes,
    })
}

/// A new numpy array holding a copy of `a` (one allocation by numpy, one `memcpy`). `bf16`
/// comes out as its `uint16` bits (numpy has no bf16).
pub fn copy_out<'py>(py: Python<'py>, a: &ArrayRef<'_>) -> PyResult<Bound<'py, PyAny>> {
    let descr = crate::dtype::descr(py, a.dtype());
    let mut dims: SmallVec<[npy_intp; 4]> = a.shape().iter().map(|&d| d as npy_intp).collect();
    // SAFETY: `PyArray_NewFromDescr` steals the descr reference `into_dtype_ptr` hands over
    // and returns a new C-contiguous array of `dims` (or null with an exception set); with
    // `data` null numpy allocates the buffer itself.
    let arr = unsafe {
        let p = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            PY_ARRAY_API.get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            descr.into_dtype_ptr(),
            dims.len() as std::ffi::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(py, p)?
    };
    let bytes = a.bytes();
    if !bytes.is_empty() {
        // SAFETY: the new array is C-contiguous with `prod(shape)` elements of the same size
        // as `a`'s, i.e. exactly `bytes.len()` bytes at `data`, and nobody else has seen it.
        // A bool array's bytes are 0 or 1 (an item checks them when they enter it).
        unsafe {
            let data = (*(arr.as_ptr() as *mut npyffi::PyArrayObject)).data as *mut u8;
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, bytes.len());
        }
    }
    Ok(arr)
}

/// A numpy array whose buffer an item reads in place ([`shmpipe::Item::insert_external`]).
///
/// The reference keeps the array, and with it its buffer, alive and in place: numpy moves or
/// frees an array's data only when the array goes (or is resized with `refcheck=False`,
/// which numpy documents as unsafe for any view of it, as this is). The item may be dropped
/// in a thread without the GIL: pyo3 then defers the decref to the next holder of the GIL.
pub struct NumpyOwner {
    _arr: Py<PyAny>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the buffer is only read (never through Python), and `Py` is `Send + Sync`; the
// pointer stays valid for as long as `_arr` holds the array (see above).
unsafe impl Send for NumpyOwner {}
// SAFETY: as above; `bytes` hands out shared reads only.
unsafe impl Sync for NumpyOwner {}

impl NumpyOwner {
    /// The buffer of `a` as described by `parts` (taken from `a` under the GIL just before).
    pub fn new(a: &Bound<'_, PyUntypedArray>, parts: &Parts<'_>) -> NumpyOwner {
        NumpyOwner {
            _arr: a.clone().into_any().unbind(),
            ptr: parts.bytes.as_ptr(),
            len: parts.bytes.len(),
        }
    }
}

impl ArrayOwner for NumpyOwner {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr + len` is the C-contiguous buffer of the array `_arr` keeps alive
        // and in place (see the type's doc); its values may change (the user owns it), its
        // extent does not.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
