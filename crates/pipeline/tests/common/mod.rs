//! The pipeline tests' registry and helper processes. The generic guards and checks come from
//! `shmpipe-test-kit`, re-exported here for the tests' `use common::*`.
#![allow(dead_code)]

use std::time::Duration;

// Each test binary uses a few of these.
#[allow(unused_imports)]
pub use shmpipe_test_kit::{
    KillOnDrop, ShmGuard, TempFile, gone, proc, rerun_test, shm_entries, signal,
    small_dev_shm_command, wait_gone, within,
};

use shmpipe::{
    Epochs, Item, MemorySource, Pipeline, PipelineBuilder, Registry, StepError, flat_map, map,
    ndarray::Array1,
};

/// Calls of the `count_calls` step in this process.
pub static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Number of outputs the `fan` step makes for input `n` (0..=max).
pub fn fan_count(n: i64, max: i64) -> i64 {
    (n.wrapping_mul(2_654_435_761) >> 7).rem_euclid(max + 1)
}

/// The items of the `range` source.
pub fn range_items(n: i64, len: usize) -> Vec<Item> {
    (0..n)
        .map(|i| {
            Item::new()
                .with_meta("n", i)
                .with("x", Array1::from_elem(len, i as f32))
        })
        .collect()
}

pub fn registry() -> Registry {
    Registry::new()
        .step("inc", |_| {
            Ok(map(|it: Item| {
                let n = it.i64("n").ok_or_else(|| StepError::new("no n"))?;
                Ok(it.with_meta("n", n + 1))
            }))
        })
        .step("fan", |cx| {
            let max = cx.args["max"].as_i64().unwrap_or(3);
            Ok(flat_map(move |it: Item, out: &mut Vec<Item>| {
                let n = it.i64("n").ok_or_else(|| StepError::new("no n"))?;
                for j in 0..fan_count(n, max) {
                    out.push(it.clone().with_meta("sub", j));
                }
                Ok(())
            }))
        })
        .step("fail_on", |cx| {
            let bad = cx.args["n"].as_i64().unwrap_or(-1);
            Ok(map(move |it: Item| {
                if it.i64("n") == Some(bad) {
                    return Err(StepError::new(format!("refusing n={bad}")));
                }
                Ok(it)
            }))
        })
        .step("panic_on", |cx| {
            let bad = cx.args["n"].as_i64().unwrap_or(-1);
            Ok(map(move |it: Item| {
                assert!(it.i64("n") != Some(bad), "boom at n={bad}");
                Ok(it)
            }))
        })
        .step("sleep_ms", |cx| {
            let ms = cx.args["ms"].as_u64().unwrap_or(1);
            Ok(map(move |it: Item| {
                std::thread::sleep(Duration::from_millis(ms));
                Ok(it)
            }))
        })
        .step("tag_worker", |cx| {
            let w = cx.worker.worker as i64;
            let seed = cx.worker.seed as i64;
            Ok(map(move |it: Item| {
                Ok(it.with_meta("worker", w).with_meta("wseed", seed))
            }))
        })
        .step("tag_seed", |_| {
            Ok(map(|it: Item| {
                let s = shmpipe::item_seed().ok_or_else(|| StepError::new("no item seed"))?;
                Ok(it.with_meta("iseed", s as i64))
            }))
        })
        .step("count_calls", |_| {
            Ok(map(|it: Item| {
                CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(it)
            }))
        })
        .source("range", |cx| {
            let n = cx.args["n"].as_i64().unwrap_or(10);
            let len = cx.args["len"].as_u64().unwrap_or(4) as usize;
            Ok(MemorySource::new(range_items(n, len)).part(cx.part, cx.parts))
        })
}

/// A pipeline's id and pids, with guards that kill its processes and remove its `/dev/shm`
/// entries when dropped.
pub type Guarded = (String, Vec<u32>, (ShmGuard, KillOnDrop));

/// The pipeline's id and pids, with guards that kill its processes and remove its `/dev/shm`
/// entries when the test ends, whether it passes or fails.
pub fn guarded(p: &Pipeline) -> Guarded {
    let (id, pids) = (p.id().to_owned(), p.pids());
    let g = (ShmGuard::containing(id.clone()), KillOnDrop(pids.clone()));
    (id, pids, g)
}

/// Starts `b` (it must start), with [`guarded`]'s id, pids and guards.
pub fn start_guarded(b: PipelineBuilder) -> (Pipeline, Guarded) {
    let p = b.start().unwrap();
    let g = guarded(&p);
    (p, g)
}

