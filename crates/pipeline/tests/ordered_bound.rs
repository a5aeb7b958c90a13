//! The ordered mode's reorder buffer under a hostile worker and under a slow emitter
//! (issue 16, review of the pipeline part, findings 1 and 5): what bounds it lives where no
//! worker can write, a slow emitter does not make the consumer's memory grow past that bound,
//! and the back-pressure that holds the fast emitters never deadlocks a run, whatever the
//! numbers of emitters, workers and stages.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rustix::fs::{Mode, OFlags};
use shmpipe::{Epochs, Item, Pipeline, Registry, Topology, flat_map, map};

/// Pids of the live children of `pid` (a worker's siblings: the emitters and other workers).
fn siblings(ppid: u32) -> Vec<u32> {
    proc::children_of(ppid)
}

/// What a hostile worker reaches of process `pid` through `/proc/<pid>/fd` (a same-user
/// process needs only PTRACE_MODE_READ there, which Yama does not restrict): every memory
/// file it can open read-write that is not a data channel (whose bytes the pipeline validates
/// as a hostile producer's), which it scribbles over; and every socket it can reopen.
fn scribble_over(pid: u32) -> (Vec<String>, Vec<String>) {
    let (mut memfds, mut sockets) = (Vec::new(), Vec::new());
    for (path, to) in proc::fd_links(pid) {
        let to = to.to_string_lossy().into_owned();
        if to.starts_with("socket:") {
            if rustix::fs::open(&path, OFlags::RDWR, Mode::empty()).is_ok() {
                sockets.push(to);
            }
            continue;
        }
        if !to.starts_with("/memfd:") || to.contains("shmpipe:anon") {
            continue;
        }
        if let Ok(fd) = rustix::fs::open(&path, OFlags::RDWR, Mode::empty()) {
            let forged = [0xffu8; 64];
            if rustix::io::pwrite(&fd, &forged, 0) == Ok(64) {
                memfds.push(to);
            }
        }
    }
    (memfds, sockets)
}

fn reg() -> Registry {
    registry()
        // A hostile step: on its first input, scribbles over every memory file of its parent
        // and of every other child of the pipeline that it can open read-write (the review's
        // route to the issued counters), and tries to reopen their sockets.
        .step("scribble", |_cx| {
            let mut done = false;
            Ok(map(move |it: Item| {
                if done {
                    return Ok(it);
                }
                done = true;
                let me = std::process::id();
                let ppid = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get());
                let mut pids = vec![ppid as u32];
                pids.extend(siblings(ppid as u32).into_iter().filter(|&p| p != me));
                let (mut memfds, mut sockets) = (Vec::new(), Vec::new());
                for pid in pids {
                    let (m, s) = scribble_over(pid);
                    memfds.extend(m.into_iter().map(|m| format!("{pid}:{m}")));
                    sockets.extend(s.into_iter().map(|s| format!("{pid}:{s}")));
                }
                Ok(it
                    .with_meta("memfds", memfds.join(" "))
                    .with_meta("sockets", sockets.join(" ")))
            }))
        })
        .source("slow_start", |cx| {
            Ok(SlowStart {
                part: cx.part,
                delay: Duration::from_millis(cx.args["delay_ms"].as_u64().unwrap_or(0)),
            })
        })
        // Every record of emitter `slow` takes `ms` milliseconds to read, the others none.
        .source("uneven", |cx| {
            let n = cx.args["n"].as_u64().unwrap_or(10) as usize;
            let slow = cx.args["slow"].as_u64().unwrap_or(0) as usize;
            let ms = cx.args["ms"].as_u64().unwrap_or(1);
            Ok(Uneven {
                n,
                part: cx.part,
                parts: cx.parts,
                delay: Duration::from_millis(if cx.part == slow { ms } else { 0 }),
            })
        })
        // 0..=3 outputs per input, some of them after a short sleep: groups of any size
        // finish in any order.
        .step("jitter_fan", |cx| {
            let w = cx.worker.worker as u64;
            Ok(flat_map(move |it: Item, out: &mut Vec<Item>| {
                let n = it.i64("n").unwrap_or(0);
                let h = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ w;
                if h.is_multiple_of(7) {
                    std::thread::sleep(Duration::from_millis(h % 5));
                }
                for j in 0..fan_count(n, 3) {
                    out.push(it.clone().with_meta("sub", j));
                }
                Ok(())
            }))
        })
}

