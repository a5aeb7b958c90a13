//! Sealed memfds: bytes laid out once by the parent, then sealed `F_SEAL_WRITE |
//! F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL` so that nobody, the creator included, can change
//! them, shrink or grow them again. Only then may a reader validate them once and map them
//! without fear of changing bytes or SIGBUS. They reach the workers by descriptor
//! ([`shmpipe::PipelineBuilder::share_fd`]), never by name or number.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};

use super::error::SharedError;

/// The seals of an immutable memfd.
pub(crate) const SEALS: SealFlags = SealFlags::WRITE
    .union(SealFlags::SHRINK)
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

fn os(what: impl Into<String>) -> impl FnOnce(rustix::io::Errno) -> SharedError {
    let what = what.into();
    move |e| SharedError::Os {
        what,
        source: e.into(),
    }
}

/// A new memfd named `name` of `len` bytes, reserved (`fallocate`: running out of memory is
/// an error here, never a SIGBUS later), close-on-exec, not sealed yet.
pub(crate) fn create(name: &str, len: u64) -> Result<File, SharedError> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(os("memfd_create"))?;
    rustix::fs::ftruncate(&fd, len).map_err(os("ftruncate memfd"))?;
    if len > 0 {
        rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, len)
            .map_err(os(format!("reserving {len} bytes of shared memory")))?;
    }
    Ok(File::from(fd))
}

/// Seals a memfd for good. No writable mapping of it may be left (`F_SEAL_WRITE` fails then).
pub(crate) fn seal(fd: OwnedFd) -> Result<OwnedFd, SharedError> {
    rustix::fs::fcntl_add_seals(&fd, SEALS).map_err(os("sealing memfd"))?;
    Ok(fd)
}

/// Checks that `fd` is a regular file carrying all four seals.
///
/// # Errors
/// [`SharedError::NotSealed`] unless all four seals are set; [`SharedError::Corrupt`] for
/// something that is not a regular file.
pub(crate) fn check_sealed(fd: impl AsFd) -> Result<(), SharedError> {
    let fd = fd.as_fd();
    let st = rustix::fs::fstat(fd).map_err(os("fstat"))?;
    if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() {
        return Err(SharedError::Corrupt("not a regular file".into()));
    }
    // Files that are not memfds have no seals: the call fails or returns none.
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|_| SharedError::NotSealed)?;
    if !seals.contains(SEALS) {
        return Err(SharedError::NotSealed);
    }
    Ok(())
}

/// The bytes of the file at `path`, copied once into a new sealed memfd named `name`. The
/// file may change afterwards: the copy does not.
pub(crate) fn copy_of_file(path: &Path, name: &str) -> Result<OwnedFd, SharedError> {
    let io = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |e: std::io::Error| SharedError::Os { what, source: e }
    };
    let mut src = File::open(path).map_err(io("opening"))?;
    let len = src.metadata().map_err(io("fstat"))?.len();
    let mut dst = create(name, len)?;
    // Exactly `len` bytes: a file that grows meanwhile is cut at its length when opened, one
    // that shrinks is an error (the copy would end in zeros).
    let copied = std::io::copy(&mut (&mut src).take(len), &mut dst).map_err(io("copying"))?;
    if copied != len {
        return Err(SharedError::Corrupt(format!(
            "{} shrank from {len} to {copied} bytes while it was copied",
            path.display()
        )));
    }
    seal(OwnedFd::from(dst))
}
