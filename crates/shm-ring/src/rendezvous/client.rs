//! The opener's side of a name: connecting, checking who serves, receiving the channel's
//! descriptor, and removing the sockets of dead creators.

use std::os::fd::OwnedFd;
use std::time::Instant;

use super::{HELLO, Rendezvous, SocketDir, check_name};
use crate::error::Error;
use crate::sys::{PeerProcess, dir, socket};

/// How long an opener whose server hung up without answering waits to see it die (a live
/// server that refuses us costs the opener this much before its error).
const DYING: std::time::Duration = std::time::Duration::from_millis(200);

/// A descriptor received for a name, with who served it and where.
#[derive(Debug)]
pub(crate) struct Fetched {
    /// The channel's memfd (close-on-exec), not yet checked.
    pub fd: OwnedFd,
    /// The serving process, as the kernel recorded it when it listened.
    pub server_pid: u32,
    /// The name, for [`Served::remove_if_stale`] once the creator is gone.
    pub served: Served,
}

/// Where a channel was found by name: enough to remove its socket once its creator is dead.
#[derive(Debug)]
pub(crate) struct Served {
    dir: SocketDir,
    name: String,
    /// Device and inode of the socket we connected to.
    ident: (u64, u64),
}

impl Served {
    /// Removes the socket we connected to if nobody listens on it any more (its creator died
    /// without removing it), under the directory's lock. Anything else is left alone.
    pub(crate) fn remove_if_stale(&self) {
        let _ = remove_if_stale(&self.dir, &self.name, self.ident);
    }
}

impl Rendezvous {
    /// Removes the socket of channel `name` if nobody serves it any more (its creator died
    /// without removing it), and says whether it did. Opens and creates do this on their own;
    /// this is for a program that knows it will not open that name again (a harness cleaning
    /// up after a killed producer). Anything that is not a stale socket is left alone.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name, [`Error::Untrusted`] for a socket directory
    /// we do not trust.
    #[cfg(feature = "unstable-internals")]
    #[doc(hidden)]
    pub fn remove_stale(&self, name: &str) -> Result<bool, Error> {
        check_name(name)?;
        let Some(dir) = SocketDir::open(self, false)? else {
            return Ok(false);
        };
        let Some(st) = dir.entry(name).filter(dir::is_socket) else {
            return Ok(false);
        };
        Ok(remove_if_stale(&dir, name, (st.st_dev, st.st_ino)))
    }
}

/// How long a clean-up of another process's stale socket waits for the directory's lock (it is
/// best effort: the next open or create of the name cleans up too).
const CLEANUP_LOCK: std::time::Duration = std::time::Duration::from_millis(100);

/// What a probe of an existing socket found.
pub(super) enum Probe {
    /// Nobody serves it: nobody listens there (its creator is gone), or the process that
    /// listened is dead (a forked child of the creator holds a copy of the socket and never
    /// answers).
    Stale,
    /// A live listener (or one whose backlog is full).
    Live,
    /// Not there any more.
    Gone,
}

/// Connects to the socket of `name` to see whether anyone serves it.
pub(super) fn probe(dir: &SocketDir, name: &str) -> Probe {
    match socket::connect_at(&dir.socket_path(name)) {
        Err(rustix::io::Errno::CONNREFUSED) => Probe::Stale,
        Err(rustix::io::Errno::NOENT) => Probe::Gone,
        Ok(conn) if listener_dead(&conn) => Probe::Stale,
        _ => Probe::Live,
    }
}

/// Whether the process that listens at the other end of `conn` (the kernel records it at
/// `listen`) is definitely dead. A copy of the socket inherited by a `fork()` keeps accepting
/// connections after its creator died, and nobody answers them.
fn listener_dead(conn: &OwnedFd) -> bool {
    socket::peer(conn).is_ok_and(|(pid, _)| pid != 0 && PeerProcess::watch(pid, 0).is_dead())
}

fn remove_if_stale(dir: &SocketDir, name: &str, ident: (u64, u64)) -> bool {
    let Ok(_lock) = dir.lock_within(CLEANUP_LOCK) else {
        return false;
    };
    let same = dir
        .entry(name)
        .is_some_and(|st| dir::is_socket(&st) && (st.st_dev, st.st_ino) == ident);
    same && matches!(probe(dir, name), Probe::Stale) && dir.remove_if(name, ident)
}

/// Gets the descriptor of channel `name` from its server, waiting for the answer until
/// `deadline` at most.
///
/// # Errors
/// [`Error::NotFound`] when no directory, no socket, or a stale socket (which is removed) is
/// there; [`Error::Untrusted`] for a socket directory, an entry or a server we do not trust;
/// [`Error::NotASegment`] for a malformed answer (everything it carried is closed);
/// [`Error::Timeout`] when the server accepted but did not answer in time.
pub(crate) fn fetch(rdv: &Rendezvous, name: &str, deadline: Instant) -> Result<Fetched, Error> {
    check_name(name)?;
    let Some(dir) = SocketDir::open(rdv, false)? else {
        return Err(Error::NotFound(name.to_string()));
    };
    let ident = socket_of(&dir, name)?;
    let conn = connect(&dir, name, ident, deadline)?;
    let server_pid = check_server(rdv, &dir, name, ident, &conn)?;
    let fd = receive_unless_gone(&dir, name, ident, &conn, server_pid, deadline)?;
    Ok(Fetched {
        fd,
        server_pid,
        served: Served {
            dir,
            name: name.to_string(),
            ident,
        },
    })
}

