//! Directories and their entries, reached relative to an open directory descriptor: the
//! socket directory of named channels (see `crate::rendezvous`).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

/// The environment variable that overrides the socket directory of named channels
/// (`Rendezvous::DIR_ENV`). Here, below both, because the rendezvous reads it and the
/// errors' texts name it.
pub(crate) const DIR_ENV: &str = "SHMPIPE_DIR";

/// Makes the directory `path` with mode 0700 (less the umask); `Ok(false)` if something of
/// that name exists already (not followed, not checked: the caller opens and checks it).
pub(crate) fn make_private_dir(path: &Path) -> rustix::io::Result<bool> {
    match rustix::fs::mkdirat(rustix::fs::CWD, path, Mode::RWXU) {
        Ok(()) => Ok(true),
        Err(Errno::EXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Opens the directory `path` without following a symlink in its last component (`ELOOP`)
/// and refusing anything that is not a directory (`ENOTDIR`).
pub(crate) fn open_dir(path: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        rustix::fs::CWD,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// `lstat` of `path` (a symlink is described, not followed).
pub(crate) fn lstat(path: &Path) -> rustix::io::Result<rustix::fs::Stat> {
    rustix::fs::statat(rustix::fs::CWD, path, AtFlags::SYMLINK_NOFOLLOW)
}

/// `fstat` of a descriptor.
pub(crate) fn fstat(fd: impl AsFd) -> rustix::io::Result<rustix::fs::Stat> {
    rustix::fs::fstat(fd)
}

/// The entry `entry` of `dir` itself (a symlink is described, not followed); `None` if there
/// is none.
pub(crate) fn entry(dir: &OwnedFd, entry: &str) -> Option<rustix::fs::Stat> {
    rustix::fs::statat(dir, entry, AtFlags::SYMLINK_NOFOLLOW).ok()
}

/// Whether a stat describes a socket.
pub(crate) fn is_socket(st: &rustix::fs::Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::Socket
}

/// What kind of file a stat describes, in words (for error messages).
pub(crate) fn kind_of(st: &rustix::fs::Stat) -> &'static str {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "a file of unknown type",
    }
}

/// Sets the permission bits of the entry `entry` of `dir`.
pub(crate) fn chmod_entry(dir: &OwnedFd, entry: &str, mode: u32) -> rustix::io::Result<()> {
    rustix::fs::chmodat(dir, entry, Mode::from_raw_mode(mode), AtFlags::empty())
}

/// Removes the entry `entry` of `dir`.
pub(crate) fn unlink(dir: &OwnedFd, entry: &str) -> rustix::io::Result<()> {
    rustix::fs::unlinkat(dir, entry, AtFlags::empty())
}

/// A path that reaches `entry` inside the directory open as `dir`, for calls that take a path
/// only (`bind`, `connect`): `/proc/self/fd/<dir>/<entry>`. The kernel resolves the
/// descriptor's own directory, so the path cannot be redirected after the directory was
/// checked. At most 25 bytes plus the entry.
pub(crate) fn path_in(dir: &OwnedFd, entry: &str) -> String {
    format!("/proc/self/fd/{}/{entry}", dir.as_raw_fd())
}

/// An exclusive `flock` on a directory, released on drop (and by the kernel when its
/// process dies).
#[derive(Debug)]
pub(crate) struct DirLock<'a>(&'a OwnedFd);

impl Drop for DirLock<'_> {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(self.0, FlockOperation::Unlock);
    }
}

/// Locks `dir` exclusively, retrying (sleeping 1 ms between tries) until `deadline`.
/// `Err(EWOULDBLOCK)` if another open of the directory held it all along.
pub(crate) fn lock(dir: &OwnedFd, deadline: Instant) -> rustix::io::Result<DirLock<'_>> {
    loop {
        match rustix::fs::flock(dir, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(DirLock(dir)),
            Err(Errno::WOULDBLOCK | Errno::INTR) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    }
}
