//! Child processes: `init` (the role switch at the top of `main`), spawning by re-exec of the
//! current executable with its control socket, and the parent's supervisor.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Error;
use crate::handover::{Ctrl, Kind};
use crate::node::{self, ChildSpec, Role};
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
    let spec: ChildSpec = match env.to_str().map(serde_json::from_str) {
        Some(Ok(s)) => s,
        _ => {
            eprintln!("shmpipe: malformed {ROLE_ENV}");
            std::process::exit(node::EXIT_SETUP);
        }
    };
    let Some(ctrl) = inherited_ctrl(spec.ctrl_fd) else {
        eprintln!("shmpipe: no control socket at descriptor {}", spec.ctrl_fd);
        std::process::exit(node::EXIT_SETUP);
    };
    let code = crate::roles::run_child(reg, &spec, ctrl);
    std::process::exit(code);
}

/// Takes the control socket the parent left at descriptor `fd`, if it is a socket, and makes
/// it close-on-exec again (processes this child starts must not hold it: the parent sees this
/// child's death as the end of the socket).
fn inherited_ctrl(fd: i32) -> Option<Ctrl> {
    if fd < 0 {
        return None;
    }
    // SAFETY: the parent put our end of the control socket at this descriptor (cleared its
    // close-on-exec flag in this child only) and nothing else in this process took ownership
    // of it; `init` runs once per process (CHILD_TAKEN). It is checked to be a socket next.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = rustix::fs::fstat(&owned).ok()?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Socket {
        std::mem::forget(owned);
        return None;
    }
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC).ok()?;
    Some(Ctrl::from_fd(owned))
}

/// Whether this process is a pipeline child.
pub(crate) fn is_child() -> bool {
    std::env::var_os(ROLE_ENV).is_some()
}

/// Starts one child, `program` (default: the current executable) with `args`, and `ctrl`, its
/// end of its control socket, as its only inherited descriptor besides the standard ones.
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
    cmd.args(args)
        .env(ROLE_ENV, json)
        .stdin(Stdio::null())
        // Its own process group: Ctrl-C in a terminal reaches the parent only, which then
        // shuts the pipeline down.
        .process_group(0);
    // SAFETY: the closure runs in the forked child of a possibly multithreaded parent, before
    // exec: it only calls fcntl (async-signal-safe, no allocation, no lock) on a descriptor
    // number captured by value; the error path builds an io::Error from a raw code (no
    // allocation).
    unsafe {
        cmd.pre_exec(move || {
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

/// One child as the parent sees it.
#[derive(Debug)]
pub(crate) struct ChildProc {
    pub role: Role,
    pub child: Child,
    pub status: Option<ExitStatus>,
    /// The parent's end of the child's control socket.
    pub ctrl: Ctrl,
}

/// State shared by the parent's threads.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub children: Mutex<Vec<ChildProc>>,
    /// The first unexpected child death (the cause of a failure).
    pub primary: Mutex<Option<Error>>,
    /// A failure that is the consequence of another (a lost peer), or of the feeder thread.
    pub secondary: Mutex<Option<Error>>,
    pub stop: AtomicBool,
}

pub(crate) fn describe_status(st: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(node::EXIT_SETUP), _) => {
            format!(
                "exited with code {} (could not set up its connections; see its stderr)",
                node::EXIT_SETUP
            )
        }
        (Some(node::EXIT_PEER_LOST), _) => {
            format!("exited with code {} (lost a peer)", node::EXIT_PEER_LOST)
        }
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => st.to_string(),
    }
}

impl Shared {
    /// Reaps exited children; records unexpected deaths.
    pub(crate) fn poll_children(&self) {
        let mut kids = self.children.lock().unwrap_or_else(|e| e.into_inner());
        for c in kids.iter_mut().filter(|c| c.status.is_none()) {
            if let Ok(Some(st)) = c.child.try_wait() {
                c.status = Some(st);
                let code = st.code();
                let expected = matches!(
                    code,
                    Some(node::EXIT_OK | node::EXIT_REPORTED | node::EXIT_STOPPED)
                );
                if expected {
                    continue;
                }
                let err = Error::ProcessDied {
                    role: c.role.describe(),
                    pid: c.child.id(),
                    status: describe_status(&st),
                };
                let slot = if code == Some(node::EXIT_PEER_LOST) {
                    &self.secondary
                } else {
                    &self.primary
                };
                let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(err);
            }
        }
    }

    pub(crate) fn take_primary(&self) -> Option<Error> {
        self.primary
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    pub(crate) fn take_secondary(&self) -> Option<Error> {
        self.secondary
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Tells every child that the shutdown is deliberate (they then exit without a word).
    pub(crate) fn announce_stop(&self) {
        let kids = self.children.lock().unwrap_or_else(|e| e.into_inner());
        for c in kids.iter().filter(|c| c.status.is_none()) {
            let _ = c.ctrl.send(Kind::Stop, &[]);
        }
    }

    /// Kills (SIGKILL) and reaps every child still running; waits up to `grace` first.
    pub(crate) fn stop_children(&self, grace: Duration) {
        let deadline = std::time::Instant::now() + grace;
        let mut kids = self.children.lock().unwrap_or_else(|e| e.into_inner());
        for c in kids.iter_mut().filter(|c| c.status.is_none()) {
            while std::time::Instant::now() < deadline {
                if let Ok(Some(st)) = c.child.try_wait() {
                    c.status = Some(st);
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            if c.status.is_none() {
                let _ = c.child.kill();
                c.status = c.child.wait().ok();
            }
        }
    }
}

/// The supervisor thread: polls the children every 10 ms until told to stop.
pub(crate) fn supervise(shared: Arc<Shared>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !shared.stop.load(Ordering::Relaxed) {
            shared.poll_children();
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}
