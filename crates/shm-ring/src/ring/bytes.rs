//! Bounds-checked views of bytes another process may write: [`ShmBytes`] to read,
//! [`ShmBytesMut`] to write. The layers above (the message codec, the channel) read and
//! write shared memory only through these, with no `unsafe` of their own.
//!
//! # Why they are sound against a hostile peer
//! Shared memory is treated as foreign bytes: a peer may write any byte at any time, so no
//! Rust reference to it is ever made for a value we act on. Every access is a raw copy of a
//! range that was checked against the view (whose own range was checked against the mapping
//! or a ring's slots when it was made): a peer writing meanwhile only changes the bytes we
//! copy, which the caller then validates as private data (read once, validate the copy, use
//! the copy). The one exception is [`ShmBytes::view`], the documented zero-copy array view:
//! a `&[u8]` whose values may change under the reader (any byte is a valid `u8`), never its
//! bounds.
//!
//! The views are made in the layers that own the memory: the segment ([`Segment::bytes`],
//! [`Segment::init_bytes`]), the ring's slots (`WriteChunkUninit::bytes_mut`,
//! `Consumer::slot_bytes`) and the pool's blocks (`PoolHome::block_mut`, `PoolRef::block`),
//! or over private memory ([`ShmBytes::private`], [`ShmBytesMut::private`]).
//!
//! [`Segment::bytes`]: crate::link::segment::Segment::bytes
//! [`Segment::init_bytes`]: crate::link::segment::Segment::init_bytes

use std::marker::PhantomData;

/// `len` readable bytes, valid for `'a`, that another process may write at any time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShmBytes<'a> {
    /// Valid for reads of `len` bytes for `'a` (the constructors' contract).
    ptr: *const u8,
    len: usize,
    _life: PhantomData<&'a [u8]>,
}

/// `len` writable bytes, valid for `'a`, that another process may also write (and read) at
/// any time.
#[derive(Debug)]
pub(crate) struct ShmBytesMut<'a> {
    /// Valid for writes of `len` bytes for `'a`, and no reference of this process points
    /// into them meanwhile (the constructors' contract).
    ptr: *mut u8,
    len: usize,
    _life: PhantomData<&'a mut [u8]>,
}

#[cold]
#[inline(never)]
#[track_caller]
fn out_of_range(at: usize, n: usize, len: usize) -> ! {
    panic!("shared-memory access of {n} bytes at {at}: outside a view of {len} bytes")
}

/// Whether `at..at + n` lies inside `0..len` (overflow-safe).
#[inline(always)]
fn inside(at: usize, n: usize, len: usize) -> bool {
    n <= len && at <= len - n
}

impl<'a> ShmBytes<'a> {
    /// A view of private bytes (the same code then reads private and shared memory).
    #[inline]
    pub(crate) fn private(bytes: &'a [u8]) -> Self {
        ShmBytes {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
            _life: PhantomData,
        }
    }

    /// A view of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `len` bytes for all of `'a` (mapped memory, which
    /// another process may write, or memory of ours that no `&mut` points into meanwhile).
    #[inline]
    pub(crate) unsafe fn from_raw_parts(ptr: *const u8, len: usize) -> Self {
        ShmBytes {
            ptr,
            len,
            _life: PhantomData,
        }
    }

    /// Number of bytes in the view.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The `n` bytes at `at`, if they lie inside this view.
    #[inline]
    pub(crate) fn sub(&self, at: usize, n: usize) -> Option<ShmBytes<'a>> {
        if !inside(at, n, self.len) {
            return None;
        }
        // SAFETY: `at + n <= len` (checked), so the range lies inside ours, which is readable
        // for 'a.
        Some(unsafe { ShmBytes::from_raw_parts(self.ptr.add(at), n) })
    }

    /// Copies the bytes at `at..at + dst.len()` into `dst`: a private copy to validate.
    ///
    /// # Panics
    /// If the range does not lie inside the view (a bug of the caller, which computes ranges
    /// from the view's length, never from what it read).
    #[inline]
    #[track_caller]
    pub(crate) fn copy_to(&self, at: usize, dst: &mut [u8]) {
        if !inside(at, dst.len(), self.len) {
            out_of_range(at, dst.len(), self.len);
        }
        // SAFETY: the source range lies inside the view (checked), readable for 'a; `dst` is
        // a `&mut` of ours, so no view overlaps it. A peer writing the source meanwhile only
        // changes the bytes we copy (any byte is a valid u8), which the caller validates.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(at), dst.as_mut_ptr(), dst.len()) };
    }

    /// A private, 8-aligned copy of the whole view: `len.div_ceil(8)` words, the bytes past
    /// `len` in the last word zero. Not zero-filled first (the copy writes every byte).
    pub(crate) fn to_words(self) -> Vec<u64> {
        let words = self.len.div_ceil(8);
        let mut out: Vec<u64> = Vec::with_capacity(words);
        // SAFETY: the destination has room for `words * 8 >= len` bytes and is ours; the
        // source is the whole view (readable for 'a). The last word is zeroed before the copy
        // overwrites its first bytes, so all `words` words are initialised (any bit pattern
        // is a valid u64) before `set_len`. A peer writing the source meanwhile only changes
        // the bytes we copy, which the caller validates as private data.
        unsafe {
            if words > 0 {
                out.as_mut_ptr().add(words - 1).write(0);
            }
            std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr().cast::<u8>(), self.len);
            out.set_len(words);
        }
        out
    }

    /// The zero-copy view of the `n` bytes at `at`, if they lie inside this view: a reference
    /// into memory a peer may write while it is read. Only for array data whose bounds were
    /// validated on a private copy: the values may change under the reader, the bounds
    /// cannot.
    #[inline]
    pub(crate) fn view(&self, at: usize, n: usize) -> Option<&'a [u8]> {
        if !inside(at, n, self.len) {
            return None;
        }
        // SAFETY: `at + n <= len` (checked): inside the view, readable for 'a. Any byte is a
        // valid u8, so a peer changing the values under the reference breaks no validity
        // invariant of the slice; its bounds are ours. This is the one place the crate makes
        // a reference into peer-writable memory (documented on `MessageView` and `ArrayInfo`).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(at), n) })
    }
}

