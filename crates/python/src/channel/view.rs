//! numpy arrays over memory that a Rust object keeps alive (a loan's block, a received
//! message's bytes): one call into numpy's C API, the Rust object as the array's base.

use numpy::npyffi::{self, NpyTypes, PY_ARRAY_API, npy_intp};
use numpy::{PyArrayDescrMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use shm_ring::DType;

/// A new zeroed numpy array (its own memory, writable) of `dt` and `shape`.
pub fn zeros<'py>(py: Python<'py>, dt: DType, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: a null data pointer makes numpy allocate the array's memory itself (C order).
    let arr = unsafe { new(py, dt, shape, std::ptr::null_mut(), 0)? };
    let a = arr.cast::<numpy::PyUntypedArray>()?;
    let n = a.len() * dt.size();
    // SAFETY: numpy allocated `n` bytes for the array just now; nobody else sees it yet.
    unsafe { std::ptr::write_bytes((*a.as_array_ptr()).data.cast::<u8>(), 0, n) };
    Ok(arr)
}

/// A new numpy array (its own memory, writable) of `dt` and `shape`, holding a copy of `bytes`
/// (row-major; exactly the array's size). Bool bytes other than 0/1 are refused.
pub fn copy<'py>(
    py: Python<'py>,
    dt: DType,
    shape: &[usize],
    bytes: &[u8],
) -> PyResult<Bound<'py, PyAny>> {
    if dt == DType::Bool && bytes.iter().any(|&b| b > 1) {
        return Err(crate::exceptions::CorruptMessage::new_err(
            "a byte other than 0/1 in a bool array",
        ));
    }
    // SAFETY: a null data pointer makes numpy allocate the array's memory itself (C order:
    // flags 0; numpy's own memory is writable).
    let arr = unsafe { new(py, dt, shape, std::ptr::null_mut(), 0)? };
    let a = arr.cast::<numpy::PyUntypedArray>()?;
    // SAFETY: numpy allocated a C-contiguous array of `shape` x `dt` just now.
    let data = unsafe { (*a.as_array_ptr()).data.cast::<u8>() };
    let n = a.len() * dt.size();
    if n != bytes.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{} bytes for an array of {n}",
            bytes.len()
        )));
    }
    // SAFETY: `data` holds `n` bytes of the new array, nobody else sees it yet; `bytes` is
    // other memory of the same length.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, n) };
    Ok(arr)
}

/// A C-ordered numpy array of `dt` and `shape` over the memory at `ptr`, whose base object is
/// `owner`; writable if `writable`.
///
/// # Safety
/// The `shape.product() * dt.size()` bytes at `ptr` stay mapped and in place while `owner`
/// lives, are writable if `writable`, and hold valid values of `dt` (for bool: bytes 0 or 1).
pub unsafe fn view<'py>(
    py: Python<'py>,
    dt: DType,
    shape: &[usize],
    ptr: *mut u8,
    owner: Bound<'py, PyAny>,
    writable: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let flags = if writable {
        npyffi::NPY_ARRAY_WRITEABLE
    } else {
        0
    };
    // SAFETY: the caller's contract.
    let arr = unsafe { new(py, dt, shape, ptr, flags)? };
    // SAFETY: `arr` is a fresh ndarray nobody else has seen; SetBaseObject steals the
    // reference to `owner` (and releases it on failure).
    let rc =
        unsafe { PY_ARRAY_API.PyArray_SetBaseObject(py, arr.as_ptr().cast(), owner.into_ptr()) };
    if rc < 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(arr)
}

/// A new ndarray of `dt` and `shape` over `ptr` (null: numpy allocates), with `flags`.
///
/// # Safety
/// A non-null `ptr` holds the array's bytes for as long as the array (or its base) lives.
unsafe fn new<'py>(
    py: Python<'py>,
    dt: DType,
    shape: &[usize],
    ptr: *mut u8,
    flags: std::ffi::c_int,
) -> PyResult<Bound<'py, PyAny>> {
    let mut dims = [0 as npy_intp; 32];
    if shape.len() > dims.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "an array of {} dimensions (numpy takes at most 32 here)",
            shape.len()
        )));
    }
    for (d, &s) in dims.iter_mut().zip(shape) {
        *d = npy_intp::try_from(s)
            .map_err(|_| pyo3::exceptions::PyValueError::new_err("dimension too large"))?;
    }
    // SAFETY: the API table is numpy's (imported once by the numpy crate); the descriptor
    // reference is handed over (NewFromDescr steals it); `dims` outlives the call; numpy
    // computes strides (C order) and the contiguity and alignment flags from the data pointer.
    let arr = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            PY_ARRAY_API.get_type_object(py, NpyTypes::PyArray_Type),
            crate::dtype::descr(py, dt).into_dtype_ptr(),
            shape.len() as std::ffi::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            ptr.cast(),
            flags,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: a new reference or null (with a Python error set).
    unsafe { Bound::from_owned_ptr_or_err(py, arr) }
}
