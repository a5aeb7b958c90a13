//! Descriptors a pipeline hands to its children: [`PipelineBuilder::share_fd`] takes a sealed
//! memfd (a dataset, a pickled source) and returns a [`SharedFd`] handle to put in the
//! arguments of steps or of the source; each child receives the descriptors that its own
//! arguments name, through its control socket at start (`SCM_RIGHTS`, before anything else
//! happens on it), checks them, and keeps them until it exits.
//!
//! A descriptor is never named by number: a number means something else in another process,
//! or in the same process a moment later (issue 16, hole 3: workers opened
//! `/proc/<parent>/fd/<n>` after the parent had dropped that dataset and made another one with
//! the same number). Nor by position in a list: a handle was once an index into its builder's
//! list, and a handle of another builder silently named that builder's descriptor of the same
//! index (issue 16 review, finding 6). A handle is a random 64-bit token that `share_fd` draws
//! for that one descriptor: a builder (and the clones made of it after the share, which hold
//! the same descriptor) finds it in its list; any other builder refuses it at `start()`. Only
//! the pipeline's control sockets carry the descriptors.
//!
//! What may be shared: a memfd sealed `F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW |
//! F_SEAL_SEAL`, so its bytes and size can never change and a child can validate them once
//! and map them without fear of SIGBUS. The parent keeps a read-only reopening of it (a new
//! open file description of the same file, checked by device and inode), close-on-exec; the
//! children receive that, close-on-exec, and refuse anything that is not such a file.
//!
//! [`PipelineBuilder::share_fd`]: crate::PipelineBuilder::share_fd

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

use rustix::fs::{Mode, OFlags, SealFlags};
use serde::{Deserialize, Serialize};

/// The key of a handle's JSON object in step and source arguments.
const HANDLE_KEY: &str = "shmpipe_shared_fd";

/// Seals a shared descriptor must carry: its bytes and size never change again.
pub(crate) const SEALS: SealFlags = SealFlags::WRITE
    .union(SealFlags::SHRINK)
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// A descriptor shared with a pipeline's children, from
/// [`PipelineBuilder::share_fd`](crate::PipelineBuilder::share_fd). Put it in the arguments
/// of a step or of the source (it serializes as `{"shmpipe_shared_fd": <token>}`, a random
/// number drawn for that descriptor: a handle works only with the builder that made it, and
/// with clones of that builder made after it; any other refuses it at `start()`); the step
/// or source factory gets the descriptor with
/// [`StepContext::shared_fd`](crate::StepContext::shared_fd) or
/// [`SourceContext::shared_fd`](crate::SourceContext::shared_fd). A child receives exactly
/// the descriptors named by its own arguments (an emitter: the source's; a worker: its
/// stage's steps').
///
/// # Examples
/// ```
/// use std::os::fd::AsFd;
/// let reg = shmpipe::Registry::new();
/// let fd = rustix::fs::memfd_create("data", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
/// rustix::io::write(&fd, b"some bytes").unwrap();
/// use rustix::fs::SealFlags;
/// rustix::fs::fcntl_add_seals(&fd, SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
///     .unwrap();
/// let mut b = shmpipe::Pipeline::builder(&reg);
/// let h = b.share_fd(fd.as_fd()).unwrap();
/// let args = serde_json::json!({"data": h});
/// assert_eq!(shmpipe::SharedFd::from_arg(&args["data"]), Some(h));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SharedFd {
    #[serde(rename = "shmpipe_shared_fd")]
    token: u64,
}