impl<'a> ShmBytesMut<'a> {
    /// A view of private bytes (the encoder then writes private and shared memory alike).
    #[inline]
    pub(crate) fn private(bytes: &'a mut [u8]) -> Self {
        ShmBytesMut {
            ptr: bytes.as_mut_ptr(),
            len: bytes.len(),
            _life: PhantomData,
        }
    }

    /// A writable view of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes for all of `'a`, and no reference of
    /// this process may point into them meanwhile (another process may write them: that only
    /// spoils what it reads itself).
    #[inline]
    pub(crate) unsafe fn from_raw_parts(ptr: *mut u8, len: usize) -> Self {
        ShmBytesMut {
            ptr,
            len,
            _life: PhantomData,
        }
    }

    /// Number of bytes in the view.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The `n` bytes at `at`, if they lie inside this view.
    #[inline]
    pub(crate) fn into_sub(self, at: usize, n: usize) -> Option<ShmBytesMut<'a>> {
        if !inside(at, n, self.len) {
            return None;
        }
        // SAFETY: `at + n <= len` (checked): inside our range, which we give up (by value).
        Some(unsafe { ShmBytesMut::from_raw_parts(self.ptr.add(at), n) })
    }

    /// Copies `src` to `at..at + src.len()`.
    ///
    /// # Panics
    /// If the range does not lie inside the view.
    #[inline]
    #[track_caller]
    pub(crate) fn write_from(&mut self, at: usize, src: &[u8]) {
        if !inside(at, src.len(), self.len) {
            out_of_range(at, src.len(), self.len);
        }
        // SAFETY: the range lies inside the view (checked), writable for 'a with no reference
        // of ours into it; `src` is a shared reference, so it cannot overlap (nothing of ours
        // points into the view).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(at), src.len()) };
    }

    /// Writes `n` zero bytes at `at`.
    ///
    /// # Panics
    /// If the range does not lie inside the view.
    #[inline]
    #[track_caller]
    pub(crate) fn zero(&mut self, at: usize, n: usize) {
        if !inside(at, n, self.len) {
            out_of_range(at, n, self.len);
        }
        // SAFETY: inside the view (checked), writable for 'a.
        unsafe { std::ptr::write_bytes(self.ptr.add(at), 0, n) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_outside_a_view_are_refused() {
        let bytes = [1u8, 2, 3, 4, 5];
        let v = ShmBytes::private(&bytes);
        assert_eq!(v.sub(1, 3).map(|s| s.len()), Some(3));
        assert!(v.sub(3, 3).is_none());
        assert!(v.sub(usize::MAX, 2).is_none());
        assert!(v.view(5, 0).is_some());
        assert!(v.view(2, usize::MAX).is_none());
        assert_eq!(v.view(1, 2), Some(&bytes[1..3]));
        let mut buf = [0u8; 5];
        let mut w = ShmBytesMut::private(&mut buf);
        w.write_from(3, &[9, 9]);
        w.zero(0, 1);
        assert!(w.into_sub(4, 2).is_none());
        assert_eq!(buf, [0, 0, 0, 9, 9]);
    }

    #[test]
    #[should_panic(expected = "outside a view of 4 bytes")]
    fn a_write_past_the_end_panics() {
        let mut buf = [0u8; 4];
        ShmBytesMut::private(&mut buf).write_from(2, &[1, 2, 3]);
    }

    #[test]
    fn to_words_copies_and_zero_pads() {
        let bytes: Vec<u8> = (1..=11).collect();
        let w = ShmBytes::private(&bytes).to_words();
        assert_eq!(w.len(), 2);
        assert_eq!(&bytemuck::cast_slice::<u64, u8>(&w)[..11], &bytes[..]);
        assert_eq!(&bytemuck::cast_slice::<u64, u8>(&w)[11..], &[0; 5]);
        assert!(ShmBytes::private(&[]).to_words().is_empty());
    }
}
