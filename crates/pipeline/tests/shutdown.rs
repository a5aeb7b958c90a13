//! Ending a pipeline: SIGTERM on its parent, a deliberate drop mid-stream, and what children
//! say on stderr (only real problems, with their role and pid).

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use rustix::process::Signal;
use shmpipe::{Epochs, Pipeline, Topology};

/// Issue 12: SIGTERM (what `timeout` and supervisors send) on a pipeline's parent: its
/// children exit and nothing is left in `/dev/shm` (the parent's own channels leaked).
#[test]
fn sigterm_on_the_parent_leaves_no_child_and_nothing_in_dev_shm() {
    let reg = registry();
    if init_or_run_helper(&reg) {
        return;
    }
    for mode in ["enqueue", "source"] {
        let mut h = Helper::start_with(
            "sigterm_on_the_parent_leaves_no_child_and_nothing_in_dev_shm",
            mode,
        );
        std::thread::sleep(Duration::from_millis(100));
        signal(h.child.id(), Signal::TERM);
        let t0 = Instant::now();
        let status = h.child.wait().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(3), "{mode}: {status}");
        assert!(
            wait_gone(&h.pids, Duration::from_secs(2)).is_some(),
            "{mode}: children outlived the parent"
        );
        let left = shm_entries(&h.id);
        assert!(left.is_empty(), "{mode}: left {left:?}");
    }
}

/// In a helper: drops running pipelines mid-stream, then prints DONE.
fn helper_drop_mid_stream() {
    let reg = registry();
    for topo in [Topology::Fused, Topology::Staged { workers: vec![] }] {
        for _ in 0..3 {
            let mut p = Pipeline::builder(&reg)
                .source_named("range", serde_json::json!({"n": 50, "len": 4}))
                .epochs(Epochs::Cycle)
                .step("inc")
                .step("inc")
                .topology(topo.clone())
                .workers(2)
                .batch_bytes(256)
                .start()
                .unwrap();
            for _ in 0..200 {
                p.dequeue().unwrap().unwrap();
            }
            drop(p);
        }
    }
    // Children that outlive the drop would still write: give them a moment.
    std::thread::sleep(Duration::from_millis(300));
    println!("DONE");
}

/// Issue 12: dropping a pipeline mid-stream is a deliberate shutdown: no child prints
/// "connection closed" (or anything else) on stderr.
#[test]
fn dropping_a_pipeline_mid_stream_is_silent() {
    let reg = registry();
    shmpipe::init(&reg);
    if helper_mode().is_some() {
        return helper_drop_mid_stream();
    }
    let mut cmd = helper_command("dropping_a_pipeline_mid_stream_is_silent", "drop");
    let out = cmd.stderr(Stdio::piped()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("DONE"), "{stdout}\n{stderr}");
    let noise: Vec<&str> = stderr.lines().filter(|l| l.contains("shmpipe")).collect();
    assert!(noise.is_empty(), "stderr noise: {noise:?}");
}

/// In a helper: a staged pipeline whose second-stage worker 0 is SIGKILLed.
fn helper_kill_stage1() {
    let reg = registry();
    let mut p = Pipeline::builder(&reg)
        .source_named("range", serde_json::json!({"n": 50, "len": 4}))
        .epochs(Epochs::Cycle)
        .step("inc")
        .step("inc")
        .topology(Topology::Staged { workers: vec![] })
        .workers(2)
        .batch_bytes(256)
        .start()
        .unwrap();
    print_ready(&p);
    for _ in 0..100 {
        p.dequeue().unwrap().unwrap();
    }
    // Emitter, stage 0 (2 workers), stage 1 (2 workers).
    signal(p.pids()[3], Signal::KILL);
    // The stage-0 workers find their peer dead when they next send to it.
    std::thread::sleep(Duration::from_millis(500));
    let e = p.by_ref().find_map(Result::err);
    // Let the upstream children notice and log.
    std::thread::sleep(Duration::from_millis(300));
    println!("ERROR {e:?}");
}

/// Issue 12: a real problem in a child (here: its downstream peer was SIGKILLed) is logged
/// with the child's role and pid.
#[test]
fn a_child_that_loses_a_peer_says_who_it_is() {
    let reg = registry();
    shmpipe::init(&reg);
    if helper_mode().is_some() {
        return helper_kill_stage1();
    }
    let mut cmd = helper_command("a_child_that_loses_a_peer_says_who_it_is", "kill");
    cmd.stderr(Stdio::piped());
    let mut h = Helper::spawn(cmd);
    let mut stderr = h.child.stderr.take().unwrap();
    let mut rest = String::new();
    h.out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    stderr.read_to_string(&mut err).unwrap();
    assert!(rest.contains("ERROR Some(ProcessDied"), "{rest}");
    // Stage-0 workers or the emitter lost their peer: each such line names role and pid.
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("shmpipe")).collect();
    for l in &lines {
        let named = ["emitter", "worker"].iter().any(|r| l.contains(r)) && l.contains("(pid ");
        assert!(named, "unnamed child message: {l:?}\n{err}");
    }
    assert!(!lines.is_empty(), "nobody reported the lost peer: {err}");
    let pids_named = lines
        .iter()
        .filter(|l| h.pids.iter().any(|p| l.contains(&format!("pid {p}"))))
        .count();
    assert_eq!(pids_named, lines.len(), "{err}");
}
