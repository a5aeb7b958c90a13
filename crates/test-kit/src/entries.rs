//! Entries of a directory a test may leave behind (`/dev/shm`, the socket directory of named
//! channels): a guard that removes a test's entries and a lister for leak checks.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const DEV_SHM: &str = "/dev/shm";

/// Which entries of the directory an [`EntryGuard`] owns.
#[derive(Debug)]
enum Owned {
    /// These exact entry names.
    Names(Vec<String>),
    /// Every entry whose name contains this string.
    Containing(String),
}

/// Removes a test's entries of one directory when dropped, so a failing (panicking) test still
/// leaves nothing behind. [`assert_gone`](Self::assert_gone) is the "nothing leaked" check of
/// a test that passes.
///
/// ```
/// let dir = std::env::temp_dir();
/// let g = shmpipe_test_kit::EntryGuard::new(&dir, ["shmpipe-doc-test-entry"]);
/// g.assert_gone();
/// ```
#[derive(Debug)]
pub struct EntryGuard {
    dir: PathBuf,
    owned: Owned,
}

impl EntryGuard {
    /// Owns the entries of `dir` with exactly these names.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(dir: &Path, entries: I) -> EntryGuard {
        EntryGuard {
            dir: dir.to_path_buf(),
            owned: Owned::Names(entries.into_iter().map(Into::into).collect()),
        }
    }

    /// Owns every entry of `dir` whose name contains `needle` (e.g. a pipeline's id). The
    /// needle must be unique to the test: another test's entries that contain it would be
    /// removed too.
    pub fn containing(dir: &Path, needle: impl Into<String>) -> EntryGuard {
        EntryGuard {
            dir: dir.to_path_buf(),
            owned: Owned::Containing(needle.into()),
        }
    }

    /// The owned entries that exist now.
    pub fn present(&self) -> BTreeSet<String> {
        match &self.owned {
            Owned::Names(names) => names
                .iter()
                .filter(|n| self.dir.join(n).symlink_metadata().is_ok())
                .cloned()
                .collect(),
            Owned::Containing(needle) => entries_of(&self.dir, needle),
        }
    }

    /// Panics if any owned entry exists (the code under test should have removed it).
    pub fn assert_gone(&self) {
        let left = self.present();
        assert!(
            left.is_empty(),
            "leaked in {}: {left:?}",
            self.dir.display()
        );
    }
}

impl Drop for EntryGuard {
    fn drop(&mut self) {
        for n in self.present() {
            let p = self.dir.join(&n);
            // A test may leave a directory named like an entry; remove it too.
            if std::fs::remove_file(&p).is_err() {
                let _ = std::fs::remove_dir(&p);
            }
        }
    }
}

/// An [`EntryGuard`] of `/dev/shm`: the pipelines' and channels' "nothing in `/dev/shm`"
/// checks.
///
/// ```
/// let g = shmpipe_test_kit::ShmGuard::new(["shmpipe-doc-test-entry"]);
/// g.assert_gone();
/// ```
#[derive(Debug)]
pub struct ShmGuard(EntryGuard);

impl ShmGuard {
    /// Owns the `/dev/shm` entries with exactly these names.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(entries: I) -> ShmGuard {
        ShmGuard(EntryGuard::new(Path::new(DEV_SHM), entries))
    }

    /// Owns every `/dev/shm` entry whose name contains `needle` (see
    /// [`EntryGuard::containing`]).
    pub fn containing(needle: impl Into<String>) -> ShmGuard {
        ShmGuard(EntryGuard::containing(Path::new(DEV_SHM), needle))
    }

    /// The owned entries that exist now.
    pub fn present(&self) -> BTreeSet<String> {
        self.0.present()
    }

    /// Panics if any owned entry exists.
    pub fn assert_gone(&self) {
        self.0.assert_gone()
    }
}

/// Names of the `/dev/shm` entries that contain `needle` (all entries for `""`).
pub fn shm_entries(needle: &str) -> BTreeSet<String> {
    entries_of(Path::new(DEV_SHM), needle)
}

/// Names of the entries of `dir` that contain `needle` (nothing if `dir` cannot be read).
pub fn entries_of(dir: &Path, needle: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
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
        let dir = crate::TempDir::new("kit-entries");
        let id = crate::unique_name("kit-pipe");
        for suffix in ["a", "b"] {
            std::fs::write(dir.path().join(format!("x-{id}-{suffix}")), b"").unwrap();
        }
        std::fs::write(dir.path().join("unrelated"), b"").unwrap();
        let d = dir.path().to_path_buf();
        let r = std::panic::catch_unwind(|| {
            let _g = EntryGuard::containing(&d, id.clone());
            panic!("a failing test");
        });
        assert!(r.is_err());
        assert!(entries_of(dir.path(), &id).is_empty());
        assert_eq!(entries_of(dir.path(), "").len(), 1);
    }
}
