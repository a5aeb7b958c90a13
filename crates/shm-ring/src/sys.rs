//! Every operating-system call of the crate: shared-memory files, space reservation, futexes,
//! process liveness. Nothing else in the crate talks to the kernel directly.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::fs::{AtFlags, FallocateFlags, FlockOperation, Mode, OFlags, RenameFlags, SealFlags};
use rustix::process::{Pid, PidfdFlags};

/// Directory where POSIX shared-memory objects live on Linux.
pub(crate) const SHM_DIR: &str = "/dev/shm";

/// `/dev/shm`, opened as a directory: every named segment is reached relative to it.
pub(crate) fn shm_dir() -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        rustix::fs::CWD,
        SHM_DIR,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Opens the entry `entry` of `dir` (read-write or read-only) without following a symlink
/// (`ELOOP`) and without blocking (a FIFO opens at once instead of waiting for a writer).
/// The caller must still check what it opened ([`fstat`]) before using it.
pub(crate) fn open_entry(dir: &OwnedFd, entry: &str, write: bool) -> rustix::io::Result<File> {
    let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
    let fd = rustix::fs::openat(
        dir,
        entry,
        access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(File::from(fd))
}

/// Creates the new entry `entry` of `dir`: `O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW`, mode 0600.
pub(crate) fn create_entry(dir: &OwnedFd, entry: &str) -> rustix::io::Result<File> {
    let fd = rustix::fs::openat(
        dir,
        entry,
        OFlags::CREATE
            | OFlags::EXCL
            | OFlags::RDWR
            | OFlags::NOFOLLOW
            | OFlags::NOCTTY
            | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )?;
    Ok(File::from(fd))
}

/// Gives the file `from` the name `to` in `dir`, atomically, failing with `EEXIST` if `to`
/// exists (`renameat2(RENAME_NOREPLACE)`; `link` + `unlink` where that flag is unsupported).
pub(crate) fn publish_entry(dir: &OwnedFd, from: &str, to: &str) -> rustix::io::Result<()> {
    match rustix::fs::renameat_with(dir, from, dir, to, RenameFlags::NOREPLACE) {
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {
            rustix::fs::linkat(dir, from, dir, to, AtFlags::empty())?;
            let _ = rustix::fs::unlinkat(dir, from, AtFlags::empty());
            Ok(())
        }
        r => r,
    }
}

/// Device and inode of the entry `entry` of `dir` itself (a symlink is not followed).
pub(crate) fn entry_id(dir: &OwnedFd, entry: &str) -> Option<(u64, u64)> {
    let st = rustix::fs::statat(dir, entry, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    Some((st.st_dev, st.st_ino))
}

/// Removes the entry `entry` of `dir` if it still names the file `id` (device, inode).
///
/// The check and the unlink are two system calls: if, between them, another process removes
/// the name and a third publishes a new file under it, the new file loses its name. Linux
/// offers no "unlink if this inode" call; the window is a few microseconds wide and needs two
/// other processes acting on the same name inside it.
pub(crate) fn unlink_entry_if(dir: &OwnedFd, entry: &str, id: (u64, u64)) -> bool {
    entry_id(dir, entry) == Some(id) && rustix::fs::unlinkat(dir, entry, AtFlags::empty()).is_ok()
}

/// `fstat`.
pub(crate) fn fstat(file: &File) -> rustix::io::Result<rustix::fs::Stat> {
    rustix::fs::fstat(file)
}

/// Our effective uid.
pub(crate) fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Takes a shared `flock` on `file` without waiting: `false` if someone holds it exclusively.
/// The lock belongs to the open file description and dies with its last descriptor, that is
/// with the process at the latest (even on SIGKILL).
pub(crate) fn try_lock_shared(file: &File) -> bool {
    rustix::fs::flock(file, FlockOperation::NonBlockingLockShared).is_ok()
}

/// Takes an exclusive `flock` on `file` without waiting: `true` only if no open file
/// description anywhere holds a lock on the file.
pub(crate) fn try_lock_exclusive(file: &File) -> bool {
    rustix::fs::flock(file, FlockOperation::NonBlockingLockExclusive).is_ok()
}

/// An anonymous memory file (`memfd_create`) that can be sealed, closed on exec unless passed
/// on explicitly.
pub(crate) fn memfd(name: &str) -> rustix::io::Result<File> {
    let fd = rustix::fs::memfd_create(
        name,
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )?;
    Ok(File::from(fd))
}

/// The seals a laid-out anonymous segment carries: its size can no longer change (so no peer
/// can truncate it under a mapping, the cause of `SIGBUS`), and no seal can be added or removed
/// (so no peer can add `F_SEAL_WRITE`/`F_SEAL_FUTURE_WRITE` later). Writes stay allowed.
pub(crate) fn required_seals() -> SealFlags {
    SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL
}

/// Adds [`required_seals`] to a memfd made by [`memfd`].
pub(crate) fn seal(file: &File) -> rustix::io::Result<()> {
    rustix::fs::fcntl_add_seals(file, required_seals())
}

/// The seals of a file (`F_GET_SEALS`); `EINVAL` for a file that does not support sealing.
pub(crate) fn seals(file: &File) -> rustix::io::Result<SealFlags> {
    rustix::fs::fcntl_get_seals(file)
}

/// Sets the size to `len` and reserves the first `reserve` bytes now, so a too-small tmpfs
/// fails here with `ENOSPC` instead of killing the process with `SIGBUS` on first touch. The
/// rest stays a hole (address space only) until [`allocate`] reserves it.
pub(crate) fn reserve(file: &File, len: u64, reserve: u64) -> rustix::io::Result<()> {
    rustix::fs::ftruncate(file, len)?;
    allocate(file, 0, reserve.min(len))
}

/// Reserves the pages of `[off, off + len)` of `file` (within its size): `ENOSPC` now instead
/// of `SIGBUS` at the first touch. Allowed on a memfd sealed against growing, since the size
/// does not change.
pub(crate) fn allocate(file: &File, off: u64, len: u64) -> rustix::io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    rustix::fs::fallocate(file, FallocateFlags::empty(), off, len)
}

/// Gives back the pages of `[off, off + len)` of `file` (a hole: they read as zeros and are
/// reserved again by [`allocate`]); the size does not change, so a sealed memfd allows it.
pub(crate) fn punch(file: &File, off: u64, len: u64) -> rustix::io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    rustix::fs::fallocate(
        file,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        off,
        len,
    )
}

