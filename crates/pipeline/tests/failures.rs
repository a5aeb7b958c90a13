//! Failure behaviour with real processes and real signals: bad records, step errors and
//! panics, SIGKILLed workers and emitters, a SIGKILLed parent, Ctrl-C. Every case checks that
//! no process and no `/dev/shm` segment of the pipeline survives.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::*;
use rustix::process::{Pid, Signal, kill_process};
use shmpipe::{Error, FieldKind, JsonLines, OnBadRecord, Pipeline};

fn jsonl(name: &str, lines: &[String]) -> TempFile {
    let t = TempFile::new(&format!("fail-{name}"), "jsonl");
    let mut f = std::fs::File::create(&t.0).unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    t
}

fn good_line(i: usize) -> String {
    format!("{{\"n\": {i}, \"target\": [1.0, 2.0, {i}.5]}}")
}

fn kill(pid: u32, sig: Signal) {
    kill_process(Pid::from_raw(pid as i32).unwrap(), sig).unwrap();
}

/// Checks that the pipeline left no process and no segment behind.
fn assert_clean(id: &str, pids: &[u32]) {
    assert!(
        wait_gone(pids, Duration::from_secs(2)).is_some(),
        "children of {id} still running"
    );
    assert!(
        shm_entries(id).is_empty(),
        "leaked segments: {:?}",
        shm_entries(id)
    );
}

