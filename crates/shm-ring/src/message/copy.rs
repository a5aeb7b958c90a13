//! Copying a body out of shared memory for an in-place read (each header byte read once).

use super::decode::{rd_u32, rd_u64};
use super::*;

/// Bodies up to this size are copied whole for an in-place read; larger ones get their
/// headers copied and their inline array data read in place.
const COPY_WHOLE: usize = 4096;

/// Copies a message body of `len` bytes at `src` (memory another process may write) into
/// `dst` for parsing: every header, name, string and shape byte is copied, each read once;
/// the data of large inline arrays is not (it is read in place, through [`DataRef`]). If the
/// source is inconsistent, the walk stops and the parser reports what it finds in `dst`
/// (private bytes either way).
///
/// # Safety
/// `src` must be valid for reads of `len` bytes; `dst.len() == len`.
#[inline]
pub(crate) unsafe fn copy_for_parse(src: *const u8, len: usize, dst: &mut [u8]) {
    debug_assert_eq!(dst.len(), len);
    let cp = |dst: &mut [u8], from: usize, to: usize| {
        let to = to.min(len);
        if from < to {
            // SAFETY: from < to <= len: inside both buffers (caller's contract).
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(from), dst.as_mut_ptr().add(from), to - from)
            };
        }
    };
    if len <= COPY_WHOLE {
        cp(dst, 0, len);
        return;
    }
    // SAFETY: forwarded contract.
    unsafe { copy_headers(src, len, dst) }
}

/// The large-body half of [`copy_for_parse`].
///
/// # Safety
/// As [`copy_for_parse`].
#[inline(never)]
unsafe fn copy_headers(src: *const u8, len: usize, dst: &mut [u8]) {
    let cp = |dst: &mut [u8], from: usize, to: usize| {
        let to = to.min(len);
        if from < to {
            // SAFETY: from < to <= len: inside both buffers (caller's contract).
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(from), dst.as_mut_ptr().add(from), to - from)
            };
        }
    };
    cp(dst, 0, BODY_HEADER);
    let n_records = rd_u32(dst, 8);
    let end = (rd_u32(dst, 12) as usize).min(len);
    let mut p = BODY_HEADER;
    for _ in 0..n_records {
        if p + RECORD_HEADER > end {
            break;
        }
        cp(dst, p, p + RECORD_HEADER);
        let rlen = rd_u32(dst, p) as usize;
        let n_fields = rd_u32(dst, p + 4);
        if rlen < RECORD_HEADER {
            break;
        }
        let rend = p.saturating_add(rlen).min(end);
        let mut q = p + RECORD_HEADER;
        for _ in 0..n_fields {
            if q + FIELD_HEADER > rend {
                break;
            }
            cp(dst, q, q + FIELD_HEADER);
            let (kind, name_len, ndim, loc) =
                (dst[q], dst[q + 1] as usize, dst[q + 2] as usize, dst[q + 4]);
            let b = rd_u64(dst, q + 16);
            let shape = if kind == KIND_ARRAY { 8 * ndim } else { 0 };
            let str_len = if kind == KIND_STR {
                b.min(65536) as usize
            } else {
                0
            };
            let head_end = (q + FIELD_HEADER + shape + pad8(name_len + str_len)).min(rend);
            cp(dst, q + FIELD_HEADER, head_end);
            q = head_end;
            if kind == KIND_ARRAY && loc == LOC_INLINE {
                let data = pad8(b.min(rend as u64) as usize);
                // The data itself is read in place (`DataRef`), never from the copy.
                q = q.saturating_add(data).min(rend);
            }
        }
        p = rend;
    }
}

/// Runs the consumer's in-place read path over `body` (as if it lay in shared memory): the
/// header copy, the parse, full validation and every accessor. Returns the number of fields
/// read. For fuzzing the decoder; not a stable API.
///
/// # Errors
/// [`Error::Corrupt`] (or a lookup error) on an invalid encoding.
#[cfg(feature = "unstable-internals")]
pub fn read_in_place(body: &[u8]) -> Result<usize, Error> {
    let mut scratch = vec![0u64; body.len().div_ceil(8)];
    let copy = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut scratch)[..body.len()];
    // SAFETY: `body` is valid for its length; `copy` has the same length.
    unsafe { copy_for_parse(body.as_ptr(), body.len(), copy) };
    let copy: &[u8] = copy;
    let v = MessageView::parse_with(copy, DataRef::private(body), PoolRef::empty())?;
    let mut n = 0;
    for r in v.records() {
        let r = r?;
        for f in r.fields() {
            let f = f?;
            n += 1;
            match &f {
                FieldRef::Array(a) => {
                    let _ = r.array_info(a.name)?;
                    if a.dtype == DType::Bool {
                        let _ = r.array_bool(a.name);
                    } else {
                        let _ = r.array_bytes(a.name)?;
                    }
                }
                FieldRef::Meta(name, _) => {
                    let _ = r.meta(name);
                }
            }
        }
    }
    v.validate_all(|_, _| {})?;
    Ok(n)
}
