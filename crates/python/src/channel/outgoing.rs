//! What `Sender.send` takes apart: the arrays and metadata of a message before it is built,
//! and whether the message may be read without the GIL.
//!
//! A numpy array's memory belongs to numpy: another Python thread may resize it (`resize(...,
//! refcheck=False)`), replace it (`__setstate__`) or free it whenever the GIL is released. So
//! a message that borrows numpy memory ([`Part::Borrowed`]) is only ever sent with the GIL
//! held; one that must wait owns its bytes first ([`Outgoing::own`], or a loan filled by the
//! sender), re-reading each array with the GIL held.

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use shm_ring::{DType, MessageBuilder, MetaValue};

use super::loan::{self, AnyLoan};
use crate::dtype;

/// One array of a message.
#[derive(Debug)]
pub(super) enum Part {
    /// The bytes of `keep[arr]`, a C-contiguous numpy array: read only with the GIL held.
    Borrowed {
        dt: DType,
        shape: Vec<usize>,
        bytes: &'static [u8],
        arr: usize,
    },
    /// A private copy.
    Owned {
        dt: DType,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    },
    /// A loan to hand over (`None` once built into a message, or before it is taken).
    Loan(Option<AnyLoan>),
}

/// A message being sent: its arrays (and the numpy objects they borrow from) and metadata.
#[derive(Debug)]
pub(super) struct Outgoing<'py> {
    /// Every numpy array a part borrows from (or whose loan it takes), kept alive.
    keep: Vec<Bound<'py, PyAny>>,
    pub parts: Vec<(String, Part)>,
    metas: Vec<(String, MetaValue<'static>)>,
}

impl<'py> Outgoing<'py> {
    /// Takes `arrays` (name -> array-like) and `meta` (name -> int/float/str) apart. Loaned
    /// arrays handed back whole are taken over (and made read-only) only once every value
    /// was accepted, so a refused message leaves its loans with the caller.
    pub fn collect(
        arrays: &Bound<'py, PyDict>,
        meta: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Outgoing<'py>> {
        let py = arrays.py();
        let mut out = Outgoing {
            keep: Vec::with_capacity(arrays.len()),
            parts: Vec::with_capacity(arrays.len()),
            metas: Vec::new(),
        };
        // (part, kept array) of every loaned array, taken over at the end.
        let mut loans: Vec<(usize, usize)> = Vec::new();
        for (k, v) in arrays.iter() {
            let name: String = k.extract()?;
            let arr = if v.cast::<PyUntypedArray>().is_ok() {
                v
            } else {
                numpy(py)?.call_method1("asarray", (v,))?
            };
            if loan::is_whole(&arr) {
                loans.push((out.parts.len(), out.keep.len()));
                out.parts.push((name, Part::Loan(None)));
                out.keep.push(arr);
                continue;
            }
            let arr = match arr.cast::<PyUntypedArray>() {
                Ok(a) if a.is_c_contiguous() => arr,
                _ => numpy(py)?.call_method1("ascontiguousarray", (&arr,))?,
            };
            let (dt, shape, bytes) = borrow(&arr)?;
            let at = out.keep.len();
            out.keep.push(arr);
            out.parts.push((
                name,
                Part::Borrowed {
                    dt,
                    shape,
                    bytes,
                    arr: at,
                },
            ));
        }
        if let Some(m) = meta {
            for (k, v) in m.iter() {
                out.metas.push((k.extract::<String>()?, meta_value(&v)?));
            }
        }
        // Every value is fine: take the loans over.
        for (i, k) in loans {
            let (name, part) = &mut out.parts[i];
            *part = Part::Loan(loan::take(&out.keep[k], name)?);
        }
        Ok(out)
    }

    /// Whether a part borrows numpy memory.
    pub fn borrows(&self) -> bool {
        self.parts
            .iter()
            .any(|(_, p)| matches!(p, Part::Borrowed { .. }))
    }

    /// Whether a part is a loan.
    pub fn has_loans(&self) -> bool {
        self.parts.iter().any(|(_, p)| matches!(p, Part::Loan(_)))
    }

    /// The array that borrowed part `i` reads from.
    pub fn array_of(&self, i: usize) -> Option<&Bound<'py, PyAny>> {
        match &self.parts[i].1 {
            Part::Borrowed { arr, .. } => Some(&self.keep[*arr]),
            _ => None,
        }
    }

    /// Copies every borrowed array, re-read now (the GIL is held; it may have been released
    /// since `collect`, and the array changed meanwhile): the message no longer points into
    /// numpy memory.
    pub fn own(&mut self) -> PyResult<()> {
        for i in 0..self.parts.len() {
            if let Some(arr) = self.array_of(i) {
                let (dt, shape, bytes) = borrow(arr)?;
                let bytes = bytes.to_vec();
                self.parts[i].1 = Part::Owned { dt, shape, bytes };
            }
        }
        Ok(())
    }

    /// The message: names, shapes and bytes borrowed from `self`, loans taken out.
    pub fn build(&mut self) -> Result<MessageBuilder<'_>, shm_ring::Error> {
        let mut b = MessageBuilder::new();
        for (n, v) in &self.metas {
            b = b.meta(n.as_str(), borrow_meta(v));
        }
        for (n, p) in self.parts.iter_mut() {
            let n: &str = n;
            b = match p {
                Part::Borrowed {
                    dt, shape, bytes, ..
                } => b.array_raw(n, *dt, shape, bytes)?,
                Part::Owned { dt, shape, bytes } => b.array_raw(n, *dt, shape, bytes)?,
                Part::Loan(l) => match l.take() {
                    Some(l) => l.add(b, n),
                    None => b,
                },
            };
        }
        Ok(b)
    }
}

/// The dtype, shape and bytes of a C-contiguous numpy array, the bytes borrowed with a
/// `'static` lifetime that never escapes an [`Outgoing`] (which keeps the array alive).
fn borrow(arr: &Bound<'_, PyAny>) -> PyResult<(DType, Vec<usize>, &'static [u8])> {
    let a = arr.cast::<PyUntypedArray>()?;
    // SAFETY: the caller keeps `arr` alive (in `Outgoing::keep`) while the slice is used, and
    // reads it only with the GIL held (see the module doc).
    let (dt, shape, bytes) = unsafe { dtype::raw_parts(a)? };
    // SAFETY: as above: the 'static lifetime never escapes the `Outgoing` that keeps `arr`.
    let bytes = unsafe { std::mem::transmute::<&[u8], &'static [u8]>(bytes) };
    Ok((dt, shape, bytes))
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

/// A metadata value borrowing `v`'s string.
pub(super) fn borrow_meta<'a>(v: &'a MetaValue<'_>) -> MetaValue<'a> {
    match v {
        MetaValue::I64(x) => MetaValue::I64(*x),
        MetaValue::F64(x) => MetaValue::F64(*x),
        MetaValue::Str(s) => MetaValue::Str(std::borrow::Cow::Borrowed(s.as_ref())),
    }
}
