//! `Step::finish`: steps that buffer flush at the end of stream (real worker processes).

mod common;

use std::time::Duration;

use common::*;
use shmpipe::{Error, Item, Pipeline, Registry, Step, StepError, Topology};

/// Buffers items and emits them in groups of `k`; `finish` emits the rest, tagged `fin = 1`.
/// Items emitted by `process` get the `fin` of the input that triggered them (0 for a record),
/// so `fin = 1` marks exactly the outputs that belong to no input (those made at the end of
/// stream, or by later steps from those).
struct Chunk {
    k: usize,
    buf: Vec<Item>,
}

impl Chunk {
    fn emit(&mut self, fin: i64, out: &mut Vec<Item>) {
        out.extend(self.buf.drain(..).map(|it| it.with_meta("fin", fin)));
    }
}

impl Step for Chunk {
    fn process(&mut self, item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        let fin = item.i64("fin").unwrap_or(0);
        self.buf.push(item);
        if self.buf.len() == self.k {
            self.emit(fin, out);
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), StepError> {
        assert!(self.buf.len() < self.k, "finish called twice or too early");
        self.emit(1, out);
        Ok(())
    }
}

/// Passes items through; its `finish` fails (or panics with `{"panic": true}`).
struct FailFinish(bool);

impl Step for FailFinish {
    fn process(&mut self, item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        out.push(item);
        Ok(())
    }

