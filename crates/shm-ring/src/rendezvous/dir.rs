//! The socket directory of named channels: which one, made 0700 if missing, and refused
//! unless it is a directory of ours that others cannot enter.

use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use super::{DIR_ENV, LOCK_TIMEOUT, Rendezvous};
use crate::error::Error;
use crate::sys::{self, dir};

/// Where the directory's path came from (for error messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Setting,
    Env,
    Xdg,
    Run,
    Tmp,
}

impl Origin {
    fn describe(self) -> &'static str {
        match self {
            Origin::Setting => "set by Rendezvous::dir",
            Origin::Env => "set by $SHMPIPE_DIR",
            Origin::Xdg => "under $XDG_RUNTIME_DIR",
            Origin::Run => "root's default",
            Origin::Tmp => "the default without $XDG_RUNTIME_DIR",
        }
    }
}

/// An open, checked socket directory.
#[derive(Debug)]
pub(crate) struct SocketDir {
    path: PathBuf,
    fd: OwnedFd,
    rdv: Rendezvous,
}

impl Rendezvous {
    /// The socket directory this configuration points to (it may not exist yet): the first of
    /// [`Rendezvous::dir`], `$SHMPIPE_DIR`, `$XDG_RUNTIME_DIR/shmpipe`, `/run/shmpipe` for root,
    /// `/tmp/shmpipe-<uid>`.
    pub fn socket_dir(&self) -> PathBuf {
        resolve(self).0
    }
}

/// Where the socket directory is, by the rules of the module doc.
fn resolve(rdv: &Rendezvous) -> (PathBuf, Origin) {
    if let Some(d) = rdv.dir {
        return (d.to_path_buf(), Origin::Setting);
    }
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env(DIR_ENV) {
        return (d, Origin::Env);
    }
    // Only our own runtime directory: one of another user (`sudo` may leave theirs in the
    // environment) lets that user move the socket directory we make in it.
    if let Some(x) = env("XDG_RUNTIME_DIR").filter(|x| x.is_absolute() && ours_only(x)) {
        return (x.join("shmpipe"), Origin::Xdg);
    }
    let uid = sys::euid();
    if uid == 0 && root_only("/run") {
        return (PathBuf::from("/run/shmpipe"), Origin::Run);
    }
    (PathBuf::from(format!("/tmp/shmpipe-{uid}")), Origin::Tmp)
}

/// Whether `gid` may have access to a socket directory shared with user `peer`: it is our
/// primary group or the peer's (a user without an entry in the user database: the group of
/// the same number). Any other group could admit a third user, who could then replace our
/// sockets.
fn pair_group(peer: u32, gid: u32) -> bool {
    gid == sys::egid() || sys::primary_gid(peer).unwrap_or(peer) == gid
}

/// Whether `path` is a directory of ours that nobody else may write (not followed).
fn ours_only(path: &Path) -> bool {
    dir::lstat(path).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
            && st.st_uid == sys::euid()
            && st.st_mode & 0o022 == 0
    })
}

/// Whether `path` is a directory of root that nobody else may write.
fn root_only(path: &str) -> bool {
    dir::lstat(Path::new(path)).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
            && st.st_uid == 0
            && st.st_mode & 0o022 == 0
    })
}

