//! The README's two-process quick start, as written: its two blocks are the examples
//! `quickstart_send` (A) and `quickstart_recv` (B) verbatim, and they work as two real processes
//! in either start order; B alone says what it waited for and fails with a readable error.
#![cfg(not(loom))]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{Peer, name_guard, named, unique};

const EXAMPLES: [&str; 2] = ["quickstart_send", "quickstart_recv"];

fn read(path: &str) -> String {
    let full = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("cannot read {full}: {e}"))
}

#[test]
fn readme_quick_start_blocks_are_the_examples_verbatim() {
    let readme = read("../../README.md");
    for ex in EXAMPLES {
        let code = read(&format!("examples/{ex}.rs"));
        let block = format!("```rust,no_run\n{code}```\n");
        assert!(
            readme.contains(&block),
            "README.md must show crates/shm-ring/examples/{ex}.rs verbatim in a ```rust,no_run \
             block (copy the file into the README, or the README block into the file)"
        );
    }
}

/// The example binaries, built once per test process by the same cargo: a no-op after
/// `cargo nextest run --workspace` or `cargo test --workspace` (`--workspace` keeps the
/// features of that build), and needed when only this test target was built.
fn example(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        // .../target/<profile>/deps/quickstart-<hash> -> .../target/<profile>
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "--workspace"]);
        for ex in EXAMPLES {
            cmd.args(["--example", ex]);
        }
        if profile_dir.ends_with("release") {
            cmd.arg("--release");
        }
        let status = cmd
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo");
        assert!(status.success(), "building the quick-start examples failed");
        profile_dir.join("examples")
    });
    dir.join(name)
}

fn spawn(ex: &str, name: &str) -> Peer {
    Peer::spawn_cmd(Command::new(example(ex)).arg(name))
}

const LIMIT: Duration = Duration::from_secs(30);
const B_GOT: &str = "B: got frame-1, shape [1000, 1000], x[999, 999] = 999999";

fn assert_b_got_the_frame(b: Peer) {
    let (ok, out, err) = b.finish(LIMIT);
    assert!(ok, "B failed: {err}");
    assert_eq!(
        out.trim().lines().last(),
        Some(B_GOT),
        "B's output; stderr: {err}"
    );
}

#[test]
fn quick_start_a_then_b() {
    let (name, guard) = named("qs-ab");
    let mut a = spawn("quickstart_send", &name);
    // A has sent and now waits for B (with nothing to wait for, the line would say so).
    let line = a.line();
    assert!(
        line.starts_with("A: sent frame-1; waiting up to 10s for B to open"),
        "A printed {line:?}"
    );
    std::thread::sleep(Duration::from_millis(200));
    let mut b = spawn("quickstart_recv", &name);
    assert!(b.line().starts_with("B: waiting up to 10 s for A"));
    assert_b_got_the_frame(b);
    let (ok, out, err) = a.finish(LIMIT);
    assert!(ok && out.is_empty(), "A: {out} {err}");
    guard.assert_gone();
}

#[test]
fn quick_start_b_then_a() {
    let (name, guard) = named("qs-ba");
    let mut b = spawn("quickstart_recv", &name);
    assert_eq!(
        b.line(),
        format!("B: waiting up to 10 s for A to create '{name}'")
    );
    std::thread::sleep(Duration::from_millis(300));
    let a = spawn("quickstart_send", &name);
    assert_b_got_the_frame(b);
    let (ok, _, err) = a.finish(LIMIT);
    assert!(ok, "A failed: {err}");
    guard.assert_gone();
}

#[test]
fn quick_start_both_at_once() {
    let (name, guard) = named("qs-both");
    let a = spawn("quickstart_send", &name);
    let b = spawn("quickstart_recv", &name);
    assert_b_got_the_frame(b);
    let (ok, _, err) = a.finish(LIMIT);
    assert!(ok, "A failed: {err}");
    guard.assert_gone();
}

#[test]
fn b_without_a_gives_up_after_10_s_with_a_readable_error() {
    let name = unique("qs-b-alone");
    let _guard = name_guard(&[&name]);
    let exe = example("quickstart_recv"); // built before the clock starts
    let t0 = Instant::now();
    let b = Peer::spawn_cmd(Command::new(exe).arg(&name));
    let (ok, out, err) = b.finish(LIMIT);
    let waited = t0.elapsed();
    assert!(!ok, "B succeeded without A: {out}");
    assert!(out.starts_with("B: waiting up to 10 s for A"), "{out}");
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(25),
        "B gave up after {waited:?}"
    );
    // Display, not Debug: names the channel and what to do, no `NotFound("...")`.
    assert!(
        err.starts_with(&format!("B: no channel named '{name}'")),
        "B's stderr: {err}"
    );
    assert!(!err.contains("NotFound("), "Debug form on stderr: {err}");
}
