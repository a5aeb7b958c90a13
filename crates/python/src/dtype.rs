//! numpy dtypes <-> shm-ring dtypes, and numpy arrays over memory that Rust keeps alive.

use half::f16;
use ndarray::{ArrayViewD, IxDyn};
use numpy::{
    Element, PyArray, PyArrayDescr, PyArrayDescrMethods, PyArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods, npyffi,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use shm_ring::DType;

/// The dtype of a numpy dtype; `None` for one the channels and pipelines do not carry
/// (object, strings, complex, datetime, structured, a non-native byte order).
pub fn of_descr(d: &Bound<'_, PyArrayDescr>) -> Option<DType> {
    if d.is_native_byteorder() == Some(false) || d.has_fields() || d.has_subarray() {
        return None;
    }
    Some(match (d.kind(), d.itemsize()) {
        (b'b', 1) => DType::Bool,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'u', 1) => DType::U8,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'f', 2) => DType::F16,
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        _ => return None,
    })
}

/// The dtype of a numpy dtype ([`of_descr`]); a `TypeError` that says what to do otherwise.
pub fn from_descr(d: &Bound<'_, PyArrayDescr>) -> PyResult<DType> {
    if let Some(dt) = of_descr(d) {
        return Ok(dt);
    }
    if d.is_native_byteorder() == Some(false) {
        return Err(PyTypeError::new_err(
            "non-native byte order: convert with arr.astype(arr.dtype.newbyteorder('='))",
        ));
    }
    Err(PyTypeError::new_err(format!(
        "dtype {} is not supported (bool, int8..64, uint8..64, float16/32/64)",
        d.str().map(|s| s.to_string()).unwrap_or_default()
    )))
}

/// The dtype from a Python object (a numpy dtype, a type such as `np.float32`, or a string).
pub fn from_py(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    if let Ok(d) = obj.cast::<PyArrayDescr>() {
        return from_descr(d);
    }
    // numpy's own converter (what `np.dtype(obj)` calls), without a Python-level call.
    from_descr(&PyArrayDescr::new(py, obj)?)
}

/// The raw parts of a C-contiguous numpy array: (dtype, shape, bytes).
///
/// # Safety
/// The returned slice borrows the array's memory: the caller keeps `arr` alive (and does not
/// let Python resize it) while the slice is used.
pub unsafe fn raw_parts<'a>(
    arr: &Bound<'_, PyUntypedArray>,
) -> PyResult<(DType, Vec<usize>, &'a [u8])> {
    if !arr.is_c_contiguous() {
        return Err(PyValueError::new_err("array is not C-contiguous"));
    }
    let dt = from_descr(&arr.dtype())?;
    let shape = arr.shape().to_vec();
    let n = arr.len() * dt.size();
    // SAFETY: a C-contiguous numpy array holds `len * itemsize` bytes at `data` (a dangling
    // but non-null pointer is never dereferenced for n == 0); the caller keeps it alive.
    let bytes = unsafe {
        let data = (*arr.as_array_ptr()).data as *const u8;
        if n == 0 || data.is_null() {
            &[][..]
        } else {
            std::slice::from_raw_parts(data, n)
        }
    };
    Ok((dt, shape, bytes))
}

/// A numpy array over `bytes` (row-major, `dt`, `shape`) whose base object is `owner`.
///
/// `bool` and misaligned data are copied (a byte other than 0/1 is not a valid bool, and numpy
/// must not see an unvalidated one); everything else is a view.
///
/// # Safety
/// `bytes` must stay valid and unmoved for as long as `owner` is alive, and be writable if
/// `writable`.
pub unsafe fn array_over<'py>(
    py: Python<'py>,
    dt: DType,
    shape: &[usize],
    bytes: &[u8],
    owner: Bound<'py, PyAny>,
    writable: bool,
) -> PyResult<Bound<'py, PyAny>> {
    macro_rules! view {
        ($t:ty) => {{
            let n = bytes.len() / std::mem::size_of::<$t>();
            let ptr = bytes.as_ptr();
            if n == 0 || (ptr as usize) % std::mem::align_of::<$t>() != 0 {
                let v: Vec<$t> = bytemuck::pod_collect_to_vec(bytes);
                let a = ndarray::ArrayD::from_shape_vec(IxDyn(shape), v)
                    .map_err(|e| PyValueError::new_err(e.to_string()))?;
                return Ok(read_only(
                    PyArray::from_owned_array(py, a).into_any(),
                    writable,
                ));
            }
            // SAFETY: `ptr` is aligned for the element type and points at `n` elements that
            // the caller keeps alive with `owner`; every bit pattern is a valid value.
            let v = unsafe { ArrayViewD::from_shape_ptr(IxDyn(shape), ptr as *const $t) };
            // SAFETY: `owner` keeps the memory alive and in place (caller's contract).
            let a: Bound<'py, PyArrayDyn<$t>> = unsafe { PyArray::borrow_from_array(&v, owner) };
            read_only(a.into_any(), writable)
        }};
    }
    Ok(match dt {
        DType::F32 => view!(f32),
        DType::F64 => view!(f64),
        DType::I8 => view!(i8),
        DType::I16 => view!(i16),
        DType::I32 => view!(i32),
        DType::I64 => view!(i64),
        DType::U8 => view!(u8),
        DType::U16 | DType::BF16 => view!(u16),
        DType::U32 => view!(u32),
        DType::U64 => view!(u64),
        DType::F16 => view!(f16),
        DType::Bool => {
            let v = bytes
                .iter()
                .map(|&b| match b {
                    0 => Ok(false),
                    1 => Ok(true),
                    x => Err(crate::exceptions::CorruptMessage::new_err(format!(
                        "byte {x} is not a bool"
                    ))),
                })
                .collect::<PyResult<Vec<bool>>>()?;
            let a = ndarray::ArrayD::from_shape_vec(IxDyn(shape), v)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            read_only(PyArray::from_owned_array(py, a).into_any(), writable)
        }
    })
}

/// Clears the writeable flag of a new array unless `writable`.
fn read_only(a: Bound<'_, PyAny>, writable: bool) -> Bound<'_, PyAny> {
    if !writable && let Ok(u) = a.cast::<PyUntypedArray>() {
        // SAFETY: clearing a flag of an array we just created, before anyone sees it.
        unsafe { (*u.as_array_ptr()).flags &= !npyffi::NPY_ARRAY_WRITEABLE };
    }
    a
}

/// numpy's descriptor of `dt` (bfloat16 shows as uint16: numpy has no bfloat16).
pub fn descr(py: Python<'_>, dt: DType) -> Bound<'_, PyArrayDescr> {
    match dt {
        DType::F32 => f32::get_dtype(py),
        DType::F64 => f64::get_dtype(py),
        DType::I8 => i8::get_dtype(py),
        DType::I16 => i16::get_dtype(py),
        DType::I32 => i32::get_dtype(py),
        DType::I64 => i64::get_dtype(py),
        DType::U8 => u8::get_dtype(py),
        DType::U16 | DType::BF16 => u16::get_dtype(py),
        DType::U32 => u32::get_dtype(py),
        DType::U64 => u64::get_dtype(py),
        DType::F16 => f16::get_dtype(py),
        DType::Bool => bool::get_dtype(py),
    }
}
