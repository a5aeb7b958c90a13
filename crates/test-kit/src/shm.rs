//! `/dev/shm` entries: a guard that removes a test's entries and a lister for leak checks.

use std::collections::BTreeSet;
use std::path::Path;

const DEV_SHM: &str = "/dev/shm";

/// Which entries of `/dev/shm` a [`ShmGuard`] owns.
#[derive(Debug)]
enum Owned {
    /// These exact entry names.
    Names(Vec<String>),
    /// Every entry whose name contains this string.
    Containing(String),
}

/// Removes a test's `/dev/shm` entries when dropped, so a failing (panicking) test still
/// leaves nothing behind. [`assert_gone`](Self::assert_gone) is the "nothing leaked" check of a
/// test that passes.
///
/// ```
/// let g = shmpipe_test_kit::ShmGuard::new(["shmpipe-doc-test-entry"]);
/// g.assert_gone();
/// ```
#[derive(Debug)]
pub struct ShmGuard(Owned);

impl ShmGuard {
    /// Owns the entries with exactly these names (file names in `/dev/shm`, prefix included).
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(entries: I) -> ShmGuard {
        ShmGuard(Owned::Names(entries.into_iter().map(Into::into).collect()))
    }

    /// Owns every entry whose name contains `needle` (e.g. a pipeline's id). The needle must be
    /// unique to the test: another test's entries that contain it would be removed too.
    pub fn containing(needle: impl Into<String>) -> ShmGuard {
        ShmGuard(Owned::Containing(needle.into()))
    }

    /// The owned entries that exist now.
    pub fn present(&self) -> BTreeSet<String> {
        match &self.0 {
            Owned::Names(names) => names
                .iter()
                .filter(|n| Path::new(DEV_SHM).join(n).symlink_metadata().is_ok())
                .cloned()
                .collect(),
            Owned::Containing(needle) => shm_entries(needle),
        }
    }

    /// Panics if any owned entry exists (the code under test should have removed it).
    pub fn assert_gone(&self) {
        let left = self.present();
        assert!(left.is_empty(), "leaked in /dev/shm: {left:?}");
    }
}

impl Drop for ShmGuard {
    fn drop(&mut self) {
        for n in self.present() {
            let p = Path::new(DEV_SHM).join(&n);
            // A test may leave a directory named like a segment; remove it too.
            if std::fs::remove_file(&p).is_err() {
                let _ = std::fs::remove_dir(&p);
            }
        }
    }
}

/// Names of the `/dev/shm` entries that contain `needle` (all entries for `""`).
pub fn shm_entries(needle: &str) -> BTreeSet<String> {
    std::fs::read_dir(DEV_SHM)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(needle))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_removes_its_entries_on_drop_and_leaves_others() {
        let mine = crate::unique_name("kit-shm-mine");
        let other = crate::unique_name("kit-shm-other");
        for n in [&mine, &other] {
            std::fs::write(Path::new(DEV_SHM).join(n), b"x").unwrap();
        }
        let _other = ShmGuard::new([other.clone()]);
        {
            let g = ShmGuard::new([mine.clone()]);
            assert_eq!(g.present().len(), 1);
            assert!(std::panic::catch_unwind(|| g.assert_gone()).is_err());
        }
        assert!(shm_entries(&mine).is_empty());
        assert_eq!(shm_entries(&other).len(), 1);
    }

    #[test]
    fn containing_guard_removes_every_match_even_on_panic() {
        let id = crate::unique_name("kit-shm-pipe");
        for suffix in ["a", "b"] {
            std::fs::write(Path::new(DEV_SHM).join(format!("x-{id}-{suffix}")), b"").unwrap();
        }
        let r = std::panic::catch_unwind(|| {
            let _g = ShmGuard::containing(id.clone());
            panic!("a failing test");
        });
        assert!(r.is_err());
        assert!(shm_entries(&id).is_empty());
    }
}
