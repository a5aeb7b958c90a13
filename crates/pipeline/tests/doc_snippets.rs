//! Every Rust block of README.md and docs/*.md is a doc test: each Markdown file with a
//! ```` ```rust ```` block must be included (`#[doc = include_str!(..)]` under a
//! `cfg(doctest)`) by the `lib.rs` of a crate that can compile it, and no block may opt out
//! with `ignore` (a sketch is a ```` ```text ```` block). `cargo test --workspace --doc` then
//! compiles and runs them all.

use std::path::{Path, PathBuf};

/// Files whose Rust blocks are not doc tests yet, with the reason. Each entry must still be
/// missing its holder: the test fails once it is included, so the list only shrinks.
const PENDING: &[(&str, &str)] = &[];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and docs/*.md, relative to the workspace root.
fn markdown_files() -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    for e in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let name = e
            .expect("dir entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".md") {
            files.push(format!("docs/{name}"));
        }
    }
    files.sort();
    files
}

/// The info strings of the ```` ```rust ```` fences of a Markdown text.
fn rust_fences(text: &str) -> Vec<String> {
    let mut fences = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim_start();
        let Some(info) = t.strip_prefix("```") else {
            continue;
        };
        if inside {
            // Only a bare fence closes a block (CommonMark).
            inside = !info.trim().is_empty();
        } else {
            if info == "rust" || info.starts_with("rust,") {
                fences.push(info.to_string());
            }
            inside = true;
        }
    }
    fences
}

/// The `lib.rs` files of the workspace's crates, with their text.
fn crate_roots() -> Vec<(PathBuf, String)> {
    let mut roots = Vec::new();
    for e in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let lib = e.expect("dir entry").path().join("src/lib.rs");
        if let Ok(text) = std::fs::read_to_string(&lib) {
            roots.push((lib, text));
        }
    }
    roots
}

#[test]
fn every_rust_block_of_the_docs_is_a_doc_test() {
    let roots = crate_roots();
    let mut missing = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(root().join(&file)).expect("read markdown");
        let fences = rust_fences(&text);
        for info in &fences {
            assert!(
                !info.split(',').any(|a| a == "ignore"),
                "{file}: a ```{info} block: mark a sketch ```text (not compiled) instead"
            );
        }
        let include = format!("include_str!(\"../../../{file}\")");
        let held = roots
            .iter()
            .any(|(_, text)| text.contains(&include) && text.contains("doctest"));
        let pending = PENDING.iter().any(|(f, _)| *f == file);
        if pending {
            assert!(
                !held,
                "{file} is a doc test now: remove it from PENDING in {}",
                file!()
            );
        } else if !fences.is_empty() && !held {
            missing.push(file);
        }
    }
    assert!(
        missing.is_empty(),
        "Rust blocks that no test compiles, in {missing:?}: add to the lib.rs of a crate that \
         can build them `#[cfg(doctest)] #[doc = include_str!(\"../../../<file>\")] struct X;`"
    );
}

#[test]
fn fence_parser_sees_rust_blocks_only() {
    let md = "```rust\nlet a = 1;\n```\n```text\n```rust\n```\n```rust,no_run\nfn main() {}\n```\n";
    assert_eq!(rust_fences(md), ["rust", "rust,no_run"]);
    assert!(rust_fences("```sh\ncargo test\n```\n").is_empty());
}
