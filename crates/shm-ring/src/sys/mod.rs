//! Every operating-system call of the crate: memory files, space reservation, futexes,
//! process liveness, forks (here); directories (`dir`) and the Unix sockets of named channels
//! (`socket`). Nothing else in the crate talks to the kernel directly.

pub(crate) mod dir;
pub(crate) mod socket;

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::fs::{FallocateFlags, SealFlags};
use rustix::process::{Pid, PidfdFlags};

/// `fstat`.
pub(crate) fn fstat(file: &File) -> rustix::io::Result<rustix::fs::Stat> {
    rustix::fs::fstat(file)
}

/// Our effective uid.
pub(crate) fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Our effective gid.
pub(crate) fn egid() -> u32 {
    rustix::process::getegid().as_raw()
}

/// `struct passwd` of the C library (the same layout in glibc and musl on Linux).
#[repr(C)]
struct Passwd {
    name: *mut std::ffi::c_char,
    passwd: *mut std::ffi::c_char,
    uid: u32,
    gid: u32,
    gecos: *mut std::ffi::c_char,
    dir: *mut std::ffi::c_char,
    shell: *mut std::ffi::c_char,
}

unsafe extern "C" {
    fn getpwuid_r(
        uid: u32,
        pwd: *mut Passwd,
        buf: *mut std::ffi::c_char,
        len: usize,
        result: *mut *mut Passwd,
    ) -> std::ffi::c_int;
}

/// The primary group of user `uid` in the user database (`getpwuid_r`, through NSS); `None`
/// when the user has no entry (often so in containers) or the lookup fails.
pub(crate) fn primary_gid(uid: u32) -> Option<u32> {
    let mut buf = vec![0 as std::ffi::c_char; 16 << 10];
    let mut pwd = std::mem::MaybeUninit::<Passwd>::uninit();
    let mut result: *mut Passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to memory of ours of the size given; the C library writes the
    // entry into `pwd` and its strings into `buf`, and sets `result` to `pwd` or null.
    let rc = unsafe {
        getpwuid_r(
            uid,
            pwd.as_mut_ptr(),
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: `result` is non-null, so the C library filled `pwd` in.
    Some(unsafe { pwd.assume_init() }.gid)
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
    proc_stat(pid).map(|s| s.start)
}

/// The fields of `/proc/<pid>/stat` that liveness needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    /// State letter of the thread-group leader (field 3).
    state: char,
    /// Threads of the group not yet released (field 20): a leader that ended while other
    /// threads run shows `Z` with more than one; a real zombie shows one.
    threads: u64,
    /// Start time in clock ticks since boot (field 22).
    start: u64,
}

/// Parses the text of a `/proc/<pid>/stat` file; `None` if it is malformed.
fn parse_stat(stat: &str) -> Option<ProcStat> {
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let mut fields = stat[stat.rfind(')')? + 1..].split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 3 (state) .. : field n is the (n - 3)th after the name.
    let threads = fields.nth(16)?.parse().ok()?;
    let start = fields.nth(1)?.parse().ok()?;
    Some(ProcStat {
        state,
        threads,
        start,
    })
}

/// The stat fields of process `pid`; `None` if the file cannot be read or parsed (which says
/// nothing about the process: see [`liveness`]).
fn proc_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// What we know about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// It exists (and, where its start time is known, is the process we mean).
    Alive,
    /// Definitely gone: no such process (`ESRCH`), another process that reuses the pid (a
    /// different start time), or a zombie whose whole thread group has ended.
    Dead,
    /// Cannot tell (`/proc` unreadable: out of file descriptors or memory, `hidepid`, another
    /// pid namespace...). Every caller treats this as alive.
    Unknown,
}

/// Whether the process `pid` that started at `start_time` (0: not known) still exists.
/// Only definite evidence gives [`Liveness::Dead`]. A leader in state `Z` is not such evidence
/// by itself: a process whose main thread ended (`pthread_exit`) while other threads run shows
/// `Z` for its leader and is alive; it is dead only once the kernel counts no other thread.
pub(crate) fn liveness(pid: u32, start_time: u64) -> Liveness {
    let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return Liveness::Unknown; // 0 or out of range: not a pid, so not evidence of anything
    };
    if let Some(s) = proc_stat(pid) {
        let other_process = start_time != 0 && s.start != start_time;
        let group_ended = matches!(s.state, 'Z' | 'X') && s.threads <= 1;
        return if other_process || group_ended {
            Liveness::Dead
        } else {
            Liveness::Alive
        };
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

    /// Waits up to `timeout` for the process to be [dead](PeerProcess::is_dead); whether it
    /// is. Sleeps on the pidfd when there is one.
    pub(crate) fn wait_dead(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.is_dead() {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            let slice = left.min(Duration::from_millis(10));
            match &self.pidfd {
                Some(fd) => {
                    let ts = rustix::time::Timespec {
                        tv_sec: 0,
                        tv_nsec: slice.as_nanos() as i64,
                    };
                    let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                    let _ = rustix::event::poll(&mut fds, Some(&ts));
                }
                None => std::thread::sleep(slice),
            }
        }
    }

    /// Whether the process has definitely exited (or was never the one we expected): its
    /// pidfd is readable (the kernel says so only once the whole thread group has ended), or
    /// [`liveness`] has definite evidence. "Cannot tell" is not dead: this returns `false` then.
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

unsafe extern "C" {
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> std::ffi::c_int;
}

/// Has `prepare` run just before every later `fork()` done through the C library
/// (`pthread_atfork`; Python's `os.fork` and `multiprocessing` go through it), `parent` just
/// after it in the parent and `child` in the child. `child` must be async-signal-safe. A
/// failure (out of memory) leaves forks unseen.
pub(crate) fn on_fork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) {
    // SAFETY: registers plain function pointers with the C library; they live for the whole
    // program (`fn` items) and do nothing a fork handler may not.
    let _ = unsafe { pthread_atfork(Some(prepare), Some(parent), Some(child)) };
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
    fn stat_fields_are_parsed_past_a_name_with_spaces_and_parentheses() {
        let line = "42 (a) b (c) Z 1 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 3 0 12345 0 0";
        assert_eq!(
            parse_stat(line),
            Some(ProcStat {
                state: 'Z',
                threads: 3,
                start: 12345
            })
        );
        assert_eq!(parse_stat("42 (x) S 1"), None);
    }

    #[test]
    fn a_zombie_is_dead_only_once_its_thread_group_ended() {
        // An unreaped child that exited: a real zombie (one thread left, its leader's).
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        let start = process_start_time(pid).unwrap_or(0);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while proc_stat(pid).map(|s| s.state) != Some('Z') {
            assert!(std::time::Instant::now() < deadline, "child did not exit");
            std::thread::sleep(Duration::from_millis(2));
        }
        let s = proc_stat(pid).unwrap();
        assert_eq!(s.threads, 1, "{s:?}");
        assert_eq!(liveness(pid, start), Liveness::Dead);
        assert!(PeerProcess::watch(pid, start).is_dead());
        child.wait().unwrap();
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
