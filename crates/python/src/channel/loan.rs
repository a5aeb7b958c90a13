//! `Sender.loan`'s arrays: a pool block as a writable numpy array, and how `send` takes it
//! back.
//!
//! Arrays below the channel's threshold (`threshold=`, 1 KiB by default) are not loans at all:
//! `Sender.loan` gives an ordinary zeroed numpy array, which `send` copies into the message as
//! it copies any small array (a pool block's round trip, loan, the consumer's release and the
//! return, costs more than copying them). Larger ones are pool blocks, written in place and
//! read by the consumer where they lie.
//!
//! The array's base object is a [`Loan`]. numpy collapses base chains, so every view of the
//! array (slices, reshapes, `np.asarray`), and everything that holds one (a `memoryview`, a
//! DLPack capsule, a torch tensor), keeps that object alive. It holds a [`BlockPin`]: while
//! any view lives, the block stays mapped and is never handed out again, not after `send`,
//! not after the consumer released it, not after `Sender.close()`. So no view of a sent loan
//! ever shows a later loan's data, and none reads unmapped memory.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use half::f16;
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods, npyffi};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use shm_ring::{ArrayLoan, BlockPin, DType, MessageBuilder};

use super::{lock, view};
use crate::dtype;

macro_rules! any_loan {
    ($($v:ident $t:ty),*) => {
        /// A loan of any element type (`Bool` is a byte loan that travels as bool).
        #[derive(Debug)]
        pub(super) enum AnyLoan { $($v(ArrayLoan<$t>),)* Bool(ArrayLoan<u8>) }
        impl AnyLoan {
            /// A loan of `shape` x `dt` from `tx`, waiting up to `t` for a block.
            pub(super) fn new(tx: &mut shm_ring::Sender, dt: DType, shape: &[usize], t: Duration)
                -> Result<AnyLoan, shm_ring::Error> {
                match dt {
                    $(DType::$v => {
                        let l = tx.loan_timeout::<$t>(shape, t)?;
                        // SAFETY: pool blocks are shared memory, never truly uninitialised
                        // (zero at creation, or an earlier message); every bit pattern is a
                        // valid `$t`. Python sees the block like `np.empty`'s memory.
                        Ok(AnyLoan::$v(unsafe { l.assume_init() }))
                    })*
                    DType::Bool => {
                        // Bytes other than 0/1 are not bools: start from all False.
                        Ok(AnyLoan::Bool(tx.loan_timeout::<u8>(shape, t)?.fill(0)))
                    }
                    other => Err(shm_ring::Error::InvalidArgument(format!(
                        "cannot loan {other} arrays (send them with send())"))),
                }
            }
            /// The block: its start and length in bytes.
            fn bytes(&mut self) -> (*mut u8, usize) {
                match self {
                    $(AnyLoan::$v(l) => {
                        let s = l.as_mut_slice();
                        (s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s))
                    })*
                    AnyLoan::Bool(l) => {
                        let s = l.as_mut_slice();
                        (s.as_mut_ptr(), s.len())
                    }
                }
            }
            /// Copies `arr` (as it is now: call with the GIL held) into the loan if it still
            /// has the loan's dtype and shape; false (nothing copied) if it changed.
            pub(super) fn fill_from(&mut self, arr: &Bound<'_, PyAny>, dt: DType, shape: &[usize])
                -> PyResult<bool> {
                let a = arr.cast::<PyUntypedArray>()?;
                // SAFETY: `arr` lives for this call, and the GIL is held while we read it.
                let (now_dt, now_shape, src) = unsafe { dtype::raw_parts(a)? };
                let (dst, len) = self.bytes();
                if now_dt != dt || now_shape != shape || src.len() != len {
                    return Ok(false);
                }
                // SAFETY: `dst` is this loan's block, `len` bytes, ours alone until sent (the
                // consumer's process may scribble on it: shared memory, written through a
                // pointer only); `src` is numpy's private memory: they cannot overlap.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, len) };
                Ok(true)
            }
            fn pin(&self) -> Option<BlockPin> {
                match self { $(AnyLoan::$v(l) => l.pin(),)* AnyLoan::Bool(l) => l.pin() }
            }
            pub(super) fn add<'a>(self, b: MessageBuilder<'a>, name: &'a str) -> MessageBuilder<'a> {
                match self {
                    $(AnyLoan::$v(l) => b.array_loan(name, l),)*
                    AnyLoan::Bool(l) => b.array_loan_bool(name, l),
                }
            }
        }
    };
}
any_loan!(F32 f32, F64 f64, I8 i8, I16 i16, I32 i32, I64 i64, U8 u8, U16 u16, U32 u32, U64 u64, F16 f16);

