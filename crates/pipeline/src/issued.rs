//! How many records each emitter has issued, as the consumer can read it: the bound of the
//! ordered mode's reorder buffer (issue 16: a hostile worker could grow that buffer without
//! bound with indices far ahead of anything issued).
//!
//! One counter per emitter, each on its own cache line, in a small memfd sealed against
//! shrinking and growing that the parent creates and maps. In enqueue mode the parent's own
//! input thread is emitter 0 and the only writer. With a source, the parent hands the memfd to
//! its emitters only (never to a worker: in the `SHARED` message, see [`crate::handover`]);
//! emitter `e` raises counter `e` before it sends record `k`. A worker can forge any index,
//! but it cannot raise a counter, so the consumer refuses an output of a record that was never
//! issued as a corrupt worker's.
//!
//! ```text
//! offset  e * 64        counter of emitter e: records issued, u64, raised with Release
//! size    pages holding 64 * emitters bytes
//! ```

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Bytes per counter (one cache line, so emitters never share a line).
const STRIDE: usize = 64;
/// The memfd's seals: fixed size for good. Not `F_SEAL_WRITE`: emitters write it.
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// The counters of `emitters` emitters, mapped shared.
#[derive(Debug)]
pub(crate) struct Issued {
    /// The mapping: `len` bytes, page-aligned, `STRIDE`-strided `AtomicU64` counters.
    ptr: NonNull<u8>,
    len: usize,
    emitters: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is only accessed through `AtomicU64`s (any thread, any process), and it
// lives until `Drop`, which needs `&mut self`.
unsafe impl Send for Issued {}
// SAFETY: as for `Send`: shared access is atomic loads and stores only.
unsafe impl Sync for Issued {}

fn size_for(emitters: usize) -> usize {
    (emitters.max(1) * STRIDE).div_ceil(4096) * 4096
}

impl Issued {
    /// New counters (all zero) for `emitters` emitters, in a new sealed memfd.
    pub(crate) fn create(emitters: usize) -> Result<Issued, String> {
        let len = size_for(emitters);
        let fd = rustix::fs::memfd_create(
            "shmpipe-issued",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| format!("memfd_create: {e}"))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(|e| format!("ftruncate: {e}"))?;
        rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, len as u64)
            .map_err(|e| format!("reserving {len} bytes: {e}"))?;
        rustix::fs::fcntl_add_seals(&fd, SEALS).map_err(|e| format!("sealing: {e}"))?;
        Self::map(fd, emitters)
    }

    /// Maps counters received from the parent, after checking the seals and the size.
    pub(crate) fn open(fd: OwnedFd, emitters: usize) -> Result<Issued, String> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|_| "not a memfd")?;
        if !seals.contains(SEALS) {
            return Err(format!(
                "issued counters without fixed size (seals {seals:?})"
            ));
        }
        let st = rustix::fs::fstat(&fd).map_err(|e| format!("fstat: {e}"))?;
        if st.st_size as u64 != size_for(emitters) as u64 {
            return Err(format!(
                "issued counters of {} bytes, expected {}",
                st.st_size,
                size_for(emitters)
            ));
        }
        Self::map(fd, emitters)
    }

    fn map(fd: OwnedFd, emitters: usize) -> Result<Issued, String> {
        let len = size_for(emitters);
        // SAFETY: a fresh shared mapping of `len` bytes of a memfd sealed against shrinking
        // (so every page stays backed: no SIGBUS); no existing memory is affected.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| format!("mmap: {e}"))?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or("mmap returned null")?;
        Ok(Issued {
            ptr,
            len,
            emitters,
            fd,
        })
    }

    /// The descriptor to hand to the emitters.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn counter(&self, e: usize) -> Option<&AtomicU64> {
        (e < self.emitters).then(|| {
            // SAFETY: `e * STRIDE + 8 <= len` (checked `e`), the mapping is page-aligned so
            // the address is 8-aligned, and it lives as long as `self`; every bit pattern is
            // a valid `u64`, and every process touches the counters only atomically.
            unsafe { &*self.ptr.as_ptr().add(e * STRIDE).cast::<AtomicU64>() }
        })
    }

    /// Emitter `e` has issued its records `0..n` (called before record `n - 1` is sent).
    pub(crate) fn raise(&self, e: usize, n: u64) {
        if let Some(c) = self.counter(e) {
            // SYNC POINT: publishes "records 0..n of emitter e exist" before the record travels;
            // the consumer's Acquire load in `get` sees it once it holds any output of that
            // record (the record's way through the rings, Release/Acquire at every hop, orders
            // the two).
            c.store(n, Ordering::Release);
        }
    }

    /// Records emitter `e` has issued so far (0 for an emitter that does not exist).
    pub(crate) fn get(&self, e: usize) -> u64 {
        // SYNC POINT: pairs with the Release store of `raise`.
        self.counter(e).map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Number of emitters.
    pub(crate) fn emitters(&self) -> usize {
        self.emitters
    }
}

impl Drop for Issued {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping made in `map`; no reference into it outlives
        // `self` (`counter` borrows `self`).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_shared_through_the_memfd_and_checked_on_open() {
        let a = Issued::create(3).unwrap();
        let b = Issued::open(a.fd().try_clone_to_owned().unwrap(), 3).unwrap();
        b.raise(2, 41);
        assert_eq!((a.get(0), a.get(2), a.get(3)), (0, 41, 0));
        // Another size, or a memfd that may change size, is refused.
        assert!(Issued::open(a.fd().try_clone_to_owned().unwrap(), 200).is_err());
        let loose = rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&loose, 4096).unwrap();
        assert!(Issued::open(loose, 3).is_err());
        // The size is fixed for good.
        assert!(rustix::fs::ftruncate(a.fd(), 0).is_err());
    }
}