/// Starts `b` (it must start), with a guard that kills its processes when the test ends.
pub fn start_killing_on_drop(b: PipelineBuilder) -> (Pipeline, KillOnDrop) {
    let p = b.start().unwrap();
    let g = KillOnDrop(p.pids());
    (p, g)
}

/// The first error the pipeline's outputs end with; panics with `why` if they end without
/// one.
pub fn first_error(p: Pipeline, why: &str) -> shmpipe::Error {
    p.into_iter().find_map(Result::err).expect(why)
}

/// An endless slow pipeline: the `range` source (50 records of 4 floats, cycled) through 2
/// workers of `sleep_ms` (2 ms per item). It runs until it is dropped or killed.
pub fn endless_slow(reg: &Registry) -> PipelineBuilder {
    Pipeline::builder(reg)
        .source_named("range", serde_json::json!({"n": 50, "len": 4}))
        .epochs(Epochs::Cycle)
        .step_with("sleep_ms", serde_json::json!({"ms": 2}))
        .workers(2)
}

/// `shmpipe::init`, then in a helper process ([`helper_mode`]) the helper's pipeline
/// ([`helper_parent`]): `true` when this process was a helper and has done its part.
pub fn init_or_run_helper(reg: &Registry) -> bool {
    shmpipe::init(reg);
    match helper_mode() {
        Some(mode) => {
            helper_parent(mode == "enqueue");
            true
        }
        None => false,
    }
}

/// The environment variable that turns a re-run of a test into a helper process (its value is
/// the helper's mode).
pub const HELPER: &str = "SHMPIPE_TEST_HELPER";

/// The helper mode of this process, if it is a helper.
pub fn helper_mode() -> Option<String> {
    std::env::var(HELPER).ok()
}

/// A re-run of test `test` of this test binary as a helper process in `mode`.
pub fn helper_command(test: &str, mode: &str) -> std::process::Command {
    let mut c = rerun_test(test);
    c.env(HELPER, mode);
    c
}

/// In a helper: starts a pipeline (`enqueue` mode: the parent feeds 100k items; otherwise an
/// endless source with 2 emitters), both with 2 workers running `sleep_ms`, prints
/// `READY <id> <pids>` and consumes until the end or an error, which it prints.
pub fn helper_parent(enqueue: bool) {
    let reg = registry();
    let mut b = shmpipe::Pipeline::builder(&reg)
        .step_with("sleep_ms", serde_json::json!({"ms": 2}))
        .workers(2);
    if !enqueue {
        b = b
            .source_named("range", serde_json::json!({"n": 50, "len": 4}))
            .epochs(shmpipe::Epochs::Cycle)
            .emitters(2);
    }
    let mut p = b.start().unwrap();
    if enqueue {
        for n in 0..100_000 {
            p.enqueue(Item::new().with_meta("n", n)).unwrap();
        }
    }
    print_ready(&p);
    loop {
        match p.dequeue() {
            Ok(Some(_)) => {}
            Ok(None) => {
                println!("END");
                return;
            }
            Err(e) => {
                println!("ERROR {e}");
                return;
            }
        }
    }
}

/// Prints `READY <id> <pid,pid,...>` for [`Helper`].
pub fn print_ready(p: &shmpipe::Pipeline) {
    use std::io::Write;
    let pids: Vec<String> = p.pids().iter().map(u32::to_string).collect();
    println!("READY {} {}", p.id(), pids.join(","));
    std::io::stdout().flush().unwrap();
}

/// A helper process running a pipeline parent; killed (with its children) on drop.
pub struct Helper {
    pub child: std::process::Child,
    pub out: std::io::BufReader<std::process::ChildStdout>,
    pub id: String,
    pub pids: Vec<u32>,
}

impl Helper {
    /// Spawns `cmd` with stdout piped and waits for its `READY` line.
    pub fn spawn(mut cmd: std::process::Command) -> Helper {
        use std::io::BufRead;
        let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.starts_with("READY") {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                let _ = child.kill();
                let _ = child.wait();
                panic!("helper ended before READY");
            }
        }
        let mut parts = line.split_whitespace().skip(1);
        let id = parts.next().unwrap().to_owned();
        let pids = parts
            .next()
            .unwrap_or("")
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| p.parse().unwrap())
            .collect();
        Helper {
            child,
            out,
            id,
            pids,
        }
    }

    /// Starts test `test` as a helper in `mode` (see [`helper_parent`]).
    pub fn start_with(test: &str, mode: &str) -> Helper {
        Helper::spawn(helper_command(test, mode))
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        drop(KillOnDrop(self.pids.clone()));
        drop(ShmGuard::containing(self.id.clone()));
    }
}
