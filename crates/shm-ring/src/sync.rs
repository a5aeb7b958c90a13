//! Atomics used by the lock-free structures, swapped for loom's under `cfg(loom)`.
//!
//! Every structure that is placed in shared memory takes its atomics from here, so the
//! loom models in `tests/loom.rs` exercise the same code that runs across processes.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Spin hint for busy waits (a no-op yield to the loom scheduler under loom).
#[inline]
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
