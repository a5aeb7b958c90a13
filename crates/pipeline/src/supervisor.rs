//! The parent's view of its children: each child's process and control socket
//! ([`ChildProc`]), the state the parent's threads share ([`Shared`]: the children and the
//! first failure), and the supervisor thread that reaps them and records unexpected deaths.
//! Starting a child is [`process::spawn`](crate::process::spawn).

use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Error;
use crate::handover::{Ctrl, Kind};
use crate::node::{self, Role};

/// One child as the parent sees it.
#[derive(Debug)]
pub(crate) struct ChildProc {
    pub role: Role,
    pub child: Child,
    pub status: Option<ExitStatus>,
    /// The parent's end of the child's control socket.
    pub ctrl: Ctrl,
    /// The code the child said it exits with (`EXIT` on its control socket), once read.
    pub announced: Option<i32>,
}

impl ChildProc {
    /// Reads what is left on the control socket of a child that has exited, for its `EXIT`
    /// message (only an exited child's: while it runs, the start-up hand-over and the
    /// consumer's grants use the socket).
    fn read_announcement(&mut self) {
        for m in self.ctrl.left_by_ended_peer() {
            if m.kind == Kind::Exit {
                self.announced = i32::try_from(m.value).ok();
            }
        }
    }

    /// Whether the child ended as the pipeline ended it: its exit code is the one it
    /// announced (a step or a library that calls `exit` announces nothing).
    fn ended_by_the_pipeline(&self, st: &ExitStatus) -> bool {
        st.code().is_some() && st.code() == self.announced
    }
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

/// How a child ended, for an error message; `ours`: it announced its exit code (see
/// [`ChildProc::ended_by_the_pipeline`]).
pub(crate) fn describe_status(st: &ExitStatus, ours: bool) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) if !ours => format!(
            "exited with code {c} on its own (not as the pipeline ends a child: a step, a \
             library or the program called exit)"
        ),
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
                c.read_announcement();
                let ours = c.ended_by_the_pipeline(&st);
                let code = st.code().filter(|_| ours);
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
                    status: describe_status(&st, ours),
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
            // A child whose socket is gone has ended already and needs no STOP.
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
