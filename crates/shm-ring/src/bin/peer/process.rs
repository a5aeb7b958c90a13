//! What both halves of the peer (`real` in `shm-ring-peer.rs` and `issue16.rs`) need of the
//! process: printing a line, forking, exiting, reaping, reading stdin.

use std::io::Write;

pub(crate) fn say(s: &str) {
    let mut o = std::io::stdout();
    let _ = writeln!(o, "{s}");
    let _ = o.flush();
}

unsafe extern "C" {
    fn syscall(num: std::ffi::c_long, ...) -> std::ffi::c_long;
    fn fork() -> i32;
    fn _exit(code: i32) -> !;
}

/// Ends the calling thread only: the raw `exit` system call (not `exit_group`, and not
/// `pthread_exit`, whose forced unwinding must not cross Rust frames). When the main thread
/// does this, the process lives on in its other threads while its thread-group leader shows
/// `State: Z` in `/proc/<pid>/stat`, exactly as after `pthread_exit` in C.
pub(crate) fn exit_this_thread_only() -> ! {
    #[cfg(target_arch = "x86_64")]
    const SYS_EXIT: std::ffi::c_long = 60;
    #[cfg(target_arch = "aarch64")]
    const SYS_EXIT: std::ffi::c_long = 93;
    // SAFETY: `exit` ends this thread without running anything of it again; every value the
    // other threads use was moved to them, and nothing on this stack is referenced by them.
    unsafe { syscall(SYS_EXIT, 0 as std::ffi::c_long) };
    unreachable!("the exit system call returned")
}

/// `fork()`: `Some(0)` in the child, `Some(pid)` in the parent. Only called while this
/// process has one thread.
pub(crate) fn fork_now() -> Option<i32> {
    // SAFETY: the peer is single-threaded when it forks (no lock can be held by another
    // thread); the child only drops handles, prints and calls `_exit`.
    let pid = unsafe { fork() };
    (pid >= 0).then_some(pid)
}

pub(crate) fn exit_child() -> ! {
    // SAFETY: `_exit` ends the forked child without running atexit handlers or flushing
    // buffers it shares with the parent.
    unsafe { _exit(0) }
}

pub(crate) fn reap(pid: i32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
    }
}

pub(crate) fn stdin_lines() -> impl Iterator<Item = String> {
    use std::io::BufRead;
    std::io::stdin().lock().lines().map_while(Result::ok)
}

pub(crate) fn sum_x(m: &shm_ring::Message) -> u64 {
    m.record(0)
        .and_then(|r| {
            r.array::<u32>("x")
                .map(|a| a.iter().map(|&v| v as u64).sum())
        })
        .unwrap_or(u64::MAX)
}