impl SharedFd {
    /// A handle with a new random token (from the kernel's random source).
    pub(crate) fn draw() -> Result<SharedFd, String> {
        let mut b = [0u8; 8];
        let mut got = 0;
        while got < b.len() {
            // SAFETY: getrandom writes at most `len` bytes to the buffer it is given, which is
            // the unfilled rest of `b`.
            let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(format!("getrandom: {e}"));
                }
                continue;
            }
            got += n as usize;
        }
        Ok(SharedFd {
            token: u64::from_le_bytes(b),
        })
    }

    pub(crate) fn token(self) -> u64 {
        self.token
    }

    /// The handle in an argument value (`args["store"]`), if it is one.
    pub fn from_arg(v: &serde_json::Value) -> Option<SharedFd> {
        let o = v.as_object().filter(|o| o.len() == 1)?;
        let token = o.get(HANDLE_KEY)?.as_u64()?;
        Some(SharedFd { token })
    }

    /// In a pipeline child: the descriptor this handle names, checked on receipt (a sealed
    /// memfd, opened read-only). It stays open until the child exits. Errors: in a process
    /// that is not a pipeline child, or when this child did not receive the descriptor (its
    /// arguments did not name it).
    pub(crate) fn fd(self) -> Result<BorrowedFd<'static>, String> {
        let Some(got) = RECEIVED.get() else {
            return Err(format!(
                "shared descriptor {:016x} is only available in a pipeline's children",
                self.token
            ));
        };
        got.iter()
            .find(|(t, _)| *t == self.token)
            .map(|(_, fd)| fd.as_fd())
            .ok_or_else(|| {
                format!(
                    "shared descriptor {:016x} was not handed to this process (a child \
                     receives the descriptors named in its own step or source arguments)",
                    self.token
                )
            })
    }
}

/// Looks up the handle at `args[key]` and returns its descriptor (see [`SharedFd::fd`]).
pub(crate) fn from_args(
    args: &serde_json::Value,
    key: &str,
) -> Result<BorrowedFd<'static>, String> {
    SharedFd::from_arg(&args[key])
        .ok_or_else(|| format!("argument {key:?} is not a shared descriptor handle"))?
        .fd()
}

/// Checks that `fd` is what a pipeline shares: a memfd sealed against writes, shrinking,
/// growing and further sealing, and (with `read_only`) opened read-only.
pub(crate) fn check(fd: BorrowedFd<'_>, read_only: bool) -> Result<(), String> {
    let st = rustix::fs::fstat(fd).map_err(|e| format!("fstat: {e}"))?;
    if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() {
        return Err("not a memfd (not a regular file)".into());
    }
    // Only shared-memory files (memfds) have seals; any other file fails here.
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|_| "not a memfd (no seals)")?;
    if !seals.contains(SEALS) {
        return Err(format!(
            "a memfd without all of F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL \
             (it has {seals:?}): its bytes or size could still change"
        ));
    }
    if read_only {
        let fl = rustix::fs::fcntl_getfl(fd).map_err(|e| format!("F_GETFL: {e}"))?;
        if fl & OFlags::RWMODE != OFlags::RDONLY {
            return Err("opened for writing, expected read-only".into());
        }
    }
    Ok(())
}

/// A read-only, close-on-exec reopening of the sealed memfd `fd` (a new open file description
/// of the same file), for the pipeline to keep and hand out.
pub(crate) fn read_only_copy(fd: BorrowedFd<'_>) -> Result<OwnedFd, String> {
    check(fd, false)?;
    // Our own descriptor, borrowed for this whole call: the number cannot change meaning.
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let ro = rustix::fs::open(
        path.as_str(),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("reopening it read-only through {path}: {e}"))?;
    let (a, b) = (
        rustix::fs::fstat(fd).map_err(|e| format!("fstat: {e}"))?,
        rustix::fs::fstat(&ro).map_err(|e| format!("fstat: {e}"))?,
    );
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
        return Err(format!("{path} reopened another file"));
    }
    check(ro.as_fd(), true)?;
    Ok(ro)
}

/// Adds to `out` the token of every handle inside `v`.
pub(crate) fn handles_in(v: &serde_json::Value, out: &mut Vec<u64>) {
    if let Some(h) = SharedFd::from_arg(v) {
        out.push(h.token());
        return;
    }
    match v {
        serde_json::Value::Array(a) => a.iter().for_each(|v| handles_in(v, out)),
        serde_json::Value::Object(o) => o.values().for_each(|v| handles_in(v, out)),
        _ => {}
    }
}