impl SocketDir {
    /// Opens (and, with `create`, first makes) the socket directory of `rdv`, and checks it.
    /// `Ok(None)`: it does not exist and `create` is false (nothing was ever created there).
    ///
    /// # Errors
    /// [`Error::Untrusted`] for a symlink, a non-directory, a directory of another user or one
    /// others may enter; [`Error::Os`] if it cannot be made or opened.
    pub(crate) fn open(rdv: &Rendezvous, create: bool) -> Result<Option<SocketDir>, Error> {
        let (given, origin) = resolve(rdv);
        // Without a trailing '/' or '/.' (with them, `O_NOFOLLOW` would follow a symlink in
        // the last component) and ending in a name (not `..`, not `/`).
        let path: PathBuf = given.components().collect();
        if !matches!(path.components().next_back(), Some(Component::Normal(_))) {
            return Err(Error::InvalidArgument(format!(
                "the socket directory of named channels {} ({}) must end in a directory name",
                given.display(),
                origin.describe()
            )));
        }
        let shown = path.display();
        if create {
            dir::make_private_dir(&path).map_err(|e| {
                Error::Os(std::io::Error::new(
                    std::io::Error::from(e).kind(),
                    format!(
                        "cannot make the socket directory {shown} of named channels ({}): {e}; \
                         set ${DIR_ENV} to a directory of yours",
                        origin.describe()
                    ),
                ))
            })?;
        }
        let fd = match dir::open_dir(&path) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) if !create => return Ok(None),
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                let what = dir::lstat(&path).map_or("not a directory", |st| dir::kind_of(&st));
                return Err(Error::Untrusted(format!(
                    "the socket directory of named channels {shown} ({}) is {what}; refusing \
                     to use it: remove it, or set ${DIR_ENV} to a directory of yours",
                    origin.describe()
                )));
            }
            Err(e) => {
                return Err(Error::Os(std::io::Error::new(
                    std::io::Error::from(e).kind(),
                    format!("cannot open the socket directory {shown}: {e}"),
                )));
            }
        };
        let st = dir::fstat(&fd)?;
        let owner_ok = st.st_uid == sys::euid() || rdv.peer_uid == Some(st.st_uid);
        let others = if rdv.peer_uid.is_some() { 0o007 } else { 0o077 };
        let group_ok =
            st.st_mode & 0o070 == 0 || rdv.peer_uid.is_some_and(|p| pair_group(p, st.st_gid));
        if !owner_ok || st.st_mode & others != 0 || !group_ok {
            return Err(Error::Untrusted(format!(
                "the socket directory of named channels {shown} ({}) is owned by uid {}, group \
                 {}, with mode {:04o}; refusing to use it: only a directory owned by uid {} with \
                 no permissions for {} is trusted (another user may have made it first: remove \
                 it, or set ${DIR_ENV} to a directory of yours)",
                origin.describe(),
                st.st_uid,
                st.st_gid,
                st.st_mode & 0o7777,
                sys::euid(),
                match rdv.peer_uid {
                    Some(p) => format!(
                        "others, nor for a group other than the primary group of uid {} or of \
                         uid {p}",
                        sys::euid()
                    ),
                    None => "group or others".to_string(),
                },
            )));
        }
        Ok(Some(SocketDir {
            path,
            fd,
            rdv: *rdv,
        }))
    }

    /// The directory's path, as resolved (for messages).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Who may be at the other end.
    pub(crate) fn rendezvous(&self) -> &Rendezvous {
        &self.rdv
    }

    /// The path `bind`/`connect` use for `name` (through this open directory).
    pub(crate) fn socket_path(&self, name: &str) -> String {
        dir::path_in(&self.fd, name)
    }

    /// The stat of the entry `name`, if there is one (not followed).
    pub(crate) fn entry(&self, name: &str) -> Option<rustix::fs::Stat> {
        dir::entry(&self.fd, name)
    }

    /// Takes the directory's lock (every change of a name happens under it), waiting up to
    /// [`LOCK_TIMEOUT`].
    ///
    /// # Errors
    /// [`Error::Os`] if another process of this user held it all that time.
    pub(crate) fn lock(&self) -> Result<dir::DirLock<'_>, Error> {
        self.lock_within(LOCK_TIMEOUT)
    }

    /// [`SocketDir::lock`], waiting up to `wait` (a best-effort clean-up waits less than a
    /// create).
    pub(crate) fn lock_within(&self, wait: Duration) -> Result<dir::DirLock<'_>, Error> {
        dir::lock(&self.fd, Instant::now() + wait).map_err(|e| {
            Error::Os(std::io::Error::other(format!(
                "the socket directory {} stayed locked for {wait:?} (another process of this \
                 user holds an flock on it): {e}",
                self.path.display()
            )))
        })
    }

    /// Makes the socket `name` just bound by us connectable by exactly the users the
    /// directory admits: ours only (0600), or, with [`Rendezvous::peer_uid`], the directory's
    /// users (0666: connecting needs write permission, and the socket's group is ours, not the
    /// peer's; the directory and `SO_PEERCRED` keep everyone else out).
    pub(crate) fn set_socket_mode(&self, name: &str) -> Result<(), Error> {
        let mode = if self.rdv.peer_uid.is_some() {
            0o666
        } else {
            0o600
        };
        dir::chmod_entry(&self.fd, name, mode).map_err(Error::from)
    }

    /// Removes the entry `name` if it is still the socket `ident` (device, inode). The caller
    /// holds the lock.
    pub(crate) fn remove_if(&self, name: &str, ident: (u64, u64)) -> bool {
        self.entry(name)
            .is_some_and(|st| dir::is_socket(&st) && (st.st_dev, st.st_ino) == ident)
            && dir::unlink(&self.fd, name).is_ok()
    }
}
