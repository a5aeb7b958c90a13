//! Test helpers shared by the shmpipe crates' tests (a dev-dependency only; never
//! published): `shmpipe-test-kit = { path = "../test-kit" }` under `[dev-dependencies]`.
//! Helpers that know one crate (shm-ring's peer binary, the pipeline tests' registry) stay in
//! that crate's `tests/common/mod.rs`; anything two crates need lives here, once.
//!
//! Cross-process tests must clean up after themselves even when an assertion fails, and must
//! pass when run in parallel. The pieces here make that the easy way:
//!
//! - [`EntryGuard`] removes the entries a test may leave in a directory (on drop, so also on
//!   panic: the sockets of named channels, say), [`ShmGuard`] those in `/dev/shm`;
//!   [`entries_of`] and [`shm_entries`] list them for "nothing leaked" checks.
//! - [`KillOnDrop`] SIGKILLs processes by pid on drop; [`ChildGuard`] kills and reaps a
//!   [`std::process::Child`] on drop; [`gone`] and [`wait_gone`] are the "no stray process"
//!   checks.
//! - [`TempFile`] and [`TempDir`] are unique temporary paths removed on drop.
//! - [`proc`] reads `/proc`: a process's stat fields (state, parent, CPU ticks), its fd links,
//!   environment and command line, and the processes matching one of them.
//! - [`in_small_dev_shm`] runs a script in a private mount namespace with a 16 MB tmpfs on
//!   `/dev/shm` (a small container's); [`as_nobody`] runs a child as user `nobody`. Both need
//!   root: check [`is_root`] first and skip with a message otherwise.
//! - [`rerun_test`] starts a test of this binary again as a helper process; [`within`] turns
//!   a hang into a failure.

mod entries;
mod env;
pub mod proc;
mod process;
mod temp;

pub use entries::{EntryGuard, ShmGuard, entries_of, shm_entries};
pub use env::{NOBODY, as_nobody, in_small_dev_shm, is_root, small_dev_shm_command};
pub use process::{ChildGuard, KillOnDrop, gone, rerun_test, signal, wait_gone, within};
pub use temp::{TempDir, TempFile};

use std::sync::atomic::{AtomicU32, Ordering};

/// `<tag>-<pid>-<n>`, unique to this process and call, so tests running in parallel (threads
/// of one test binary, or several binaries) never share a name.
pub fn unique_name(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn unique_names_differ_and_carry_tag_and_pid() {
        let a = super::unique_name("x");
        let b = super::unique_name("x");
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("x-{}-", std::process::id())), "{a}");
    }
}
