//! Child processes: `init` (the role switch at the top of `main`) and spawning by re-exec of
//! the current executable with its control socket. The parent's view of its running children
//! and their supervisor are in [`supervisor`](crate::supervisor).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::Error;
use crate::handover::Ctrl;
use crate::node::{self, ChildSpec};
use crate::step::Registry;

/// The environment variable that turns a re-executed binary into a pipeline child.
pub const ROLE_ENV: &str = "SHMPIPE_ROLE";

/// Set once a thread of this process has taken the child role.
static CHILD_TAKEN: AtomicBool = AtomicBool::new(false);

/// The role switch: call it first thing in `main` (and at the top of every test function that
/// starts a pipeline).
///
/// In the parent process it returns at once. In a pipeline child (a re-executed copy of the
/// current binary, marked by the `SHMPIPE_ROLE` environment variable) it runs the emitter or
/// worker role with the steps and sources of `reg`, then exits the process: it never returns.
/// If several threads of a child call it (a test binary running several tests), the first one
/// runs the role and the others wait until the process exits.
///
/// # Examples
/// ```
/// let reg = shmpipe::Registry::new();
/// shmpipe::init(&reg); // returns: this process is not a pipeline child
/// ```
pub fn init(reg: &Registry) {
    let Some(env) = std::env::var_os(ROLE_ENV) else {
        return;
    };
    if CHILD_TAKEN.swap(true, Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    // The role is this process's alone: programs that its steps start must not take it
    // (issue 16, hole 9: one that called `init` took itself for a pipeline child).
    // SAFETY: `init` runs at the top of `main`, before the program starts threads of its
    // own; threads that may exist (a test harness's, or other threads of a child calling
    // `init`, parked above) read the environment only through `std::env`, which takes the
    // same lock as `remove_var`. Nothing else in this process reads it through libc now.
    unsafe { std::env::remove_var(ROLE_ENV) };
    let spec: ChildSpec = match env.to_str().map(serde_json::from_str) {
        Some(Ok(s)) => s,
        _ => {
            eprintln!("shmpipe: malformed {ROLE_ENV}");
            std::process::exit(node::EXIT_SETUP);
        }
    };
    let ctrl = match inherited_ctrl(spec.ctrl_fd) {
        Ok(c) => c,
        Err(why) => {
            eprintln!(
                "shmpipe: {ROLE_ENV} is set but {why}: this process was not started by a \
                 pipeline (remove {ROLE_ENV} from its environment)"
            );
            std::process::exit(node::EXIT_SETUP);
        }
    };
    let code = crate::roles::run_child(reg, &spec, ctrl);
    crate::child::exit(code);
}

/// Takes the control socket the parent left at descriptor `fd`, after checking that `fd` is
/// open, was inherited (not close-on-exec: the parent cleared the flag in this child only) and
/// is a Unix `SOCK_SEQPACKET` socket; makes it close-on-exec again (processes this child
/// starts must not hold it: the parent sees this child's death as the end of the socket).
/// Nothing is owned (so nothing is closed) unless every check passes.
pub(crate) fn inherited_ctrl(fd: i32) -> Result<Ctrl, String> {
    use rustix::net::{AddressFamily, SocketType};
    if fd <= 2 {
        return Err(format!("its control descriptor {fd} is not valid"));
    }
    // SAFETY: fcntl(F_GETFD) on a plain number reads the descriptor's flags or fails with
    // EBADF; it creates no reference to the descriptor and changes nothing.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(format!("descriptor {fd} is not open"));
    }
    if flags & libc::FD_CLOEXEC != 0 {
        return Err(format!(
            "descriptor {fd} was not inherited (it is close-on-exec)"
        ));
    }
    // SAFETY: `fd` is open (checked just above) and `init` runs once per process
    // (`CHILD_TAKEN`), so nothing else in this process closes it during the checks.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let not_ctrl = || format!("descriptor {fd} is not a pipeline control socket");
    let ty = rustix::net::sockopt::socket_type(borrowed).map_err(|_| not_ctrl())?;
    let domain = rustix::net::sockopt::socket_domain(borrowed).map_err(|_| not_ctrl())?;
    if ty != SocketType::SEQPACKET || domain != AddressFamily::UNIX {
        return Err(not_ctrl());
    }
    rustix::io::fcntl_setfd(borrowed, rustix::io::FdFlags::CLOEXEC)
        .map_err(|e| format!("descriptor {fd}: {e}"))?;
    // SAFETY: an inherited Unix SEQPACKET socket at the number the parent named: the end of
    // the control socket it left us; nothing else in this process owns it.
    Ok(Ctrl::from_fd(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Whether this process is a pipeline child (its role taken, or its role variable set and
/// not yet read).
pub(crate) fn is_child() -> bool {
    CHILD_TAKEN.load(Ordering::SeqCst) || std::env::var_os(ROLE_ENV).is_some()
}

/// Whether descriptor `fd` of this process is open and stays open across exec.
fn inheritable(fd: i32) -> bool {
    // SAFETY: fcntl(F_GETFD) on a plain number reads its flags or fails with EBADF; it
    // creates no reference to the descriptor and changes nothing.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    flags >= 0 && flags & libc::FD_CLOEXEC == 0
}

/// Marks every descriptor from `first` up close-on-exec. Runs in a forked child before exec:
/// only system calls, no allocation, no lock.
fn cloexec_from(first: u32) -> std::io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC (Linux 5.11) only sets the close-on-exec
    // flag of descriptors in the range; it touches no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) {
        return Err(err);
    }
    // Older kernels: every possible descriptor, one by one, up to the process's limit.
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20)
        .min(1 << 20);
    for fd in u64::from(first)..limit {
        // SAFETY: F_SETFD on a plain number sets its close-on-exec flag, or fails with EBADF
        // for a number that is not open (ignored).
        unsafe { libc::fcntl(fd as i32, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

/// Starts one child, `program` (default: the current executable) with `args`, and `ctrl`, its
/// end of its control socket, as its only inherited descriptor besides the standard ones
/// (every other descriptor of the parent is close-on-exec in the child, whatever its flag in
/// the parent).
pub(crate) fn spawn(
    spec: &mut ChildSpec,
    program: Option<&std::path::Path>,
    args: &[String],
    ctrl: OwnedFd,
) -> Result<Child, Error> {
    use std::os::unix::process::CommandExt;
    let exe = match program {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe().map_err(Error::Spawn)?,
    };
    let raw = ctrl.as_raw_fd();
    spec.ctrl_fd = raw;
    let json = serde_json::to_string(spec).map_err(|e| Error::Config(e.to_string()))?;
    let mut cmd = Command::new(exe);
    // A parent whose stdout or stderr is closed (`python x.py 1>&-`), or is a descriptor that
    // closes at exec, would leave the child without it: the child's first open file would
    // take the number, and a Python child has no `sys.stdout` at all. It gets /dev/null there.
    if !inheritable(1) {
        cmd.stdout(Stdio::null());
    }
    if !inheritable(2) {
        cmd.stderr(Stdio::null());
    }
    cmd.args(args)
        .env(ROLE_ENV, json)
        .stdin(Stdio::null())
        // Its own process group: Ctrl-C in a terminal reaches the parent only, which then
        // shuts the pipeline down.
        .process_group(0);
    // SAFETY: the closure runs in the forked child of a possibly multithreaded parent, before
    // exec: it only makes system calls (close_range or fcntl; async-signal-safe, no
    // allocation, no lock) on numbers captured by value; the error paths build an io::Error
    // from a raw code (no allocation).
    unsafe {
        cmd.pre_exec(move || {
            // The child gets exactly its control socket besides 0, 1 and 2: whatever the
            // parent (or a library in it) left without close-on-exec closes at exec (issue 16,
            // hole 8). Marking instead of closing keeps std's own exec-error pipe working.
            cloexec_from(3)?;
            let fd = std::os::fd::BorrowedFd::borrow_raw(raw);
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())
                .map_err(|e| std::io::Error::from_raw_os_error(e.raw_os_error()))
        });
    }
    let child = cmd.spawn().map_err(Error::Spawn)?;
    // Our copy of the child's end goes: the socket's end of file then means the child is gone.
    drop(ctrl);
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, IntoRawFd};

    fn no_cloexec(fd: impl AsFd) {
        rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()).unwrap();
    }

    /// Issue 16, hole 9: a number that is not open, or open as something else, is refused
    /// without being owned (an `OwnedFd` over a closed number aborted the process; one over
    /// someone else's descriptor would have closed it).
    #[test]
    fn only_an_inherited_seqpacket_socket_is_taken_for_the_control_socket() {
        // A number that is not open.
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let closed = f.into_raw_fd();
        // SAFETY: `closed` came from `into_raw_fd` just above; closing it is its last use.
        drop(unsafe { OwnedFd::from_raw_fd(closed) });
        let e = inherited_ctrl(closed).unwrap_err();
        assert!(e.contains("not open"), "{e}");
        for std_fd in [-1, 0, 1, 2] {
            assert!(inherited_ctrl(std_fd).is_err());
        }
        // A regular file without close-on-exec: refused, and still open afterwards.
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        no_cloexec(&f);
        let e = inherited_ctrl(f.as_raw_fd()).unwrap_err();
        assert!(e.contains("not a pipeline control socket"), "{e}");
        assert!(rustix::io::fcntl_getfd(&f).is_ok(), "the file was closed");
        // A stream socket: not ours either.
        let (s, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        no_cloexec(&s);
        assert!(inherited_ctrl(s.as_raw_fd()).is_err());
        // A control socket this process made itself (close-on-exec): not inherited.
        let (_parent, child) = Ctrl::pair().unwrap();
        let e = inherited_ctrl(child.as_raw_fd()).unwrap_err();
        assert!(e.contains("not inherited"), "{e}");
        // What a parent leaves its child: taken, and close-on-exec again.
        no_cloexec(&child);
        let raw = child.into_raw_fd();
        let ctrl = inherited_ctrl(raw).unwrap();
        let flags = rustix::io::fcntl_getfd(ctrl.as_fd()).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
    }
}