/// The machine's memory in bytes (`MemTotal` of `/proc/meminfo`).
pub(crate) fn mem_total() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Free bytes on the file system holding `file`.
pub(crate) fn free_bytes(file: &File) -> u64 {
    match rustix::fs::fstatvfs(file) {
        Ok(s) => s.f_bavail.saturating_mul(s.f_frsize),
        Err(_) => 0,
    }
}

/// Our own pid.
pub(crate) fn pid() -> u32 {
    rustix::process::getpid().as_raw_nonzero().get() as u32
}

/// The start time of process `pid` in clock ticks since boot (field 22 of `/proc/pid/stat`),
/// or `None` if it cannot be read. Together with the pid it names a process uniquely, so a
/// recycled pid is not mistaken for the creator of a segment.
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, start)| start)
}

/// State letter and start time of process `pid`, from `/proc/<pid>/stat`; `None` if the file
/// cannot be read or parsed (which says nothing about the process: see [`liveness`]).
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let mut fields = stat[stat.rfind(')')? + 1..].split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// What we know about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// It exists (and, where its start time is known, is the process we mean).
    Alive,
    /// Definitely gone: no such process (`ESRCH`), a zombie, or another process that reuses
    /// the pid (a different start time).
    Dead,
    /// Cannot tell (`/proc` unreadable: out of file descriptors or memory, `hidepid`, another
    /// pid namespace...). Every caller treats this as alive.
    Unknown,
}

