//! A pipeline child's own state: its control socket and how it names itself, its watch over
//! the parent after start-up, what it says on stderr (only real problems, named by role and
//! pid), and how it exits (saying why, so that the parent never mistakes a code that a step
//! passed to `exit` for one of the pipeline's own).
//!
//! The parent watch: the control socket's end of file alone is not enough, since a fork of
//! the parent (a forked helper of a library, `multiprocessing`'s fork start method) holds the
//! parent's end too and keeps it open after the parent is SIGKILLed (issue 16, review finding
//! 2). So the watchdog also holds a pidfd of the parent (readable once the parent's process
//! has ended, whatever holds its descriptors) and checks every 100 ms that its parent is
//! still the process that started it (a child whose parent ended is given to another).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

use crate::credit::Gate;
use crate::handover::{Ctrl, CtrlError, Kind, Msg};
use crate::node::{EXIT_ORPHAN, EXIT_STOPPED};

/// The child's control socket, how it names itself in logs (role and pid) and its role as error
/// reports name it (`worker 0 (stage 0)`); set once, at the start of the role.
static CHILD: OnceLock<(Arc<Ctrl>, String, String)> = OnceLock::new();

/// Set when the parent said `STOP` or is gone: a lost peer is then no news.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// How often the watchdog looks at its parent's pid even when nothing woke it.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// Records this child's control socket, its name (role and pid) and its role.
pub(crate) fn set(ctrl: Arc<Ctrl>, name: String, role: String) {
    let _ = CHILD.set((ctrl, name, role));
}

/// This child's role as error reports name it (`worker 0 (stage 0)`).
pub(crate) fn role_name() -> String {
    CHILD
        .get()
        .map_or_else(|| "child".into(), |(_, _, r)| r.clone())
}

/// Logs a real problem of this child on stderr, named by role and pid.
pub(crate) fn log(msg: &str) {
    let me = CHILD.get().map_or("child", |(_, m, _)| m.as_str());
    eprintln!("shmpipe {me}: {msg}");
}

/// Whether the parent is shutting the pipeline down on purpose (or is gone): then a lost peer
/// is no news and the child exits quietly. The parent tells its children one after another, so
/// a child may see a peer that already obeyed `STOP` exit before its own `STOP` is there: it
/// allows the message a moment to arrive (a real loss is reported at most that much later).
pub(crate) fn stopping() -> bool {
    const GRACE: Duration = Duration::from_millis(200);
    let t0 = Instant::now();
    while !STOPPING.load(Ordering::SeqCst) {
        if CHILD.get().is_none() || t0.elapsed() >= GRACE {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// Ends this child with `code`, having told the parent that the pipeline ends it so (`EXIT`
/// on the control socket; nothing is said when the parent is gone).
pub(crate) fn exit(code: i32) -> ! {
    if let Some((ctrl, _, _)) = CHILD.get() {
        let _ = ctrl.send_value(Kind::Exit, code as u64);
    }
    std::process::exit(code)
}

/// Whether the process that started this child (pid `parent`) has ended: this child then has
/// another parent.
fn parent_gone(parent: u32) -> bool {
    rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(parent)
}

/// A pidfd of the parent, if the kernel has them. Opened while the parent is still this
/// child's parent (checked after opening), so it names that process and no later one with
/// its number.
fn parent_pidfd(parent: u32) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(parent as i32)?;
    let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()?;
    (!parent_gone(parent)).then_some(fd)
}

/// Waits up to [`WATCH_EVERY`] for a control message or the parent's end: (a message or end
/// of file is waiting on `ctrl`, the parent's process has ended).
fn wait(ctrl: &Ctrl, pidfd: Option<&OwnedFd>) -> (bool, bool) {
    let ts = Timespec {
        tv_sec: 0,
        tv_nsec: WATCH_EVERY.as_nanos() as i64,
    };
    let mut fds = vec![PollFd::new(ctrl, PollFlags::IN)];
    if let Some(p) = pidfd {
        fds.push(PollFd::new(p, PollFlags::IN));
    }
    if poll(&mut fds, Some(&ts)).is_err() {
        // EINTR; or a failure that waiting a moment does not make worse.
        std::thread::sleep(Duration::from_millis(10));
        return (false, false);
    }
    let ready = |f: &PollFd<'_>| !f.revents().is_empty();
    (ready(&fds[0]), fds.get(1).is_some_and(ready))
}

/// The parent watchdog: exits the child as soon as its control socket says `STOP` (quietly),
/// or the parent is gone (its pidfd, its pid, or its end of the socket), and hands `CREDIT`
/// grants to `gate` (an emitter of an ordered pipeline).
pub(crate) fn start_watchdog(ctrl: Arc<Ctrl>, parent: u32, gate: Option<Arc<Gate>>) {
    let pidfd = parent_pidfd(parent);
    std::thread::spawn(move || {
        loop {
            let (readable, parent_ended) = wait(&ctrl, pidfd.as_ref());
            if parent_ended || parent_gone(parent) {
                STOPPING.store(true, Ordering::SeqCst);
                exit(EXIT_ORPHAN);
            }
            if !readable {
                continue;
            }
            match ctrl.recv_msg(Some(Duration::ZERO)) {
                Ok(Msg {
                    kind: Kind::Stop, ..
                }) => {
                    // Deliberate; the parent wants no word from us.
                    STOPPING.store(true, Ordering::SeqCst);
                    exit(EXIT_STOPPED);
                }
                Ok(Msg {
                    kind: Kind::Credit,
                    value,
                    ..
                }) => {
                    if let Some(g) = &gate {
                        g.raise(value);
                    }
                }
                // Anything else after `GO` is unexpected: taken off and dropped.
                Ok(_) | Err(CtrlError::Timeout) => {}
                Err(CtrlError::Eof) => {
                    STOPPING.store(true, Ordering::SeqCst);
                    exit(if parent_gone(parent) {
                        EXIT_ORPHAN
                    } else {
                        EXIT_STOPPED
                    });
                }
                Err(CtrlError::Other(m) | CtrlError::Failed(m)) => {
                    log(&format!("control socket: {m}"));
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    });
}
