//! Every OS call of the harness that `std` does not wrap: CPU pinning and parent-death signals.

use std::io;
use std::ptr::NonNull;

use rustix::mm::{MapFlags, ProtFlags};

/// Pins the calling thread to CPU `core`.
///
/// # Errors
/// The OS error, e.g. when `core` is not in the process's allowed set.
pub fn pin_to_core(core: usize) -> io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(core);
    rustix::thread::sched_setaffinity(None, &set).map_err(io::Error::from)
}

/// CPUs this process may run on, in increasing order (at least one entry).
pub fn allowed_cores() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => {
            let cores: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
                .filter(|&c| set.is_set(c))
                .collect();
            if cores.is_empty() { vec![0] } else { cores }
        }
        Err(_) => vec![0],
    }
}

/// The two CPUs a producer and a consumer are pinned to: the first two allowed ones (the same
/// one twice on a single-CPU machine).
pub fn core_pair() -> (usize, usize) {
    let cores = allowed_cores();
    (cores[0], cores[1 % cores.len()])
}

/// The 1-minute load average from `/proc/loadavg` (NaN if unreadable): other work on the
/// machine shows up here and in the ping-pong probe.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// CPU the calling thread runs on now.
pub fn current_core() -> usize {
    rustix::thread::sched_getcpu()
}

/// Asks the kernel to SIGKILL this process when its parent exits, so a worker never outlives
/// an interrupted harness.
///
/// # Errors
/// The OS error from `prctl`.
pub fn die_with_parent() -> io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(io::Error::from)
}

/// A shared, read-write mapping of a memory file, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    /// Start of the mapping (page-aligned, non-null); valid for `len` bytes until drop.
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; sending it moves that ownership.
unsafe impl Send for Mapping {}

/// A fresh memory file (`memfd`, zero-filled, close-on-exec) of `len` bytes, for the harness's
/// hand-written peers: the harness makes it and hands it to both processes (as their stdin),
/// so nothing is named and nothing lands in `/dev/shm`.
///
/// # Errors
/// The OS error.
pub fn shared_memfd(len: usize) -> io::Result<std::fs::File> {
    let fd = rustix::fs::memfd_create("shmpipe-bench-peer", rustix::fs::MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, len as u64)?;
    Ok(fd.into())
}

/// This process's stdin, as a file (a peer's memory file, handed over by the harness).
///
/// # Errors
/// The OS error.
pub fn stdin_file() -> io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    Ok(std::io::stdin().as_fd().try_clone_to_owned()?.into())
}

impl Mapping {
    /// Maps the first `len` bytes of `file`, once it has them.
    ///
    /// # Errors
    /// The OS error; `WouldBlock` while the file is smaller than `len`.
    pub fn of(file: &std::fs::File, len: usize) -> io::Result<Mapping> {
        use std::os::fd::AsFd;
        let size = rustix::fs::fstat(file)?.st_size;
        if (size as u64) < len as u64 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let fd = file.as_fd().try_clone_to_owned()?;
        Self::map(&fd, len)
    }

    fn map(fd: &std::os::fd::OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping chosen by the kernel (null hint) aliases no Rust
        // object; `len` bytes of the object exist (ftruncate above, or checked by `open`).
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(io::ErrorKind::Other)?;
        Ok(Mapping { ptr, len })
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned, and no reference into the
        // mapping outlives `self` (they all borrow it).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_moves_the_thread() {
        let (a, b) = core_pair();
        std::thread::spawn(move || {
            for core in [a, b] {
                pin_to_core(core).unwrap();
                assert_eq!(current_core(), core);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn mapping_is_shared_between_two_maps() {
        let f = shared_memfd(4096).unwrap();
        let a = Mapping::of(&f, 4096).unwrap();
        let b = Mapping::of(&f, 4096).unwrap();
        let err = Mapping::of(&f, 8192).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock, "file too small");
        // SAFETY: both mappings are 4096 bytes long and alive; byte 100 is in range.
        unsafe {
            a.as_ptr().add(100).write_volatile(42);
            assert_eq!(b.as_ptr().add(100).read_volatile(), 42);
        }
        assert_eq!((a.len(), a.is_empty()), (4096, false));
    }

    #[test]
    fn load_average_is_read() {
        let l = load_average();
        assert!(l.is_finite() && l >= 0.0, "{l}");
    }

    #[test]
    fn pinning_to_a_missing_core_fails() {
        let missing = rustix::thread::CpuSet::MAX_CPU - 1;
        assert!(!allowed_cores().contains(&missing));
        std::thread::spawn(move || assert!(pin_to_core(missing).is_err()))
            .join()
            .unwrap();
    }
}