/// The descriptors this child received, by handle token (set once, at start; never closed
/// before the process exits, hence the `'static` borrows of [`SharedFd::fd`]).
static RECEIVED: OnceLock<Vec<(u64, OwnedFd)>> = OnceLock::new();

/// In a child: checks the descriptors received for `tokens` and keeps them.
pub(crate) fn install(tokens: &[u64], fds: Vec<OwnedFd>) -> Result<(), String> {
    if fds.len() != tokens.len() {
        return Err(format!(
            "expected {} shared descriptors, got {}",
            tokens.len(),
            fds.len()
        ));
    }
    for (t, fd) in tokens.iter().zip(&fds) {
        check(fd.as_fd(), true).map_err(|e| format!("shared descriptor {t:016x}: {e}"))?;
    }
    RECEIVED
        .set(tokens.iter().copied().zip(fds).collect())
        .map_err(|_| "shared descriptors received twice".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::MemfdFlags;

    fn memfd(seals: SealFlags) -> OwnedFd {
        let fd =
            rustix::fs::memfd_create("t", MemfdFlags::ALLOW_SEALING | MemfdFlags::CLOEXEC).unwrap();
        rustix::io::write(&fd, b"0123456789").unwrap();
        rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
        fd
    }

    #[test]
    fn only_fully_sealed_memfds_are_shared_and_copies_are_read_only() {
        let good = memfd(SEALS);
        assert!(
            check(good.as_fd(), true).is_err(),
            "memfds are opened read-write"
        );
        let ro = read_only_copy(good.as_fd()).unwrap();
        check(ro.as_fd(), true).unwrap();
        let flags = rustix::io::fcntl_getfd(&ro).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        assert!(
            rustix::io::write(&ro, b"x").is_err(),
            "written through a copy"
        );
        for seals in [
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
            SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW,
        ] {
            let e = read_only_copy(memfd(seals).as_fd()).unwrap_err();
            assert!(e.contains("F_SEAL_WRITE"), "{e}");
        }
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(
            read_only_copy(file.as_fd())
                .unwrap_err()
                .contains("not a memfd")
        );
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(
            read_only_copy(a.as_fd())
                .unwrap_err()
                .contains("not a memfd")
        );
    }

    #[test]
    fn handles_are_found_anywhere_in_arguments() {
        let (a, b) = (SharedFd::draw().unwrap(), SharedFd::draw().unwrap());
        assert_ne!(a, b, "two draws of 64 random bits");
        let args = serde_json::json!({"x": 1, "store": a, "more": [{"deep": b}, "s"]});
        let mut got = Vec::new();
        handles_in(&args, &mut got);
        got.sort_unstable();
        let mut want = vec![a.token(), b.token()];
        want.sort_unstable();
        assert_eq!(got, want);
        assert_eq!(SharedFd::from_arg(&args["store"]), Some(a));
        assert_eq!(
            SharedFd::from_arg(&serde_json::json!({"shmpipe_shared_fd": -1})),
            None
        );
        assert_eq!(SharedFd::from_arg(&serde_json::json!(3)), None);
        // Not a child: nothing was received.
        assert!(a.fd().unwrap_err().contains("only available"));
    }

    /// A child refuses, before keeping anything, a descriptor that is not a read-only sealed
    /// memfd (whatever came on its control socket).
    #[test]
    fn a_child_refuses_what_is_not_a_read_only_sealed_memfd() {
        let writable = memfd(SEALS);
        let e = install(&[7], vec![writable]).unwrap_err();
        assert!(
            e.contains("shared descriptor 0000000000000007") && e.contains("read-only"),
            "{e}"
        );
        let unsealed = memfd(SealFlags::SEAL);
        assert!(install(&[1], vec![unsealed]).is_err());
        assert!(install(&[0, 1], vec![]).is_err());
        assert!(RECEIVED.get().is_none(), "kept a refused descriptor");
    }
}