#[test]
fn bad_record_fails_naming_file_line_and_field() {
    let reg = registry();
    shmpipe::init(&reg);
    let mut lines: Vec<String> = (0..300).map(good_line).collect();
    lines[211] = "{\"n\": 211, \"target\": [1.0, [2.0], 3.0]}".into();
    let f = jsonl("fail", &lines);
    let p = Pipeline::builder(&reg)
        .source(JsonLines::new(&f.0).field("target", FieldKind::F32Array))
        .emitters(2)
        .step("inc")
        .start()
        .unwrap();
    let (id, pids, _g) = guarded(&p);
    let err = first_error(p, "the bad record must fail the run");
    match &err {
        Error::BadRecord {
            file,
            line,
            field,
            message,
        } => {
            assert_eq!(file, &f.0.display().to_string());
            assert_eq!(*line, 212);
            assert_eq!(field.as_deref(), Some("target"));
            assert!(message.contains("ragged"), "{message}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(err.to_string().contains(":212"), "{err}");
    assert_clean(&id, &pids);
}

#[test]
fn bad_records_skipped_and_counted() {
    let reg = registry();
    shmpipe::init(&reg);
    let mut lines: Vec<String> = (0..200).map(good_line).collect();
    for bad in [3, 50, 199] {
        lines[bad] = "{\"n\": oops}".into();
    }
    let f = jsonl("skip", &lines);
    let mut p = Pipeline::builder(&reg)
        .source(JsonLines::new(&f.0))
        .emitters(3)
        .step("inc")
        .on_bad_record(OnBadRecord::Skip)
        .start()
        .unwrap();
    let (id, pids, _g) = guarded(&p);
    let mut ns: Vec<i64> = p.by_ref().map(|r| r.unwrap().i64("n").unwrap()).collect();
    ns.sort_unstable();
    let want: Vec<i64> = (0..200)
        .filter(|i| ![3, 50, 199].contains(i))
        .map(|i| i + 1)
        .collect();
    assert_eq!(ns, want);
    assert_eq!(p.metrics().skipped_records, 3);
    drop(p);
    assert_clean(&id, &pids);
}

fn expect_step_error(step: &str, args: serde_json::Value, needle: &str) {
    let reg = registry();
    let p = Pipeline::builder(&reg)
        .source_named("range", serde_json::json!({"n": 400, "len": 4}))
        .emitters(2)
        .step("inc")
        .step_with(step, args)
        .workers(2)
        .start()
        .unwrap();
    let (id, pids, _g) = guarded(&p);
    let err = first_error(p, "the step must fail the run");
    match &err {
        Error::Step {
            step: s,
            worker,
            input,
            message,
            ..
        } => {
            assert_eq!(s, step);
            assert!(*worker < 2);
            // n = 37 after "inc" is record 36: emitter 0 (records 0..200), its record 36.
            assert_eq!(input, "emitter 0, record 36");
            assert!(message.contains(needle), "{message}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert_clean(&id, &pids);
}

#[test]
fn step_error_names_step_worker_and_input() {
    let reg = registry();
    shmpipe::init(&reg);
    expect_step_error("fail_on", serde_json::json!({"n": 37}), "refusing n=37");
}

#[test]
fn step_panic_names_step_worker_and_input() {
    let reg = registry();
    shmpipe::init(&reg);
    expect_step_error("panic_on", serde_json::json!({"n": 37}), "boom at n=37");
}

/// Starts an endless slow pipeline, kills child `victim` (0: the emitter, 1: a worker) after
/// the first outputs, and expects a `ProcessDied` error within two seconds.
fn kill_child_and_expect_error(victim: usize, role: &str) {
    let reg = registry();
    let mut p = endless_slow(&reg).batch_bytes(256).start().unwrap();
    let (id, pids, _g) = guarded(&p);
    for _ in 0..20 {
        p.dequeue().unwrap().unwrap();
    }
    kill(pids[victim], Signal::KILL);
    let t0 = Instant::now();
    let err = loop {
        match p.dequeue() {
            Ok(Some(_)) => assert!(
                t0.elapsed() < Duration::from_secs(3),
                "no error after the kill"
            ),
            Ok(None) => panic!("a killed child must not look like an end of stream"),
            Err(e) => break e,
        }
    };
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "error took {took:?}");
    match &err {
        Error::ProcessDied {
            role: r,
            pid,
            status,
        } => {
            assert!(r.starts_with(role), "{r}");
            assert_eq!(*pid, pids[victim]);
            assert!(status.contains("signal 9"), "{status}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(p.dequeue().unwrap().is_none());
    drop(p);
    assert_clean(&id, &pids);
}

#[test]
fn sigkilled_worker_is_an_error_within_a_second() {
    let reg = registry();
    shmpipe::init(&reg);
    kill_child_and_expect_error(1, "worker");
}

#[test]
fn sigkilled_emitter_is_an_error_within_a_second() {
    let reg = registry();
    shmpipe::init(&reg);
    kill_child_and_expect_error(0, "emitter");
}

#[test]
fn sigkilled_parent_takes_its_workers_down() {
    let reg = registry();
    if init_or_run_helper(&reg) {
        return;
    }
    let mut h = Helper::start_with("sigkilled_parent_takes_its_workers_down", "source");
    // READY comes after start(): every channel exists and is attached.
    kill(h.child.id(), Signal::KILL);
    let _ = h.child.wait();
    let took = wait_gone(&h.pids, Duration::from_secs(2));
    assert!(took.is_some(), "workers outlived their parent");
    // Nothing was ever named in /dev/shm, so nothing is left.
    assert!(
        shm_entries(&h.id).is_empty(),
        "leaked: {:?}",
        shm_entries(&h.id)
    );
}

#[test]
fn ctrl_c_shuts_down_cleanly() {
    let reg = registry();
    if init_or_run_helper(&reg) {
        return;
    }
    let mut h = Helper::start_with("ctrl_c_shuts_down_cleanly", "source");
    kill(h.child.id(), Signal::INT);
    let t0 = Instant::now();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut h.out, &mut rest).unwrap();
    let status = h.child.wait().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "shutdown took {:?}",
        t0.elapsed()
    );
    assert!(rest.contains("ERROR pipeline interrupted"), "{rest}");
    assert!(status.success(), "{status}");
    let id = h.id.clone();
    assert_clean(&id, &h.pids);
}

#[test]
fn a_sigkilled_enqueue_parent_leaves_nothing_and_the_next_start_works() {
    let reg = registry();
    if init_or_run_helper(&reg) {
        return;
    }
    // Enqueue mode: the parent itself owns the channels to the workers.
    let mut h = Helper::start_with(
        "a_sigkilled_enqueue_parent_leaves_nothing_and_the_next_start_works",
        "enqueue",
    );
    kill(h.child.id(), Signal::KILL);
    let _ = h.child.wait();
    assert!(
        wait_gone(&h.pids, Duration::from_secs(2)).is_some(),
        "workers outlived their parent"
    );
    assert!(shm_entries(&h.id).is_empty(), "{:?}", shm_entries(&h.id));
    let mut p = Pipeline::builder(&reg)
        .step("inc")
        .workers(1)
        .start()
        .unwrap();
    p.enqueue(shmpipe::Item::new().with_meta("n", 1)).unwrap();
    p.close_input();
    assert_eq!(p.dequeue().unwrap().unwrap().i64("n"), Some(2));
}
