//! Copying a body out of shared memory for an in-place read (each header byte read once).

use super::decode::{rd_u32, rd_u64};
use super::*;
#[cfg(feature = "unstable-internals")]
use crate::error::Error;
use crate::ring::bytes::ShmBytes;

/// Bodies up to this size are copied whole for an in-place read; larger ones get their
/// headers copied and their inline array data read in place.
const COPY_WHOLE: usize = 4096;

/// Copies a message body (`src`, memory another process may write) into `dst` for parsing:
/// every header, name, string and shape byte is copied, each read once; the data of large
/// inline arrays is not (it is read in place, through `src`'s zero-copy view). If the source
/// is inconsistent, the walk stops and the parser reports what it finds in `dst` (private
/// bytes either way).
///
/// # Panics
/// If `dst` is not as long as `src`.
#[inline]
pub(crate) fn copy_for_parse(src: ShmBytes<'_>, dst: &mut [u8]) {
    assert_eq!(dst.len(), src.len(), "a body copy is as long as the body");
    if src.len() <= COPY_WHOLE {
        src.copy_to(0, dst);
        return;
    }
    copy_headers(src, dst)
}

/// The large-body half of [`copy_for_parse`].
#[inline(never)]
fn copy_headers(src: ShmBytes<'_>, dst: &mut [u8]) {
    let len = src.len();
    // Copies bytes `from..to` of the body (clipped to it) to the same place in `dst`.
    let cp = |dst: &mut [u8], from: usize, to: usize| {
        let to = to.min(len);
        if from < to {
            src.copy_to(from, &mut dst[from..to]);
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
                // The data itself is read in place (the zero-copy view), never from the copy.
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
    copy_for_parse(ShmBytes::private(body), copy);
    let copy: &[u8] = copy;
    let v = MessageView::parse_with(copy, ShmBytes::private(body), PoolRef::empty())?;
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
