//! What the Python binding's seed interface stands on: counted inputs (`inputs_done`),
//! `dequeue_timeout`, `workers(0)` in the caller's thread, per-item seeds that do not depend on
//! the worker count, and `Records` reading a part as an emitter does.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use shmpipe::{
    Epochs, Error, Item, MemorySource, OnBadRecord, Pipeline, ReadOrder, Records, Registry,
};

fn n_sub(it: &Item) -> (i64, i64) {
    (it.i64("n").unwrap(), it.i64("sub").unwrap_or(-1))
}

#[test]
fn inputs_done_counts_each_input_once_all_its_outputs_are_out() {
    let reg = registry();
    shmpipe::init(&reg);
    for ordered in [false, true] {
        let (mut p, _g) = start_killing_on_drop(
            Pipeline::builder(&reg)
                .step_with("fan", serde_json::json!({"max": 2}))
                .workers(2)
                .ordered(ordered),
        );
        within(Duration::from_secs(30), "one input at a time", move || {
            for n in 0..40i64 {
                p.enqueue(Item::new().with_meta("n", n)).unwrap();
                let mut got = 0;
                // Inputs without outputs count too, though nothing is dequeued for them.
                while p.inputs_done() < n as u64 + 1 {
                    match p.dequeue_timeout(Duration::from_millis(20)) {
                        Ok(Some(it)) => {
                            assert_eq!(it.i64("n"), Some(n));
                            got += 1;
                        }
                        Err(Error::Timeout) => {}
                        r => panic!("{r:?}"),
                    }
                }
                assert_eq!(got, fan_count(n, 2), "ordered={ordered} n={n}");
                assert_eq!(p.inputs_done(), n as u64 + 1);
            }
            p.close_input();
            assert!(p.dequeue().unwrap().is_none());
            assert_eq!(p.inputs_done(), 40);
        });
    }
}

#[test]
fn dequeue_timeout_gives_up_without_harm() {
    let reg = registry();
    shmpipe::init(&reg);
    let (mut p, _g) = start_killing_on_drop(Pipeline::builder(&reg).step("inc").workers(1));
    let t0 = Instant::now();
    assert!(matches!(
        p.dequeue_timeout(Duration::from_millis(100)),
        Err(Error::Timeout)
    ));
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(100) && waited < Duration::from_secs(2));
    p.enqueue(Item::new().with_meta("n", 1)).unwrap();
    let out = p.dequeue_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(out.i64("n"), Some(2));
    p.close_input();
    assert!(
        p.dequeue_timeout(Duration::from_secs(10))
            .unwrap()
            .is_none()
    );
}

fn run_enqueue(
    reg: &Registry,
    workers: usize,
    steps: &[(&str, serde_json::Value)],
    n: i64,
) -> Vec<Item> {
    let mut b = Pipeline::builder(reg)
        .workers(workers)
        .ordered(true)
        .seed(42);
    for (s, a) in steps {
        b = b.step_with(s, a.clone());
    }
    let p = b.start().unwrap();
    let _g = KillOnDrop(p.pids());
    let items = (0..n).map(|n| Item::new().with_meta("n", n));
    within(Duration::from_secs(30), "run", move || p.run(items)).unwrap()
}

