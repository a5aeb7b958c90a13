//! Where independent processes find a named channel: a Unix socket per name in a directory
//! only the user can enter, served by the channel's [`Sender`](crate::Sender).
//!
//! A named channel is the same sealed memfd as an anonymous one; its name is only the way to
//! get the descriptor. The creating sender binds a `SOCK_SEQPACKET` socket at
//! `<socket directory>/<name>` and serves it from a thread: every connection of an allowed
//! user (`SO_PEERCRED`) gets one message, a 16-byte greeting and the memfd (`SCM_RIGHTS`),
//! sent without waiting, and is closed. An opener connects, checks who serves
//! (`SO_PEERCRED`: an allowed user, and the pid the channel's header names as creator),
//! receives exactly that message (close-on-exec, bounded in time and size, anything else
//! refused), and maps the descriptor through the same checks as [`Receiver::from_fd`]
//! (a regular memfd with the three seals, a valid header).
//!
//! Nothing is ever created in `/dev/shm`, so nothing there can be squatted, truncated
//! (`SIGBUS`) or leaked, and a channel is not bounded by that mount's size.
//!
//! **The socket directory** (`dir.rs`), first of:
//! 1. [`Rendezvous::dir`] (a [`ChannelConfig`](crate::ChannelConfig) setting);
//! 2. the environment variable `SHMPIPE_DIR` (containers that share a volume);
//! 3. `$XDG_RUNTIME_DIR/shmpipe` (the user's private runtime directory), if that is a
//!    directory of ours nobody else may write (`sudo` may leave another user's there);
//! 4. for root, `/run/shmpipe` (only root may create entries in `/run`);
//! 5. `/tmp/shmpipe-<uid>`.
//!
//! A creator makes it if missing (mode 0700); both ends open it without following a symlink
//! and refuse it, with an error naming path, owner and mode, unless it is a directory owned by
//! the user with no permission for others (and none for its group, unless
//! [`Rendezvous::peer_uid`] allows another user in and the group is the primary group of one
//! of the two users). Sockets are made 0600 (0666 with a peer user: connecting needs write
//! permission; the directory admits only the two users).
//!
//! **Names** change only under an exclusive `flock` of the directory, held for microseconds:
//! a create probes an existing socket and takes the name only if nobody serves it (a stale
//! socket: nobody listens, or the process that listened is dead and a forked child of it
//! holds a copy that never answers); an opener that finds a stale socket removes it and reports
//! the channel as not created yet; a consumer that sees its producer die removes the
//! producer's socket if it is stale; a sender removes its own socket when dropped, after its
//! linger. Nothing that is not a socket is ever removed.
//!
//! [`Receiver::from_fd`]: crate::Receiver::from_fd

mod client;
mod dir;
mod server;

use std::path::Path;

pub(crate) use client::{Served, fetch};
pub(crate) use dir::SocketDir;
pub(crate) use server::NameServer;

use crate::error::Error;

pub(crate) use crate::sys::dir::DIR_ENV;

/// The greeting every answer of a name server starts with (and, with the descriptor, is):
/// it names the protocol and its version.
pub(crate) const HELLO: [u8; 16] = *b"shmpipe-name-v1\0";

/// How long an opener waits for the answer of a server it connected to. A live server
/// answers in microseconds; this bound is for one that accepted and hangs (a forked child
/// holding a dead creator's socket, or a hostile one).
pub(crate) const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a name change waits for the socket directory's lock.
pub(crate) const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Where named channels meet, and who may meet there. Part of [`ChannelConfig`](crate::ChannelConfig)
/// (creators) and given to [`Receiver::open_in`](crate::Receiver::open_in) (openers); both ends
/// must agree on the directory.
///
/// # Examples
/// ```
/// use shm_ring::{ChannelConfig, Message, Receiver, Rendezvous, Sender};
/// let dir = std::env::temp_dir().join(format!("doc-rdv-{}", std::process::id()));
/// let rdv = Rendezvous { dir: Some(Box::leak(dir.clone().into_boxed_path())), ..Rendezvous::default() };
/// let tx = Sender::<Message>::create("doc-chan", &ChannelConfig { rendezvous: rdv, ..ChannelConfig::default() })?;
/// let rx = Receiver::<Message>::open_in(&rdv, "doc-chan", None)?;
/// # drop((rx, tx));
/// # std::fs::remove_dir(&dir).unwrap();
/// # Ok::<(), shm_ring::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rendezvous {
    /// The socket directory; `None` (the default): `$SHMPIPE_DIR`, else
    /// `$XDG_RUNTIME_DIR/shmpipe`, else `/run/shmpipe` for root, else `/tmp/shmpipe-<uid>`.
    /// Made (0700) by the first creator if missing.
    pub dir: Option<&'static Path>,
    /// One more user accepted as a peer, besides our own (containers that share a volume and
    /// a pid namespace but run as different users; a server whose pid our namespace cannot see
    /// is refused): servers answer it, openers accept its servers, sockets are
    /// made connectable by it (0666: the directory is the gate), and the directory may then
    /// grant its group access (`chmod 0770`) if that group is the primary group of one of the
    /// two users (any other group could let a third user replace our sockets; every member of
    /// the group can enter, so use a group of those two users only). Default `None`: only our
    /// own user.
    pub peer_uid: Option<u32>,
}

impl Rendezvous {
    /// The environment variable that overrides the socket directory of named channels (when
    /// [`Rendezvous::dir`] is not set): `SHMPIPE_DIR`.
    pub const DIR_ENV: &str = DIR_ENV;

    /// Longest channel name: `bind`/`connect` take paths of at most 107 bytes, and names are
    /// reached as `/proc/self/fd/<dir>/<name>` (at most 25 bytes before the name).
    pub const MAX_NAME: usize = MAX_NAME;

    /// Whether `uid` may be at the other end of a named channel.
    pub(crate) fn allows(&self, uid: u32) -> bool {
        uid == crate::sys::euid() || self.peer_uid == Some(uid)
    }
}

#[cfg(feature = "unstable-internals")]
/// The descriptor a name's server hands out, without opening the channel: for tests that play
/// a hostile process of the same user. Not a stable API.
///
/// # Errors
/// As [`Receiver::open`](crate::Receiver::open) before the descriptor is checked.
#[doc(hidden)]
pub fn fetch_descriptor(rdv: &Rendezvous, name: &str) -> Result<std::os::fd::OwnedFd, Error> {
    fetch(rdv, name, std::time::Instant::now() + ANSWER_TIMEOUT).map(|f| f.fd)
}

/// Longest channel name (see [`Rendezvous::MAX_NAME`]).
pub(crate) const MAX_NAME: usize = 80;

/// Checks a channel name: 1 to [`MAX_NAME`] characters from `[A-Za-z0-9._-]`, not starting
/// with '.'.
pub(crate) fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "channel name {name:?}: use 1-{MAX_NAME} characters from [A-Za-z0-9._-], not \
             starting with '.'"
        )))
    }
}