/// A pool block loaned to Python code: the base object of the array `Sender.loan` returns
/// (see the module doc).
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen, weakref)]
pub struct Loan {
    /// The loan, until `send` takes it.
    inner: Mutex<Option<AnyLoan>>,
    /// Keeps the block mapped and out of the pool while this object (any view) lives.
    _pin: BlockPin,
    /// Start of the block (the array's data pointer) and the array's length in bytes.
    ptr: usize,
    nbytes: usize,
    /// Live `Loan` objects of the sender (each holds one block).
    live: Arc<AtomicUsize>,
}

impl Drop for Loan {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Loan {
    /// The numpy array (`shape` x `dt`, writable) over `loan`'s block.
    pub(super) fn into_array<'py>(
        py: Python<'py>,
        mut loan: AnyLoan,
        dt: DType,
        shape: &[usize],
        live: &Arc<AtomicUsize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (ptr, nbytes) = loan.bytes();
        // Python channels have no large size class (`large_pool` 0): every loan is a block.
        let pin = loan
            .pin()
            .ok_or_else(|| PyRuntimeError::new_err("a loan outside the pool's blocks"))?;
        live.fetch_add(1, Ordering::Relaxed);
        let owner = Bound::new(
            py,
            Loan {
                inner: Mutex::new(Some(loan)),
                _pin: pin,
                ptr: ptr as usize,
                nbytes,
                live: Arc::clone(live),
            },
        )?;
        // SAFETY: `owner` (the array's base) holds a pin of the block: it stays mapped, and
        // no other loan or message of this process gets it, while any view lives. The block
        // is this loan's alone until sent, so writable; after that the array is read-only
        // (`take`). Every byte pattern is a valid value (a bool loan was zeroed). The
        // consumer's process maps the pool too: it may change the values, never the bounds.
        unsafe { view::view(py, dt, shape, ptr, owner.into_any(), true) }
    }
}

/// The `Loan` behind `arr` if `arr` is a whole array returned by `Sender.loan` (its data
/// pointer, C order, every byte of the block's array), else `None`.
fn whole<'py>(arr: &Bound<'py, PyAny>) -> Option<Bound<'py, Loan>> {
    let a = arr.cast::<PyUntypedArray>().ok()?;
    // SAFETY: reading the base pointer of a live array; a non-null base is a live object the
    // array holds a reference to, borrowed here while `arr` lives.
    let base = unsafe {
        let p = (*a.as_array_ptr()).base;
        if p.is_null() {
            return None;
        }
        Bound::from_borrowed_ptr(arr.py(), p)
    };
    let loan = base.cast_into::<Loan>().ok()?;
    // SAFETY: reading the data pointer of a live array.
    let data = unsafe { (*a.as_array_ptr()).data } as usize;
    let l = loan.get();
    (data == l.ptr && a.is_c_contiguous() && a.len() * a.dtype().itemsize() == l.nbytes)
        .then_some(loan)
}

/// Whether `arr` is a whole array returned by `Sender.loan` (sent or not).
pub(super) fn is_whole(arr: &Bound<'_, PyAny>) -> bool {
    whole(arr).is_some()
}

/// Takes the loan out of `arr`, a whole array returned by `Sender.loan` (the block now
/// belongs to the message), and makes the array read-only. `None` if `arr` is no such array.
pub(super) fn take(arr: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<AnyLoan>> {
    let Some(loan) = whole(arr) else {
        return Ok(None);
    };
    let taken = lock(&loan.get().inner).take().ok_or_else(|| {
        PyRuntimeError::new_err(format!("the loaned array {name:?} was already sent"))
    })?;
    if let Ok(a) = arr.cast::<PyUntypedArray>() {
        // The block now belongs to the message: no more writes through this array (views
        // made from it from now on are read-only too; see the package docs for earlier ones).
        // SAFETY: clearing a flag of a live array we hold.
        unsafe { (*a.as_array_ptr()).flags &= !npyffi::NPY_ARRAY_WRITEABLE };
    }
    Ok(Some(taken))
}