/// ARCHITECTURE's threat model said a worker "cannot raise an emitter's issued-records counter
/// (never handed to workers)". It could: the parent and every emitter held that memfd
/// read-write, and a worker of the same user opened `/proc/<ppid>/fd/<n>` read-write and
/// wrote it. The bound of the reorder buffer must live in nothing a worker can open: here a
/// worker scribbles over every memory file of its parent and its siblings it can open (the
/// data channels aside) and tries to reopen their sockets, and the run still delivers every
/// record in order with nothing found.
#[test]
fn the_reorder_bound_lives_in_nothing_a_worker_can_open() {
    let reg = reg();
    shmpipe::init(&reg);
    for emitters in [1, 2] {
        let (mut p, _g) = start_guarded(
            Pipeline::builder(&reg)
                .source_named("range", serde_json::json!({"n": 8, "len": 1}))
                .emitters(emitters)
                .ordered(true)
                .step("scribble")
                .workers(1),
        );
        let out = within(Duration::from_secs(20), "the run", move || {
            p.by_ref().collect::<Result<Vec<Item>, _>>()
        })
        .unwrap();
        let found: Vec<(&str, &str)> = out
            .iter()
            .filter_map(|it| Some((it.str("memfds")?, it.str("sockets")?)))
            .collect();
        assert_eq!(found.len(), 1, "one scribbling pass");
        assert_eq!(
            found[0],
            ("", ""),
            "{emitters} emitters: a worker wrote these memory files / reopened these sockets"
        );
        let ns: Vec<i64> = out.iter().filter_map(|it| it.i64("n")).collect();
        let mut want: Vec<i64> = (0..8).collect();
        if emitters == 2 {
            // Emitter 0 reads 0..4, emitter 1 reads 4..8; released k, then e.
            want = vec![0, 4, 1, 5, 2, 6, 3, 7];
        }
        assert_eq!(ns, want);
    }
}

/// Part 1 of this source is slow to give its first record (a slow disk, a network fetch, an
/// expensive first record); part 0 is fast. Every record carries 16 KiB.
struct SlowStart {
    part: usize,
    delay: Duration,
}

impl shmpipe::Source for SlowStart {
    fn len(&self) -> usize {
        1 << 20
    }
    fn read(&mut self, index: usize) -> Result<Item, shmpipe::SourceError> {
        if self.part == 1 && index == 0 {
            std::thread::sleep(self.delay);
        }
        Ok(Item::new()
            .with_meta("n", index as i64)
            .with("x", shmpipe::ndarray::Array1::<f32>::zeros(4096)))
    }
}

/// Records `0..n` split over the parts; part `slow`'s reads sleep.
struct Uneven {
    n: usize,
    part: usize,
    parts: usize,
    delay: Duration,
}

