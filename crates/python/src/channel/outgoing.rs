//! What `Sender.send` and `Sender.loan` take apart: loans of any element type, the arrays of
//! a message before it is built, and the builders (borrowing, so a retry costs nothing).

use std::time::Duration;

use half::f16;
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods, npyffi};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use shm_ring::{ArrayLoan, DType, MessageBuilder, MetaValue};

use super::{Loan, lock};

macro_rules! any_loan {
    ($($v:ident $t:ty),*) => {
        /// A loan of any element type.
        #[derive(Debug)]
        pub(super) enum AnyLoan { $($v(ArrayLoan<$t>)),* }
        impl AnyLoan {
            pub(super) fn new(tx: &mut shm_ring::Sender, dt: DType, shape: &[usize], t: Duration)
                -> Result<(AnyLoan, *mut u8, usize), shm_ring::Error> {
                match dt {
                    $(DType::$v => {
                        let l = tx.loan_timeout::<$t>(shape, t)?;
                        // SAFETY: pool blocks are shared memory, never truly uninitialised
                        // (zero at creation, or an earlier message); every bit pattern is a
                        // valid `$t`. Python sees the block like `np.empty`'s memory.
                        let mut l = unsafe { l.assume_init() };
                        let s = l.as_mut_slice();
                        let (p, n) = (s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s));
                        Ok((AnyLoan::$v(l), p, n))
                    })*
                    other => Err(shm_ring::Error::InvalidArgument(format!(
                        "cannot loan {other} arrays (send bool arrays with send())"))),
                }
            }
            pub(super) fn add<'a>(self, b: MessageBuilder<'a>, name: String) -> MessageBuilder<'a> {
                match self { $(AnyLoan::$v(l) => b.array_loan(name, l)),* }
            }
        }
    };
}
any_loan!(F32 f32, F64 f64, I8 i8, I16 i16, I32 i32, I64 i64, U8 u8, U16 u16, U32 u32, U64 u64, F16 f16);

/// One array to send: a view of numpy memory, or a loan to hand over.
#[derive(Debug)]
pub(super) enum Part {
    Raw {
        dt: DType,
        shape: Vec<usize>,
        bytes: &'static [u8],
    },
    Loan(AnyLoan),
}

pub(super) fn meta_value(v: &Bound<'_, PyAny>) -> PyResult<MetaValue<'static>> {
    if v.is_instance_of::<pyo3::types::PyBool>() || v.is_instance_of::<pyo3::types::PyInt>() {
        Ok(MetaValue::I64(v.extract()?))
    } else if v.is_instance_of::<pyo3::types::PyFloat>() {
        Ok(MetaValue::F64(v.extract()?))
    } else if let Ok(s) = v.extract::<String>() {
        Ok(MetaValue::Str(s.into()))
    } else {
        Err(PyTypeError::new_err(format!(
            "metadata values are int, float or str, not {}",
            v.get_type().name()?
        )))
    }
}

/// numpy, imported once (only conversions of non-array values need it).
pub(super) fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NP: pyo3::sync::PyOnceLock<Py<PyModule>> = pyo3::sync::PyOnceLock::new();
    NP.get_or_try_init(py, || py.import("numpy").map(Bound::unbind))
        .map(|m| m.bind(py))
}

/// If `arr` is a whole array returned by `Sender.loan`, takes its loan out (the block now
/// belongs to the message) and makes the array read-only.
pub(super) fn take_loan(arr: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<AnyLoan>> {
    let Ok(a) = arr.cast::<PyUntypedArray>() else {
        return Ok(None);
    };
    // SAFETY: reading the base pointer of a live array; a non-null base is a live object the
    // array holds a reference to, borrowed here while `arr` lives.
    let base = unsafe {
        let p = (*a.as_array_ptr()).base;
        if p.is_null() {
            return Ok(None);
        }
        Bound::from_borrowed_ptr(arr.py(), p)
    };
    let Ok(loan) = base.cast::<Loan>() else {
        return Ok(None);
    };
    // SAFETY: reading the data pointer of a live array.
    let data = unsafe { (*a.as_array_ptr()).data } as usize;
    let l = loan.get();
    if data != l.ptr || !a.is_c_contiguous() || a.len() * a.dtype().itemsize() != l.nbytes {
        return Ok(None);
    }
    let taken = lock(&l.inner).take().ok_or_else(|| {
        PyRuntimeError::new_err(format!("the loaned array {name:?} was already sent"))
    })?;
    // The block now belongs to the message: no more writes through this array.
    // SAFETY: clearing a flag of a live array we hold.
    unsafe { (*a.as_array_ptr()).flags &= !npyffi::NPY_ARRAY_WRITEABLE };
    Ok(Some(taken))
}

/// A metadata value borrowing `v`'s string.
fn borrow_meta<'a>(v: &'a MetaValue<'_>) -> MetaValue<'a> {
    match v {
        MetaValue::I64(x) => MetaValue::I64(*x),
        MetaValue::F64(x) => MetaValue::F64(*x),
        MetaValue::Str(s) => MetaValue::Str(std::borrow::Cow::Borrowed(s.as_ref())),
    }
}

/// The message of copied arrays, borrowing names, shapes and bytes (loans are skipped).
pub(super) fn build_borrowed<'a>(
    parts: &'a [(String, Part)],
    metas: &'a [(String, MetaValue<'static>)],
) -> Result<MessageBuilder<'a>, shm_ring::Error> {
    let mut b = MessageBuilder::new();
    for (n, v) in metas {
        b = b.meta(n.as_str(), borrow_meta(v));
    }
    for (n, p) in parts {
        if let Part::Raw { dt, shape, bytes } = p {
            b = b.array_raw(n.as_str(), *dt, shape, bytes)?;
        }
    }
    Ok(b)
}

/// The message of `parts`, loans handed over.
pub(super) fn build_owned<'a>(
    parts: Vec<(String, Part)>,
    metas: &'a [(String, MetaValue<'static>)],
) -> Result<MessageBuilder<'a>, shm_ring::Error> {
    let mut b = MessageBuilder::new();
    for (n, v) in metas {
        b = b.meta(n.as_str(), borrow_meta(v));
    }
    for (n, p) in parts {
        b = match p {
            Part::Raw { dt, shape, bytes } => b.array_raw(n, dt, &shape, bytes)?,
            Part::Loan(l) => l.add(b, n),
        };
    }
    Ok(b)
}
