//! Temporary files and directories removed on drop (also when the test fails).

use std::path::{Path, PathBuf};

/// A unique path in the temporary directory, `shmpipe-<tag>-<pid>-<n>.<ext>`, removed on drop.
/// The file is not created: the test writes it.
#[derive(Debug)]
pub struct TempFile(pub PathBuf);

impl TempFile {
    /// A new unique path with this tag and extension (`""` for none).
    pub fn new(tag: &str, ext: &str) -> TempFile {
        let mut name = format!("shmpipe-{}", crate::unique_name(tag));
        if !ext.is_empty() {
            name = format!("{name}.{ext}");
        }
        TempFile(std::env::temp_dir().join(name))
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A new unique directory in the temporary directory, removed with its contents on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates `shmpipe-<tag>-<pid>-<n>` in the temporary directory.
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("shmpipe-{}", crate::unique_name(tag)));
        std::fs::create_dir_all(&p).expect("create temporary directory");
        TempDir(p)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_file_and_dir_are_unique_and_removed_on_drop() {
        let (a, b) = (TempFile::new("kit", "jsonl"), TempFile::new("kit", "jsonl"));
        assert_ne!(a.0, b.0);
        assert!(a.0.to_string_lossy().ends_with(".jsonl"));
        std::fs::write(&a.0, b"x").unwrap();
        let d = TempDir::new("kit");
        std::fs::write(d.path().join("f"), b"x").unwrap();
        let (fa, fd) = (a.0.clone(), d.0.clone());
        drop((a, b, d));
        assert!(!fa.exists() && !fd.exists());
    }
}