/// Device and inode of the socket of `name` in `dir`: [`Error::NotFound`] if there is none,
/// [`Error::Untrusted`] if the entry is not a socket.
fn socket_of(dir: &SocketDir, name: &str) -> Result<(u64, u64), Error> {
    let Some(st) = dir.entry(name) else {
        return Err(Error::NotFound(name.to_string()));
    };
    if !dir::is_socket(&st) {
        return Err(Error::Untrusted(format!(
            "{} is {}, not the socket of a channel; refusing to open it",
            dir.path().join(name).display(),
            dir::kind_of(&st)
        )));
    }
    Ok((st.st_dev, st.st_ino))
}

/// Connects to the socket of `name` (device and inode `ident`), retrying while the server's
/// queue is full until `deadline`. Nobody listening: the socket is removed, and
/// [`Error::NotFound`].
fn connect(
    dir: &SocketDir,
    name: &str,
    ident: (u64, u64),
    deadline: Instant,
) -> Result<OwnedFd, Error> {
    loop {
        match socket::connect_at(&dir.socket_path(name)) {
            Ok(c) => return Ok(c),
            Err(rustix::io::Errno::CONNREFUSED) => {
                // Nobody listens: its creator died without removing it.
                let _ = remove_if_stale(dir, name, ident);
                return Err(Error::NotFound(name.to_string()));
            }
            Err(rustix::io::Errno::NOENT) => return Err(Error::NotFound(name.to_string())),
            // The server's queue is full: it is busy answering; try again shortly.
            Err(rustix::io::Errno::AGAIN) if Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(rustix::io::Errno::AGAIN) => return Err(Error::Timeout),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The pid of the process serving `conn`, once it is trusted (its uid allowed, its pid seen
/// from here) and alive. A dead server (a forked child holds the socket of its dead creator):
/// the socket is removed, and [`Error::NotFound`].
fn check_server(
    rdv: &Rendezvous,
    dir: &SocketDir,
    name: &str,
    ident: (u64, u64),
    conn: &OwnedFd,
) -> Result<u32, Error> {
    let path = dir.path().join(name);
    let (server_pid, uid) = socket::peer(conn)?;
    if !rdv.allows(uid) {
        return Err(Error::Untrusted(format!(
            "channel '{name}' at {} is served by uid {uid} (pid {server_pid}); refusing it: only \
             uid {} is trusted (see Rendezvous::peer_uid)",
            path.display(),
            crate::sys::euid()
        )));
    }
    if server_pid == 0 {
        return Err(Error::Untrusted(format!(
            "channel '{name}' at {} is served by a process in a pid namespace this one cannot \
             see: a named channel needs both processes in one pid namespace (its liveness \
             checks name processes by pid); pass the channel's descriptor instead \
             (Receiver::from_fd)",
            path.display()
        )));
    }
    if PeerProcess::watch(server_pid, 0).is_dead() {
        // Its creator is dead and a forked child holds the socket: nobody will answer.
        let _ = remove_if_stale(dir, name, ident);
        return Err(Error::NotFound(name.to_string()));
    }
    Ok(server_pid)
}

/// [`receive`]s the answer of `server_pid`; a hang-up without a word from a server that is
/// gone (its socket left the name, or it is dying) is [`Error::NotFound`], not a malformed
/// answer.
fn receive_unless_gone(
    dir: &SocketDir,
    name: &str,
    ident: (u64, u64),
    conn: &OwnedFd,
    server_pid: u32,
    deadline: Instant,
) -> Result<OwnedFd, Error> {
    match receive(conn, name, server_pid, deadline) {
        // It hung up without a word after its socket left the name: a sender dropped while we
        // connected (it unlinks its socket before it closes it), so the channel is gone.
        Err(Error::NotASegment(_))
            if dir
                .entry(name)
                .is_none_or(|st| (st.st_dev, st.st_ino) != ident) =>
        {
            Err(Error::NotFound(name.to_string()))
        }
        // It hung up without a word: if it is dying (killed between our connect and its
        // answer: its descriptors close before it is a zombie), the channel is gone, as for a
        // stale socket.
        Err(Error::NotASegment(_))
            if crate::sys::PeerProcess::watch(server_pid, 0).wait_dead(DYING) =>
        {
            let _ = remove_if_stale(dir, name, ident);
            Err(Error::NotFound(name.to_string()))
        }
        r => r,
    }
}

/// Receives the one answer: exactly [`HELLO`] and one descriptor, nothing truncated.
fn receive(conn: &OwnedFd, name: &str, pid: u32, deadline: Instant) -> Result<OwnedFd, Error> {
    let malformed = |why: String| {
        Error::NotASegment(format!(
            "the process serving channel '{name}' (pid {pid}) answered {why}: it is not a \
             shm-ring Sender of this version (build both processes against the same \
             shm-ring), or it is not a channel at all"
        ))
    };
    let mut buf = [0u8; HELLO.len() + 1];
    let got = match socket::recv_fds(conn, &mut buf, deadline) {
        Ok(g) => g,
        Err(rustix::io::Errno::TIMEDOUT) => return Err(Error::Timeout),
        Err(rustix::io::Errno::CONNRESET) => {
            return Err(malformed("by closing the connection".into()));
        }
        Err(e) => return Err(e.into()),
    };
    // Every descriptor received is owned by `got` and closed if we return early.
    if got.bytes == 0 && got.fds.is_empty() {
        return Err(malformed(
            "nothing and closed the connection (it may refuse our user)".into(),
        ));
    }
    if got.truncated || got.bytes != HELLO.len() || buf[..HELLO.len()] != HELLO {
        return Err(malformed(format!(
            "{} bytes{} that are not the greeting of this version",
            got.bytes,
            if got.truncated { " (truncated)" } else { "" }
        )));
    }
    let mut fds = got.fds;
    if fds.len() != 1 {
        return Err(malformed(format!(
            "with {} descriptors instead of one",
            fds.len()
        )));
    }
    Ok(fds.remove(0))
}