impl shmpipe::Source for Uneven {
    fn len(&self) -> usize {
        shmpipe::part_range(self.n, self.part, self.parts).len()
    }
    fn read(&mut self, index: usize) -> Result<Item, shmpipe::SourceError> {
        std::thread::sleep(self.delay);
        let start = shmpipe::part_range(self.n, self.part, self.parts).start;
        Ok(Item::new().with_meta("n", (start + index) as i64))
    }
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// docs/pipeline.md said "with `Epochs::Cycle` the reorder buffer is bounded by the rings".
/// It was not: while emitter 1 was slow, the consumer kept draining emitter 0's outputs into
/// the reorder buffer, and its memory grew with everything emitter 0 issued meanwhile (the
/// review saw 512 MiB within seconds).
#[test]
fn a_slow_emitter_does_not_grow_the_consumer_past_the_bound() {
    let delay = Duration::from_secs(8);
    let reg = reg();
    shmpipe::init(&reg);
    let (mut p, _g) = start_guarded(
        Pipeline::builder(&reg)
            .source_named(
                "slow_start",
                serde_json::json!({"delay_ms": delay.as_millis() as u64}),
            )
            .emitters(2)
            .epochs(Epochs::Cycle)
            .ordered(true)
            .step("inc")
            .workers(2),
    );
    // (k=0, e=0) comes at once; (0, 1) only after emitter 1's delay.
    assert!(p.dequeue().unwrap().is_some());
    let before = rss_kib();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = p.dequeue().map(|o| o.is_some());
        let _ = tx.send(r);
        drop(p);
    });
    let t0 = Instant::now();
    let mut grown = 0;
    let mut got = None;
    while t0.elapsed() < delay + Duration::from_secs(5) {
        grown = grown.max(rss_kib().saturating_sub(before));
        if grown > 512 * 1024 {
            break;
        }
        if let Ok(r) = rx.try_recv() {
            got = Some(r);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The bound: REORDER_BYTES of buffered outputs (plus the records granted before it was
    // reached); the allocator's and the rings' own pages aside, twice that is plenty.
    let limit = 2 * shmpipe::REORDER_BYTES as u64 / 1024;
    assert!(
        grown < limit,
        "the consumer's memory grew by {} MiB in {:?} while emitter 1 was slow (limit {} MiB)",
        grown / 1024,
        t0.elapsed(),
        limit / 1024
    );
    assert!(
        matches!(got, Some(Ok(true))),
        "emitter 1's first record after its delay: {got:?}"
    );
}

/// The back-pressure that bounds the reorder buffer never deadlocks: ordered runs with
/// several emitters (one of them slow), several workers, one or two stages, groups of 0..3
/// outputs finishing in any order, and the smallest reorder windows, all deliver every output
/// in input order.
#[test]
fn ordered_runs_under_back_pressure_do_not_deadlock() {
    let reg = reg();
    shmpipe::init(&reg);
    let n = 300i64;
    let cases: Vec<(usize, Topology, u64, u64)> = vec![
        (3, Topology::Fused, 1, 1),
        (3, Topology::Fused, 2, 2),
        (2, Topology::Fused, 3, 1),
        (
            3,
            Topology::Staged {
                workers: vec![2, 3],
            },
            1,
            1,
        ),
        (
            2,
            Topology::Staged {
                workers: vec![3, 2],
            },
            4,
            0,
        ),
    ];
    for (emitters, topology, window, slow_ms) in cases {
        let what = format!("{emitters} emitters, {topology:?}, window {window}");
        let staged = matches!(topology, Topology::Staged { .. });
        let mut b = Pipeline::builder(&reg)
            .source_named(
                "uneven",
                serde_json::json!({"n": n, "slow": emitters - 1, "ms": slow_ms}),
            )
            .emitters(emitters)
            .ordered(true)
            .reorder_window(window)
            .batch_bytes(256)
            .step("jitter_fan")
            .topology(topology)
            .workers(2);
        if staged {
            b = b.step("inc");
        }
        let p = b.start().unwrap();
        let _g = guarded(&p);
        let out = within(Duration::from_secs(60), &what, move || {
            p.collect::<Result<Vec<Item>, _>>()
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        // Input order: record k of every emitter, then k + 1; each record's outputs together.
        let per = (n as usize).div_ceil(emitters);
        let mut want = Vec::new();
        for k in 0..per {
            for e in 0..emitters {
                let r = shmpipe::part_range(n as usize, e, emitters);
                if k < r.len() {
                    let rec = (r.start + k) as i64;
                    let shift = i64::from(staged);
                    want.extend((0..fan_count(rec, 3)).map(|j| (rec + shift, j)));
                }
            }
        }
        let got: Vec<(i64, i64)> = out
            .iter()
            .map(|it| (it.i64("n").unwrap(), it.i64("sub").unwrap()))
            .collect();
        assert_eq!(got, want, "{what}");
    }
}
