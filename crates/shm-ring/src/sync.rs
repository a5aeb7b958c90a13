//! Atomics used by the lock-free structures, swapped for loom's under `cfg(loom)`.
//!
//! Every structure that is placed in shared memory takes its atomics from here, so the
//! loom models in `tests/loom.rs` exercise the same code that runs across processes.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering, fence};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

/// Spin hint for busy waits (a no-op yield to the loom scheduler under loom).
#[inline]
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// The loom model of a futex: one mutex and condition variable for every word (wake-ups are
/// broadcast; a sleeper re-checks its condition anyway, as with the real futex). Like the
/// kernel's, the check "does the word still hold `expected`?" and the sleep happen under the
/// lock that `futex_wake_all` takes, so a wake after the check is never lost; a wake before
/// the check finds the word moved.
#[cfg(loom)]
mod futex {
    use loom::sync::{Condvar, Mutex};

    use super::{AtomicU32, Ordering};

    loom::lazy_static! {
        static ref FUTEX: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }

    /// Sleeps while `*word == expected`, until a [`futex_wake_all`] (no timeout: a lost wake-up
    /// is a deadlock, which loom reports).
    pub fn futex_wait(word: &AtomicU32, expected: u32) {
        let guard = FUTEX.0.lock().unwrap();
        // The kernel reads the word with a full barrier, under its bucket lock.
        if word.load(Ordering::SeqCst) != expected {
            return;
        }
        drop(FUTEX.1.wait(guard).unwrap());
    }

    /// Wakes every sleeper.
    pub fn futex_wake_all(_word: &AtomicU32) {
        let _guard = FUTEX.0.lock().unwrap();
        FUTEX.1.notify_all();
    }
}

#[cfg(loom)]
pub use futex::{futex_wait, futex_wake_all};
