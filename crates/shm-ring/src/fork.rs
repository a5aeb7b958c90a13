//! Handles are not fork-safe: which process a handle belongs to, and how a forked child's use
//! of an inherited one is refused.
//!
//! `fork()` copies every handle of the parent into the child, and with it the parent's share
//! of the channel: its leases of pool blocks, its claim as the one consumer, its place as the
//! one producer. If the child acted on those copies, its drop of an inherited [`Message`]
//! would hand the parent's block back to the producer (which reuses it while the parent still
//! reads it), its drop of a `Receiver` would close the parent's channel, and its sends would
//! make a second producer on a single-producer ring, unseen by the consumer, which watches
//! the creator's pid. So every handle remembers the process that made it, and in any other
//! process:
//! - drops do nothing to the channel (no block handed back, no close flag, no name removed);
//!   the child's copy of the mapping goes with the child;
//! - sends, loans, receives and the producer's consumer checks fail with
//!   [`Error::Forked`](crate::Error::Forked).
//!
//! What a forked child may do: read the messages, arrays and loans it inherited while the
//! parent keeps them (the parent's lease covers them), and `exec` or exit. To use a channel in
//! a child, open it there (by name, or from a descriptor the parent passes), or create one.
//!
//! A fork is noticed through `pthread_atfork`, registered when the first handle is made: the
//! child handler bumps a process-wide counter, so the check on the hot paths is one load and
//! one compare. The crate's one process-wide lock (the registry of this process's receivers)
//! is taken before every fork and released after it on both sides, so a child forked while
//! another thread opened or dropped a receiver can still open channels (a lock copied held by
//! a thread that does not exist in the child would block it for ever). Forks done behind the C library's back (a raw `clone` system call) are not
//! seen; the handle-level drops also compare the pid itself.
//!
//! [`Message`]: crate::Message

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

use crate::error::Error;
use crate::sys;

/// Forks this process has gone through since the program started (its own and its
/// ancestors'): bumped in the child of every `fork()`.
static FORKS: AtomicU32 = AtomicU32::new(0);
static WATCH: Once = Once::new();

/// Channels (device, inode of their memfd) that have a live `Receiver` in this process.
static OWN_RECEIVERS: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The registry's lock, held.
type Held = MutexGuard<'static, Vec<(u64, u64)>>;

thread_local! {
    /// The registry's lock, held by the forking thread from just before a `fork()` to just
    /// after it, in the parent and in the child.
    static HELD_ACROSS_FORK: RefCell<Option<Held>> =
        const { RefCell::new(None) };
}

/// Whether the channel `ident` has a live receiver in this process, after adding it
/// (`Some(true)`) or removing one (`Some(false)`).
pub(crate) fn own_receiver(ident: (u64, u64), add: Option<bool>) -> bool {
    let Ok(mut v) = OWN_RECEIVERS.lock() else {
        return false;
    };
    match add {
        Some(true) => v.push(ident),
        Some(false) => {
            if let Some(i) = v.iter().position(|&x| x == ident) {
                v.swap_remove(i);
            }
        }
        None => {}
    }
    v.contains(&ident)
}

/// Runs in the parent just before every `fork()`: takes the registry's lock, so that no other
/// thread holds it while the process is copied.
extern "C" fn before_fork() {
    let guard = OWN_RECEIVERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // A thread whose thread-locals are being destroyed forks without the lock.
    let _ = HELD_ACROSS_FORK.try_with(|h| *h.borrow_mut() = Some(guard));
}

/// Runs in the parent just after every `fork()`: releases the registry's lock.
extern "C" fn after_fork_in_parent() {
    let _ = HELD_ACROSS_FORK.try_with(|h| drop(h.borrow_mut().take()));
}

/// Runs in the child of every `fork()` (async-signal-safe: an atomic add, and the release of a
/// futex lock held by this very thread): the inherited receivers are the parent's, so the
/// child's registry starts empty (clearing pairs of integers frees nothing).
extern "C" fn forked() {
    FORKS.fetch_add(1, Ordering::Relaxed);
    let _ = HELD_ACROSS_FORK.try_with(|h| {
        if let Some(mut guard) = h.borrow_mut().take() {
            guard.clear();
        }
    });
}

/// A gate no process holds (its fork count would need 2^32 - 1 forks in one line of
/// descent).
pub(crate) const CLOSED_GATE: u32 = u32::MAX;

/// The process a handle was made in. Public so that crates whose handles wrap ours (the
/// pipeline's `Pipeline`, the Python bindings' handles) notice forks the same way, through the
/// one `pthread_atfork` registration.
///
/// # Examples
/// ```
/// let me = shm_ring::Owner::current();
/// assert!(me.is_current() && me.is_current_strict());
/// assert_eq!(me.pid(), std::process::id());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    forks: u32,
    pid: u32,
}

impl Owner {
    /// The calling process.
    pub fn current() -> Owner {
        WATCH.call_once(|| sys::on_fork(before_fork, after_fork_in_parent, forked));
        Owner {
            forks: FORKS.load(Ordering::Relaxed),
            pid: sys::pid(),
        }
    }

    /// Whether the calling process is the owner (one load and one compare: for hot paths).
    #[inline]
    pub fn is_current(&self) -> bool {
        FORKS.load(Ordering::Relaxed) == self.forks
    }

    /// [`Owner::is_current`], and the pid too (a system call: for drops of whole handles).
    pub fn is_current_strict(&self) -> bool {
        self.is_current() && sys::pid() == self.pid
    }

    /// The owner's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A token that [`Owner::holds`] in the owner's process only: a handle may keep it in a
    /// field and overwrite it with [`CLOSED_GATE`] when it closes, so that one compare on a hot
    /// path says both "our process" and "still open".
    pub(crate) fn gate(&self) -> u32 {
        self.forks
    }

    /// Whether `gate` (from [`Owner::gate`]) belongs to the calling process.
    #[inline]
    pub(crate) fn holds(gate: u32) -> bool {
        FORKS.load(Ordering::Relaxed) == gate
    }

    /// `Err(Error::Forked)` unless the calling process is the owner.
    #[inline]
    pub(crate) fn check(&self) -> Result<(), Error> {
        if self.is_current() {
            Ok(())
        } else {
            Err(self.refusal())
        }
    }

    /// The error a process other than the owner gets.
    #[cold]
    pub(crate) fn refusal(&self) -> Error {
        Error::Forked {
            owner: self.pid,
            caller: sys::pid(),
        }
    }
}
