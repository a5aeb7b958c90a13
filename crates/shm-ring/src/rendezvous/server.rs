//! The creator's side of a name: binding the socket (taking over a stale one), and the
//! thread that hands the channel's memfd to every allowed connector.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use super::client::{Probe, probe};
use super::{HELLO, SocketDir, check_name};
use crate::error::Error;
use crate::fork::Owner;
use crate::sys::{dir, socket};

/// Connections the kernel queues for the server thread.
const BACKLOG: i32 = 64;

/// A channel name being served: its socket and the thread that answers on it. Dropping it
/// stops the thread and removes the socket (if it still is ours), in the process that made
/// it only.
#[derive(Debug)]
pub(crate) struct NameServer {
    dir: SocketDir,
    name: String,
    /// Device and inode of our socket file: only this one is ever removed.
    ident: (u64, u64),
    /// The listening socket until [`NameServer::serve`] hands it to the thread.
    listener: Option<OwnedFd>,
    /// Dropping this write end wakes the thread (end of file on its read end) to stop.
    stop: Option<OwnedFd>,
    /// The serving thread; it hands the listening socket back when it stops, so that the
    /// name is removed before the socket closes.
    thread: Option<std::thread::JoinHandle<OwnedFd>>,
    owner: Owner,
}

impl NameServer {
    /// Binds the socket of `name` in `dir`: fails with [`Error::AlreadyExists`] if a live
    /// server listens there, takes the name over if its socket is stale, and never touches
    /// anything at that name that is not a socket ([`Error::Untrusted`]). Connections queue
    /// until [`NameServer::serve`].
    pub(crate) fn bind(dir: SocketDir, name: &str) -> Result<NameServer, Error> {
        check_name(name)?;
        let (listener, ident) = {
            let _lock = dir.lock()?;
            if let Some(st) = dir.entry(name) {
                let path = dir.path().join(name);
                if !dir::is_socket(&st) {
                    return Err(Error::Untrusted(format!(
                        "{} is {}, not the socket of a channel; refusing to create channel \
                         '{name}' over it: remove it or pick another name",
                        path.display(),
                        dir::kind_of(&st)
                    )));
                }
                match probe(&dir, name) {
                    Probe::Live => return Err(Error::AlreadyExists(name.to_string())),
                    Probe::Stale => {
                        dir.remove_if(name, (st.st_dev, st.st_ino));
                    }
                    Probe::Gone => {}
                }
            }
            let listener =
                socket::listen_at(&dir.socket_path(name), BACKLOG).map_err(|e| match e {
                    rustix::io::Errno::ADDRINUSE => Error::AlreadyExists(name.to_string()),
                    e => Error::from(e),
                })?;
            // Still under the lock: the entry is the socket we just bound.
            let ident = dir
                .entry(name)
                .map(|st| (st.st_dev, st.st_ino))
                .unwrap_or_default();
            if let Err(e) = dir.set_socket_mode(name) {
                dir.remove_if(name, ident);
                return Err(e);
            }
            (listener, ident)
        };
        Ok(NameServer {
            dir,
            name: name.to_string(),
            ident,
            listener: Some(listener),
            stop: None,
            thread: None,
            owner: Owner::current(),
        })
    }

    /// The channel name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Starts answering: every connector of an allowed user gets the greeting and `memfd`.
    ///
    /// # Errors
    /// [`Error::Os`] if the thread or its wake-up pipe cannot be made.
    pub(crate) fn serve(&mut self, memfd: OwnedFd) -> Result<(), Error> {
        let Some(listener) = self.listener.take() else {
            return Ok(());
        };
        let (wake, stop) = socket::wake_pipe()?;
        let rdv = *self.dir.rendezvous();
        let thread = std::thread::Builder::new()
            .name("shm-ring-name".into())
            .spawn(move || {
                serve_loop(&listener, &wake, &memfd, |uid| rdv.allows(uid));
                listener
            })?;
        self.stop = Some(stop);
        self.thread = Some(thread);
        Ok(())
    }
}

/// Answers connections until the stop pipe's write end is dropped. Never blocks on a
/// connector: accepts without waiting, checks its user, sends one message without waiting and
/// closes. Wakes at least once a second.
fn serve_loop(listener: &OwnedFd, wake: &OwnedFd, memfd: &OwnedFd, allows: impl Fn(u32) -> bool) {
    loop {
        let deadline = Instant::now() + Duration::from_secs(1);
        match socket::wait_any(&[wake.as_fd(), listener.as_fd()], deadline) {
            Ok(Some(0)) => return, // stop
            Ok(_) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
        loop {
            let conn = match socket::accept(listener) {
                Ok(Some(c)) => c,
                Ok(None) => break,
                // Out of descriptors (EMFILE/ENFILE): leave them queued, try again shortly.
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            };
            // Only allowed users get the descriptor; anyone else is closed on at once.
            if socket::peer(&conn).is_ok_and(|(_, uid)| allows(uid)) {
                let _ = socket::send_fd(&conn, &HELLO, memfd.as_fd());
            }
        }
    }
}

impl Drop for NameServer {
    fn drop(&mut self) {
        if !self.owner.is_current_strict() {
            // A forked child's copy: the thread is the parent's (and does not exist here), the
            // name is the parent's. Close our copies of the descriptors only.
            if let Some(t) = self.thread.take() {
                std::mem::forget(t);
            }
            return;
        }
        drop(self.stop.take()); // end of file on the thread's wake-up pipe
        if let Some(t) = self.thread.take() {
            // A panicked thread closed the socket already (nothing in it panics).
            self.listener = t.join().ok();
        }
        // The name first, then the socket: an opener whose connection the close resets finds
        // the name gone (or another creator's socket) and reports the channel not found.
        if let Ok(_lock) = self.dir.lock() {
            self.dir.remove_if(&self.name, self.ident);
        }
        drop(self.listener.take());
    }
}
