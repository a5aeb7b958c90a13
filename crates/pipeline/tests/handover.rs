//! How channels come to exist and reach their consumers: anonymous sealed memfds handed over
//! by descriptor, never names. Nothing in `/dev/shm` to squat or leak, every channel attached
//! before `start()` returns, no wait without a bound.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rustix::process::Signal;
use shmpipe::{Error, Item, Pipeline, Topology, Transfer};

fn staged(reg: &shmpipe::Registry) -> shmpipe::PipelineBuilder {
    Pipeline::builder(reg)
        .step("inc")
        .step("inc")
        .topology(Topology::Staged {
            workers: vec![2, 2],
        })
}

/// Issue 8: closing the input right after `start()` lost items (a first-stage worker had not
/// opened its channel yet when the input thread removed it).
#[test]
fn staged_close_right_after_start_loses_nothing() {
    let reg = registry();
    shmpipe::init(&reg);
    for round in 0..8 {
        let mut p = staged(&reg).start().unwrap();
        let _g = guarded(&p);
        for n in 0..20 {
            p.enqueue(Item::new().with_meta("n", n)).unwrap();
        }
        p.close_input();
        let mut got = within(Duration::from_secs(10), "the run", move || {
            p.map(|r| r.map(|i| i.i64("n").unwrap()))
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap_or_else(|e| panic!("round {round}: {e}"));
        got.sort_unstable();
        assert_eq!(got, (2..22).collect::<Vec<_>>(), "round {round}");
    }
}

/// Issue 8: a worker that dies before it attached its input made the input thread wait
/// forever (and with it `Drop`). Now: `ProcessDied` at the consumer, and a prompt drop.
#[test]
fn worker_killed_right_after_start_is_an_error_not_a_hang() {
    let reg = registry();
    shmpipe::init(&reg);
    for round in 0..4 {
        let mut p = staged(&reg).start().unwrap();
        let (_, pids, _g) = guarded(&p);
        signal(pids[0], Signal::KILL);
        for n in 0..3000 {
            let _ = p.enqueue(
                Item::new()
                    .with_meta("n", n)
                    .with("x", ndarray::Array1::<f32>::zeros(256)),
            );
        }
        p.close_input();
        let (err, drop_took) = within(Duration::from_secs(5), "dequeue and drop", move || {
            let err = p.by_ref().find_map(Result::err);
            let t0 = Instant::now();
            drop(p);
            (err, t0.elapsed())
        });
        match err {
            Some(Error::ProcessDied { pid, status, .. }) => {
                assert_eq!(pid, pids[0], "round {round}");
                assert!(status.contains("signal 9"), "{status}");
            }
            other => panic!("round {round}: expected ProcessDied, got {other:?}"),
        }
        assert!(
            drop_took < Duration::from_secs(2),
            "drop took {drop_took:?}"
        );
        assert!(wait_gone(&pids, Duration::from_secs(2)).is_some());
    }
}

/// Issue 8: every process of a pipeline SIGKILLed at the same instant leaves nothing in
/// `/dev/shm` (nobody gets a chance to clean up, so nothing may need cleaning).
#[test]
fn sigkill_of_every_process_at_once_leaves_nothing_in_dev_shm() {
    let reg = registry();
    if init_or_run_helper(&reg) {
        return;
    }
    for mode in ["enqueue", "source"] {
        let mut h = Helper::start_with(
            "sigkill_of_every_process_at_once_leaves_nothing_in_dev_shm",
            mode,
        );
        let before = shm_entries("");
        // Let the children set up their channels and data flow.
        std::thread::sleep(Duration::from_millis(200));
        let mut all = h.pids.clone();
        all.push(h.child.id());
        for &p in &all {
            signal(p, Signal::KILL);
        }
        let _ = h.child.wait();
        assert!(wait_gone(&all, Duration::from_secs(2)).is_some(), "{mode}");
        let ours = shm_entries(&h.id);
        assert!(ours.is_empty(), "{mode}: leaked {ours:?}");
        let new: Vec<_> = shm_entries("").difference(&before).cloned().collect();
        assert!(
            new.iter()
                .all(|n| !n.contains(&format!("{}x", h.child.id()))),
            "{mode}: new entries {new:?}"
        );
    }
}

const INNER: &str = "SHMPIPE_TEST_SMALL_SHM";

/// Issue 8: the pool is not bounded by the `/dev/shm` mount. In a private mount namespace
/// with a 16 MB tmpfs on `/dev/shm` (a small container), a pipeline whose channels have
/// 64 MiB pools moves 1M-float arrays to the end.
#[test]
fn pools_larger_than_dev_shm_work() {
    let reg = registry();
    shmpipe::init(&reg);
    if std::env::var_os(INNER).is_some() {
        let p = Pipeline::builder(&reg)
            .source_named("range", serde_json::json!({"n": 24, "len": 1 << 20}))
            .step("inc")
            .workers(1)
            .transfer(Transfer::ZeroCopy)
            .channel(shmpipe::ChannelGeometry {
                slots: 256,
                blocks: 16,
                block_size: 4 << 20,
                ..shmpipe::ChannelGeometry::default()
            })
            .start()
            .unwrap_or_else(|e| {
                println!("START FAILED {e}");
                std::process::exit(1)
            });
        let mut n = 0;
        for it in p {
            let it = it.unwrap_or_else(|e| {
                println!("RUN FAILED {e}");
                std::process::exit(1)
            });
            let k = it.i64("n").unwrap() - 1;
            let x = it.array::<f32>("x").unwrap();
            assert_eq!(x.len(), 1 << 20);
            assert!(x.iter().all(|&v| v == k as f32));
            n += 1;
        }
        println!("OK {n}");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let script = format!(
        "{} --exact pools_larger_than_dev_shm_work --nocapture",
        exe.display()
    );
    let out = small_dev_shm_command(&script)
        .env(INNER, "1")
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("OK 24"),
        "{}\n{stdout}\n{stderr}",
        out.status
    );
}

/// Issue 8: the socket transport binds no name another process could take or connect to
/// (it used the abstract namespace, unchecked).
#[test]
fn socket_transport_binds_no_name() {
    let reg = registry();
    shmpipe::init(&reg);
    let (mut p, _g) = start_killing_on_drop(
        Pipeline::builder(&reg)
            .step("inc")
            .workers(2)
            .socket_transport(true),
    );
    for n in 0..10 {
        p.enqueue(Item::new().with_meta("n", n)).unwrap();
    }
    let first = p.dequeue().unwrap().unwrap();
    assert!(first.i64("n").is_some());
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let named: Vec<&str> = table.lines().filter(|l| l.contains(p.id())).collect();
    assert!(named.is_empty(), "bound names: {named:?}");
    p.close_input();
    assert_eq!(p.count(), 9);
}
