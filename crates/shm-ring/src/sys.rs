//! Every operating-system call of the crate: shared-memory files, space reservation, futexes,
//! process liveness. Nothing else in the crate talks to the kernel directly.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::fs::{FallocateFlags, Mode, SealFlags};
use rustix::process::{Pid, PidfdFlags};
use rustix::shm;

/// Directory where POSIX shared-memory objects live on Linux.
pub(crate) const SHM_DIR: &str = "/dev/shm";

/// `shm_open(O_CREAT | O_EXCL | O_RDWR, 0600)`.
pub(crate) fn shm_create(os_name: &str) -> rustix::io::Result<File> {
    let fd = shm::open(
        os_name,
        shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
        Mode::RUSR | Mode::WUSR,
    )?;
    Ok(File::from(fd))
}

/// `shm_open(O_RDWR)` of an existing object.
pub(crate) fn shm_open_rw(os_name: &str) -> rustix::io::Result<File> {
    let fd = shm::open(os_name, shm::OFlags::RDWR, Mode::empty())?;
    Ok(File::from(fd))
}

/// `shm_open(O_RDONLY)` of an existing object (used to inspect stale segments).
pub(crate) fn shm_open_ro(os_name: &str) -> rustix::io::Result<File> {
    let fd = shm::open(os_name, shm::OFlags::RDONLY, Mode::empty())?;
    Ok(File::from(fd))
}

/// `shm_unlink`.
pub(crate) fn shm_unlink(os_name: &str) -> rustix::io::Result<()> {
    shm::unlink(os_name)
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

/// Sets the size and reserves every page now, so a too-small tmpfs fails here with
/// `ENOSPC` instead of killing the process with `SIGBUS` on first touch.
pub(crate) fn reserve(file: &File, len: u64) -> rustix::io::Result<()> {
    rustix::fs::ftruncate(file, len)?;
    rustix::fs::fallocate(file, FallocateFlags::empty(), 0, len)
}

/// Free bytes on the file system holding `file`.
pub(crate) fn free_bytes(file: &File) -> u64 {
    match rustix::fs::fstatvfs(file) {
        Ok(s) => s.f_bavail.saturating_mul(s.f_frsize),
        Err(_) => 0,
    }
}

/// Size of an open file.
pub(crate) fn file_len(file: &File) -> io::Result<u64> {
    Ok(file.metadata()?.len())
}

/// Our own pid.
pub(crate) fn pid() -> u32 {
    rustix::process::getpid().as_raw_nonzero().get() as u32
}

/// The start time of process `pid` in clock ticks since boot (field 22 of `/proc/pid/stat`),
/// or `None` if there is no such process. Together with the pid it names a process uniquely,
/// so a recycled pid is not mistaken for the creator of a segment.
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, start)| start)
}

/// State letter and start time of process `pid`, from `/proc/<pid>/stat`.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let mut fields = stat[stat.rfind(')')? + 1..].split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Whether the process `pid` that started at `start_time` (0: not known) still exists;
/// zombies count as gone.
pub(crate) fn process_alive(pid: u32, start_time: u64) -> bool {
    match proc_stat(pid) {
        Some(('Z' | 'X', _)) | None => false,
        Some((_, start)) => start_time == 0 || start == start_time,
    }
}

/// A handle on another process that tells, without races on pid reuse, when it has exited.
#[derive(Debug)]
pub(crate) struct PeerProcess {
    pid: u32,
    pidfd: Option<OwnedFd>,
    start_time: u64,
}

impl PeerProcess {
    /// Watches `pid`, which must have started at `start_time` (0: not known).
    pub(crate) fn watch(pid: u32, start_time: u64) -> PeerProcess {
        let pidfd = Pid::from_raw(pid as i32)
            .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
        PeerProcess {
            pid,
            pidfd,
            start_time,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has exited (or never was the one we expected).
    pub(crate) fn is_dead(&self) -> bool {
        if self.start_time != 0 && !process_alive(self.pid, self.start_time) {
            return true;
        }
        match &self.pidfd {
            Some(fd) => {
                let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                let zero = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
            }
            // No pidfd (the process was already gone when we looked): fall back on /proc.
            None => std::fs::metadata(format!("/proc/{}", self.pid)).is_err(),
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
