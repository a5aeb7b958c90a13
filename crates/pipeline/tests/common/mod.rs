//! Shared test registry and guards.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use shmpipe::{Item, MemorySource, Registry, StepError, flat_map, map, ndarray::Array1};

/// Number of outputs the `fan` step makes for input `n` (0..=max).
pub fn fan_count(n: i64, max: i64) -> i64 {
    (n.wrapping_mul(2_654_435_761) >> 7).rem_euclid(max + 1)
}

/// The items of the `range` source.
pub fn range_items(n: i64, len: usize) -> Vec<Item> {
    (0..n)
        .map(|i| {
            Item::new()
                .with_i64("n", i)
                .with_array("x", Array1::from_elem(len, i as f32))
        })
        .collect()
}

pub fn registry() -> Registry {
    Registry::new()
        .step("inc", |_| {
            Ok(map(|it: Item| {
                let n = it.i64("n").ok_or_else(|| StepError::new("no n"))?;
                Ok(it.with_i64("n", n + 1))
            }))
        })
        .step("fan", |cx| {
            let max = cx.args["max"].as_i64().unwrap_or(3);
            Ok(flat_map(move |it: Item, out: &mut Vec<Item>| {
                let n = it.i64("n").ok_or_else(|| StepError::new("no n"))?;
                for j in 0..fan_count(n, max) {
                    out.push(it.clone().with_i64("sub", j));
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
                Ok(it.with_i64("worker", w).with_i64("wseed", seed))
            }))
        })
        .source("range", |cx| {
            let n = cx.args["n"].as_i64().unwrap_or(10);
            let len = cx.args["len"].as_u64().unwrap_or(4) as usize;
            Ok(MemorySource::new(range_items(n, len)).part(cx.part, cx.parts))
        })
}

/// Entries of `/dev/shm` whose name contains `needle`.
pub fn shm_entries(needle: &str) -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(needle))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether process `pid` is gone (or a zombie).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Waits until every pid is gone; returns how long it took (or `None` on timeout).
pub fn wait_gone(pids: &[u32], timeout: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if pids.iter().all(|&p| gone(p)) {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// Kills pids on drop (for tests that fail half-way).
pub struct KillOnDrop(pub Vec<u32>);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &p in &self.0 {
            if let Some(pid) = rustix::process::Pid::from_raw(p as i32)
                && !gone(p)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// Removes `/dev/shm` entries containing the needle on drop (so a failing test leaks nothing).
pub struct ShmGuard(pub String);
impl Drop for ShmGuard {
    fn drop(&mut self) {
        for n in shm_entries(&self.0) {
            let _ = std::fs::remove_file(format!("/dev/shm/{n}"));
        }
    }
}