    fn finish(&mut self, _out: &mut Vec<Item>) -> Result<(), StepError> {
        assert!(!self.0, "finish panicked on purpose");
        Err(StepError::new("cannot flush on purpose"))
    }
}

fn reg() -> Registry {
    registry()
        .step("chunk", |cx| {
            let k = cx.args["k"].as_u64().unwrap_or(4) as usize;
            Ok(Chunk { k, buf: Vec::new() })
        })
        .step("fail_finish", |cx| {
            Ok(FailFinish(cx.args["panic"].as_bool().unwrap_or(false)))
        })
}

/// Runs the pipeline to the end; returns the outputs (in arrival order).
fn run(
    reg: &Registry,
    n: i64,
    emitters: usize,
    workers: usize,
    topo: Topology,
    ordered: bool,
    ks: &[u64],
) -> Vec<Item> {
    let mut b = Pipeline::builder(reg)
        .source_named("range", serde_json::json!({"n": n, "len": 2}))
        .emitters(emitters)
        .workers(workers)
        .topology(topo)
        .ordered(ordered)
        .batch_bytes(300);
    for &k in ks {
        b = b.step_with("chunk", serde_json::json!({ "k": k }));
    }
    let mut p = b.start().unwrap();
    let (id, pids, _g) = guarded(&p);
    let out: Vec<Item> = p.by_ref().map(Result::unwrap).collect();
    assert!(p.is_finished());
    drop(p);
    assert!(wait_gone(&pids, Duration::from_secs(5)).is_some());
    assert!(shm_entries(&id).is_empty(), "{:?}", shm_entries(&id));
    out
}

fn assert_each_once(out: &[Item], n: i64, what: &str) {
    let mut ns: Vec<i64> = out.iter().map(|i| i.i64("n").unwrap()).collect();
    ns.sort_unstable();
    assert_eq!(ns, (0..n).collect::<Vec<_>>(), "{what}");
}

#[test]
fn finish_flushes_partial_groups_fused_and_staged() {
    let reg = reg();
    shmpipe::init(&reg);
    let n = 103; // not a multiple of 4, 3 or 5
    for workers in 1..=3 {
        // Fused, one buffering step and two (the second buffers what the first's finish flushes).
        for ks in [&[4][..], &[4, 3][..]] {
            let out = run(&reg, n, 2, workers, Topology::Fused, false, ks);
            assert_each_once(&out, n, &format!("fused {workers} workers {ks:?}"));
            // Every worker holds a partial group at the end: without finish these are lost.
            assert!(out.iter().any(|i| i.i64("fin") == Some(1)));
        }
        let staged = Topology::Staged {
            workers: vec![workers, 4 - workers],
        };
        let out = run(&reg, n, 2, workers, staged, false, &[4, 5]);
        assert_each_once(&out, n, &format!("staged [{workers}, {}]", 4 - workers));
        assert!(out.iter().any(|i| i.i64("fin") == Some(1)));
    }
}

#[test]
fn finish_outputs_come_last_in_ordered_mode() {
    let reg = reg();
    shmpipe::init(&reg);
    let n = 103;
    // One emitter and one worker: exactly the input order, the flushed rest at the end.
    let out = run(&reg, n, 1, 1, Topology::Fused, true, &[4]);
    let ns: Vec<i64> = out.iter().map(|i| i.i64("n").unwrap()).collect();
    assert_eq!(ns, (0..n).collect::<Vec<_>>());
    let fins: Vec<i64> = out.iter().map(|i| i.i64("fin").unwrap()).collect();
    assert_eq!(fins.iter().filter(|&&f| f == 1).count(), 3);
    for (workers, topo) in [
        (3, Topology::Fused),
        (
            2,
            Topology::Staged {
                workers: vec![2, 2],
            },
        ),
    ] {
        let ks: &[u64] = if matches!(topo, Topology::Fused) {
            &[4]
        } else {
            &[4, 3]
        };
        let out = run(&reg, n, 2, workers, topo, true, ks);
        assert_each_once(&out, n, "ordered");
        let first_fin = out
            .iter()
            .position(|i| i.i64("fin") == Some(1))
            .expect("some partial group is flushed");
        assert!(
            out[first_fin..].iter().all(|i| i.i64("fin") == Some(1)),
            "finish outputs must follow every group"
        );
    }
}

fn expect_finish_error(topo: Topology, steps: &[(&str, serde_json::Value)], want: &str) -> String {
    let reg = reg();
    let mut b = Pipeline::builder(&reg)
        .source_named("range", serde_json::json!({"n": 50, "len": 2}))
        .emitters(2)
        .workers(2)
        .topology(topo);
    for (s, a) in steps {
        b = b.step_with(s, a.clone());
    }
    let p = b.start().unwrap();
    let (id, pids, _g) = guarded(&p);
    let err = first_error(p, "finish must fail the run");
    let Error::Step {
        step,
        worker,
        input,
        message,
        ..
    } = &err
    else {
        panic!("unexpected error {err}");
    };
    assert_eq!(step, want, "{err}");
    assert!(*worker < 2);
    assert!(input.starts_with("end of stream"), "{input}");
    assert!(wait_gone(&pids, Duration::from_secs(5)).is_some());
    assert!(shm_entries(&id).is_empty(), "{:?}", shm_entries(&id));
    message.clone()
}

#[test]
fn finish_error_is_reported_as_a_step_error() {
    let reg = reg();
    shmpipe::init(&reg);
    let null = serde_json::Value::Null;
    let m = expect_finish_error(
        Topology::Fused,
        &[("inc", null.clone()), ("fail_finish", null.clone())],
        "fail_finish",
    );
    assert!(m.contains("cannot flush on purpose"), "{m}");
    let m = expect_finish_error(
        Topology::Staged {
            workers: vec![2, 1],
        },
        &[
            ("inc", null.clone()),
            ("fail_finish", serde_json::json!({"panic": true})),
        ],
        "fail_finish",
    );
    assert!(m.contains("finish panicked on purpose"), "{m}");
    // An item that only a finish emits fails a later step: that step is named, at end of stream.
    let m = expect_finish_error(
        Topology::Fused,
        &[
            ("chunk", serde_json::json!({"k": 1000})),
            ("fail_on", serde_json::json!({"n": 7})),
        ],
        "fail_on",
    );
    assert!(m.contains("refusing n=7"), "{m}");
}