#[test]
fn workers_0_runs_the_steps_here_with_the_outputs_of_any_worker_count() {
    let reg = registry();
    shmpipe::init(&reg);
    let steps = [
        ("fan", serde_json::json!({"max": 3})),
        ("tag_seed", serde_json::Value::Null),
    ];
    let with_2 = run_enqueue(&reg, 2, &steps, 60);
    let before = CALLS.load(Ordering::Relaxed);
    let mut p = Pipeline::builder(&reg)
        .step("count_calls")
        .workers(0)
        .start()
        .unwrap();
    assert!(p.pids().is_empty(), "no process");
    p.enqueue(Item::new().with_meta("n", 1)).unwrap();
    assert_eq!(
        CALLS.load(Ordering::Relaxed),
        before,
        "steps run in dequeue"
    );
    assert!(p.dequeue().unwrap().is_some());
    assert_eq!(CALLS.load(Ordering::Relaxed), before + 1, "in this process");
    let inline = run_enqueue(&reg, 0, &steps, 60);
    let key = |v: &[Item]| -> Vec<(i64, i64, i64)> {
        v.iter()
            .map(|i| {
                (
                    i.i64("n").unwrap(),
                    i.i64("sub").unwrap(),
                    i.i64("iseed").unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(key(&inline), key(&with_2));
    // A failing step: the same error as from a worker process, naming worker 0.
    let mut p = Pipeline::builder(&reg)
        .step_with("fail_on", serde_json::json!({"n": 7}))
        .workers(0)
        .start()
        .unwrap();
    for n in 0..10 {
        p.enqueue(Item::new().with_meta("n", n)).unwrap();
    }
    p.close_input();
    let err = p.by_ref().find_map(Result::err).expect("step error");
    match err {
        Error::Step {
            step,
            worker,
            emitter,
            record,
            input,
            message,
            ..
        } => {
            assert_eq!((step.as_str(), worker), ("fail_on", 0));
            assert_eq!((emitter, record), (Some(0), Some(7)), "the input as fields");
            assert!(input.contains("record 7"), "{input}");
            assert!(message.contains("refusing n=7"), "{message}");
        }
        e => panic!("{e}"),
    }
    assert!(p.dequeue().unwrap().is_none(), "nothing after the failure");
    let src = Pipeline::builder(&reg)
        .source_named("range", serde_json::json!({"n": 3}))
        .workers(0)
        .start();
    assert!(matches!(src, Err(Error::Config(m)) if m.contains("Records")));
}

#[test]
fn item_seeds_do_not_depend_on_the_worker_count() {
    let reg = registry();
    shmpipe::init(&reg);
    let source_run = |workers: usize, ordered: bool| -> Vec<(i64, i64, i64)> {
        let (p, _g) = start_killing_on_drop(
            Pipeline::builder(&reg)
                .source_named("range", serde_json::json!({"n": 40}))
                .step_with("fan", serde_json::json!({"max": 2}))
                .step("tag_seed")
                .workers(workers)
                .shuffle(true)
                .seed(9)
                .epochs(Epochs::Finite(2))
                .ordered(ordered)
                .batch_bytes(256),
        );
        within(Duration::from_secs(30), "run", move || {
            p.map(|r| {
                let it = r.unwrap();
                let (n, sub) = n_sub(&it);
                (n, sub, it.i64("iseed").unwrap())
            })
            .collect()
        })
    };
    let one = source_run(1, true);
    assert_eq!(source_run(2, true), one);
    assert_eq!(source_run(3, true), one);
    let mut any = source_run(3, false);
    any.sort_unstable();
    let mut sorted = one.clone();
    sorted.sort_unstable();
    assert_eq!(any, sorted, "the same multiset unordered");
    // The two epochs differ; siblings (outputs of one input) share their input's seed.
    let half = one.len() / 2;
    assert_ne!(one[..half], one[half..]);
    for w in one.windows(2) {
        if w[0].0 == w[1].0 && w[0].1 + 1 == w[1].1 {
            assert_eq!(w[0].2, w[1].2);
        }
    }
    let distinct: std::collections::HashSet<_> = one.iter().map(|t| t.2).collect();
    assert_eq!(
        distinct.len(),
        (0..40)
            .map(|n| if fan_count(n, 2) > 0 { 2 } else { 0 })
            .sum::<usize>()
    );
}

#[test]
fn records_read_a_part_in_the_order_an_emitter_sends_it() {
    let reg = registry();
    shmpipe::init(&reg);
    let (p, _g) = start_killing_on_drop(
        Pipeline::builder(&reg)
            .source_named("range", serde_json::json!({"n": 50}))
            .workers(2)
            .shuffle(true)
            .shuffle_buffer(8)
            .seed(3)
            .epochs(Epochs::Finite(2))
            .ordered(true),
    );
    let sent: Vec<i64> = within(Duration::from_secs(30), "run", move || {
        p.map(|r| r.unwrap().i64("n").unwrap()).collect()
    });
    let order = ReadOrder {
        seed: 3,
        shuffle: true,
        shuffle_buffer: 8,
        rank: 0,
        emitter: 0,
        on_bad_record: OnBadRecord::Fail,
    };
    let mut r = Records::new(Box::new(MemorySource::new(range_items(50, 4))), order);
    let mut read = Vec::new();
    for epoch in 0..2 {
        r.start_epoch(epoch);
        read.extend(r.by_ref().map(|it| it.unwrap().i64("n").unwrap()));
    }
    assert_eq!(read, sent);
    assert_ne!(read[..50], read[50..]);
}