/// Whether the process `pid` that started at `start_time` (0: not known) still exists.
/// Only definite evidence gives [`Liveness::Dead`].
pub(crate) fn liveness(pid: u32, start_time: u64) -> Liveness {
    let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return Liveness::Unknown; // 0 or out of range: not a pid, so not evidence of anything
    };
    if let Some((state, start)) = proc_stat(pid) {
        if matches!(state, 'Z' | 'X') || (start_time != 0 && start != start_time) {
            return Liveness::Dead;
        }
        return Liveness::Alive;
    }
    // /proc told us nothing: ask the kernel directly.
    match rustix::process::test_kill_process(p) {
        Err(rustix::io::Errno::SRCH) => Liveness::Dead,
        // It exists (EPERM: it exists but belongs to another user); a recycled pid cannot be
        // told apart without /proc, so assume it is still ours.
        Ok(()) | Err(rustix::io::Errno::PERM) => Liveness::Alive,
        Err(_) => Liveness::Unknown,
    }
}

/// A handle on another process that tells, without races on pid reuse, when it has exited.
#[derive(Debug)]
pub(crate) struct PeerProcess {
    pid: u32,
    pidfd: Option<OwnedFd>,
    start_time: u64,
    /// `pidfd_open` said `ESRCH`: there was no such process when we started watching.
    gone: bool,
}

impl PeerProcess {
    /// Watches `pid`, which must have started at `start_time` (0: not known).
    pub(crate) fn watch(pid: u32, start_time: u64) -> PeerProcess {
        let opened = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .map(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()));
        let (pidfd, gone) = match opened {
            Some(Ok(fd)) => (Some(fd), false),
            Some(Err(rustix::io::Errno::SRCH)) => (None, true),
            // EMFILE, ENOSYS, a pid of 0...: no handle, fall back on `liveness` each time.
            _ => (None, false),
        };
        PeerProcess {
            pid,
            pidfd,
            start_time,
            gone,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has definitely exited (or was never the one we expected). "Cannot
    /// tell" is not dead: this returns `false` then.
    pub(crate) fn is_dead(&self) -> bool {
        if self.gone {
            return true;
        }
        if self.start_time != 0 && liveness(self.pid, self.start_time) == Liveness::Dead {
            return true;
        }
        match &self.pidfd {
            Some(fd) => {
                // A pidfd becomes readable when its process exits; it cannot refer to a later
                // process that reuses the pid.
                let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                let zero = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
            }
            None => liveness(self.pid, self.start_time) == Liveness::Dead,
        }
    }
}

/// Sleeps while `*word == expected`, at most `timeout`. The word may live in shared memory
/// (no `FUTEX_PRIVATE_FLAG`). Spurious returns are fine: callers re-check their condition.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as i64,
    };
    let _ = rustix::thread::futex::wait(
        word,
        rustix::thread::futex::Flags::empty(),
        expected,
        Some(&ts),
    );
}

/// Wakes every sleeper on `word` (in any process).
pub(crate) fn futex_wake_all(word: &AtomicU32) {
    let _ =
        rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
}

/// Names of the entries in `/dev/shm` that start with `prefix`.
pub(crate) fn list_shm(prefix: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_is_definite_only_with_evidence() {
        let me = pid();
        let start = process_start_time(me).expect("our own /proc/self/stat");
        assert_eq!(liveness(me, start), Liveness::Alive);
        assert_eq!(liveness(me, 0), Liveness::Alive);
        // Same pid, another start time: another process.
        assert_eq!(liveness(me, start + 1), Liveness::Dead);
        // Not a pid at all: no evidence either way.
        assert_eq!(liveness(0, 0), Liveness::Unknown);
        assert_eq!(liveness(u32::MAX, 0), Liveness::Unknown);
        // Above pid_max (at most 2^22): no such process.
        assert_eq!(liveness(0x7fff_fff0, 0), Liveness::Dead);
        assert!(PeerProcess::watch(0x7fff_fff0, 0).is_dead());
        assert!(!PeerProcess::watch(0, 0).is_dead());
    }

    #[test]
    fn a_reaped_child_is_dead_and_a_live_one_alive() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let start = process_start_time(pid).unwrap();
        let watch = PeerProcess::watch(pid, start);
        assert_eq!(liveness(pid, start), Liveness::Alive);
        assert!(!watch.is_dead());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(watch.is_dead());
        assert_eq!(liveness(pid, start), Liveness::Dead);
    }
}
