//! Child processes: `init` (the role switch at the top of `main`), spawning by re-exec of the
//! current executable, the parent's supervisor and the children's parent watchdog.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Error;
use crate::node::{self, ChildSpec, Role};
use crate::step::Registry;
use crate::transport::TransportKind;

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
    start_watchdog(&spec);
    let code = node::run_child(reg, &spec);
    std::process::exit(code);
}

/// Whether this process is a pipeline child.
pub(crate) fn is_child() -> bool {
    std::env::var_os(ROLE_ENV).is_some()
}

/// Exits the child within ~50 ms of its parent's death, unlinking the segments it created.
fn start_watchdog(spec: &ChildSpec) {
    let parent = spec.plan.parent;
    let names = spec.plan.produced_by(spec.role);
    let transport = spec.plan.transport;
    let parent_alive =
        move || rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32) == Some(parent);
    if !parent_alive() {
        std::process::exit(node::EXIT_ORPHAN);
    }
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(50));
            if !parent_alive() {
                if std::env::var_os("SHMPIPE_DEBUG").is_some() {
                    eprintln!(
                        "shmpipe watchdog {}: parent gone, unlinking {names:?}",
                        std::process::id()
                    );
                }
                if transport == TransportKind::Shm {
                    unlink_segments(&names);
                }
                std::process::exit(node::EXIT_ORPHAN);
            }
        }
    });
}

/// Removes the shared-memory segments of these connections (missing ones are fine).
pub(crate) fn unlink_segments(names: &[String]) {
    for n in names {
        let _ = rustix::shm::unlink(format!("/shmpipe-{n}").as_str());
    }
}

/// Starts one child: `program` (default: the current executable) with `args`.
pub(crate) fn spawn(
    spec: &ChildSpec,
    program: Option<&std::path::Path>,
    args: &[String],
) -> Result<Child, Error> {
    use std::os::unix::process::CommandExt;
    let exe = match program {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe().map_err(Error::Spawn)?,
    };
    let json = serde_json::to_string(spec).map_err(|e| Error::Config(e.to_string()))?;
    Command::new(exe)
        .args(args)
        .env(ROLE_ENV, json)
        .stdin(Stdio::null())
        // Its own process group: Ctrl-C in a terminal reaches the parent only, which then
        // shuts the pipeline down.
        .process_group(0)
        .spawn()
        .map_err(Error::Spawn)
}

/// One child as the parent sees it.
#[derive(Debug)]
pub(crate) struct ChildProc {
    pub role: Role,
    pub child: Child,
    pub status: Option<ExitStatus>,
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
                let expected = matches!(code, Some(node::EXIT_OK | node::EXIT_REPORTED));
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
