//! Chaos: processes of a pipeline SIGKILLed at random instants (start-up included), and a
//! hostile process scribbling on live channels. Every run ends promptly with an error or with
//! exactly the expected output; nothing is left behind; nothing panics, hangs or crashes.

mod common;

use std::collections::BTreeSet;
use std::io::BufRead;
use std::os::unix::fs::FileExt;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use rustix::process::Signal;
use shmpipe::{Epochs, Error, Pipeline, Topology};

/// A small deterministic generator (xorshift64*), so every run of the test is the same.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const ITEMS: i64 = 120;
const RUN_ENV: &str = "SHMPIPE_CHAOS_RUN";

/// In a helper: one small pipeline (its shape from the mode: a source with one or two
/// emitters, or enqueue mode where the parent feeds the items and closes the input at once),
/// its outputs' `n` printed at the end (`END n,n,...`), or `ERROR ...`.
fn helper_run(mode: &str) {
    let reg = registry();
    let staged = mode.contains("staged");
    let enqueue = mode.contains("enqueue");
    let emitters = if mode.contains("e2") { 2 } else { 1 };
    let mut b = Pipeline::builder(&reg);
    if !enqueue {
        b = b
            .source_named("range", serde_json::json!({"n": ITEMS, "len": 8}))
            .emitters(emitters);
    }
    let b = b
        .step("inc")
        .step_with("sleep_ms", serde_json::json!({"ms": 1}))
        .workers(2)
        .batch_bytes(256)
        .topology(if staged {
            Topology::Staged { workers: vec![] }
        } else {
            Topology::Fused
        });
    let mut p = match b.start() {
        Ok(p) => p,
        Err(e) => {
            println!("ERROR start: {e}");
            return;
        }
    };
    print_ready(&p);
    if enqueue {
        for it in range_items(ITEMS, 8) {
            if let Err(e) = p.enqueue(it) {
                println!("ERROR enqueue: {e}");
                return;
            }
        }
        p.close_input();
    }
    let mut ns = Vec::new();
    for r in p {
        match r {
            Ok(it) => ns.push(it.i64("n").unwrap_or(-1)),
            Err(e) => {
                println!("ERROR {e}");
                return;
            }
        }
    }
    ns.sort_unstable();
    let ns: Vec<String> = ns.iter().map(i64::to_string).collect();
    println!("END {}", ns.join(","));
}

/// A helper process whose stdout lines arrive on a channel (so every wait has a bound).
struct Run {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    pids: Vec<u32>,
    /// A verdict line that came before READY.
    early: Option<String>,
}

impl Run {
    fn spawn(mut cmd: std::process::Command) -> Run {
        let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Run {
            child,
            lines,
            pids: Vec::new(),
            early: None,
        }
    }

    /// Waits for READY (and its pids); a verdict before it is kept for [`Run::verdict`].
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Ok(l) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            if let Some(rest) = l.strip_prefix("READY ") {
                let pids = rest.split_whitespace().nth(1).unwrap_or("");
                self.pids = pids.split(',').filter_map(|p| p.parse().ok()).collect();
                return true;
            }
            if l.starts_with("END") || l.starts_with("ERROR") {
                self.early = Some(l);
                return false;
            }
        }
        false
    }

    /// The END or ERROR line, if one comes within `limit` (or the helper closes its output).
    fn verdict(&mut self, limit: Duration) -> Option<String> {
        if let Some(v) = self.early.take() {
            return Some(v);
        }
        let deadline = Instant::now() + limit;
        while let Ok(l) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            if l.starts_with("END") || l.starts_with("ERROR") {
                return Some(l);
            }
        }
        None
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        drop(KillOnDrop(self.pids.clone()));
    }
}

/// Picks the process to SIGKILL in helper run `h` of `mode`, and waits for the moment: half
/// of the kills land during start-up (children found through /proc), half after READY, at a
/// random instant within the run. Returns the victim's pid and kind (0: parent, 1: emitter,
/// 2: worker; as drawn, before a missing emitter makes it a worker).
fn pick_victim(h: &mut Run, rng: &mut Rng, mode: &str) -> (u32, u64) {
    let during_startup = rng.below(2) == 0;
    let victim_kind = rng.below(3); // 0: parent, 1: emitter, 2: worker
    let delay = Duration::from_micros(rng.below(if during_startup { 5_000 } else { 80_000 }));
    let victim = if during_startup {
        let t0 = Instant::now();
        let mut kids = Vec::new();
        while kids.is_empty() && t0.elapsed() < Duration::from_secs(5) {
            kids = proc::children_of(h.child.id());
            std::thread::yield_now();
        }
        std::thread::sleep(delay);
        match victim_kind {
            0 => h.child.id(),
            _ if kids.is_empty() => h.child.id(),
            _ => kids[rng.below(kids.len() as u64) as usize],
        }
    } else if !h.wait_ready() {
        // Ended before READY (e.g. a start-up error): nothing to kill.
        h.child.id()
    } else {
        std::thread::sleep(delay);
        let emitters = match mode {
            "fused-e2" => 2,
            "enqueue" | "enqueue-staged" => 0,
            _ => 1,
        };
        let victim_kind = if emitters == 0 && victim_kind == 1 {
            2
        } else {
            victim_kind
        };
        match victim_kind {
            0 => h.child.id(),
            1 => h.pids[rng.below(emitters) as usize],
            _ => {
                h.pids[emitters as usize
                    + rng.below((h.pids.len() - emitters as usize) as u64) as usize]
            }
        }
    };
    (victim, victim_kind)
}

/// Asserts that within 2 s no process of helper run `run` (`mode`) is left: none carries
/// `RUN_ENV=token`.
fn assert_runs_processes_gone(token: &str, run: u32, mode: &str) {
    let t0 = Instant::now();
    let mut left = proc::processes_with_env(RUN_ENV, token);
    while !left.is_empty() && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
        left = proc::processes_with_env(RUN_ENV, token);
    }
    assert!(
        left.is_empty(),
        "run {run} ({mode}): stray processes {left:?}"
    );
}

/// Issue 8: 200 pipeline runs, each SIGKILLing one process (the pipeline's parent, an
/// emitter or a worker, chosen with a fixed seed) at a random instant, during start-up or
/// while data flows. Every run ends within 2 s of the kill with an error or with exactly the
/// expected outputs; no process and no `/dev/shm` entry survives the loop.
#[test]
fn sigkill_one_process_at_a_random_instant_200_times() {
    let reg = registry();
    shmpipe::init(&reg);
    if let Some(mode) = helper_mode() {
        return helper_run(&mode);
    }
    let token = format!(
        "{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    );
    let shm_before = shm_entries("");
    let expected: Vec<i64> = (1..=ITEMS).collect();
    let mut rng = Rng(0x05ee_d0fc_4a05);
    let (mut ended, mut failed, mut killed_parent) = (0, 0, 0);
    let t_all = Instant::now();
    let mut helpers = Vec::new();
    for run in 0..200 {
        let mode = match rng.below(5) {
            0 => "staged",
            1 => "fused-e2",
            2 => "enqueue",
            3 => "enqueue-staged",
            _ => "fused",
        };
        let mut cmd = helper_command("sigkill_one_process_at_a_random_instant_200_times", mode);
        cmd.env(RUN_ENV, &token).stderr(Stdio::null());
        let mut h = Run::spawn(cmd);
        helpers.push(h.child.id());
        let (victim, victim_kind) = pick_victim(&mut h, &mut rng, mode);
        signal(victim, Signal::KILL);
        let t_kill = Instant::now();
        if victim == h.child.id() {
            killed_parent += 1;
        }
        // The helper prints its verdict and exits (or is dead already).
        let verdict = h.verdict(Duration::from_secs(2));
        let status = h.child.wait().unwrap();
        let took = t_kill.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "run {run} ({mode}, victim {victim_kind}): ended {took:?} after the kill ({verdict:?}, {status})"
        );
        match verdict.as_deref() {
            Some(v) if v.starts_with("END") => {
                let got: Vec<i64> = v[3..]
                    .trim()
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse().unwrap())
                    .collect();
                assert_eq!(got, expected, "run {run} ({mode}): wrong output");
                ended += 1;
            }
            Some(v) if v.starts_with("ERROR") => failed += 1,
            None if victim == h.child.id() => {}
            other => panic!("run {run} ({mode}): no verdict: {other:?} ({status})"),
        }
        // Whatever happened, the pipeline's processes are gone within 2 s of the kill.
        assert_runs_processes_gone(&token, run, mode);
    }
    eprintln!(
        "200 runs in {:?}: {ended} complete, {failed} errors, {killed_parent} parents killed",
        t_all.elapsed()
    );
    let new: BTreeSet<String> = shm_entries("").difference(&shm_before).cloned().collect();
    let ours: Vec<&String> = new
        .iter()
        .filter(|n| helpers.iter().any(|p| n.contains(&format!("{p}x"))))
        .collect();
    assert!(ours.is_empty(), "left in /dev/shm: {ours:?}");
    assert!(ended > 0 && failed > 0, "{ended} complete, {failed} errors");
}

/// The channels mapped by `workers`, opened for writing: the emitter's channels to them (their
/// inputs) and their own channels to us.
fn worker_channels(workers: &[u32]) -> Vec<std::fs::File> {
    workers
        .iter()
        .flat_map(|&w| proc::memfds(w))
        .filter_map(|p| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .ok()
        })
        .collect()
}

/// A thread that writes 1 to 16 random bytes at random offsets of `files` (mostly their first
/// 64 KiB: headers and rings) until `stop`, counting its writes in `writes`.
fn scribble(
    files: Vec<std::fs::File>,
    stop: Arc<AtomicBool>,
    writes: Arc<AtomicU64>,
    mut rng: Rng,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let f = &files[rng.below(files.len() as u64) as usize];
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            if len == 0 {
                break;
            }
            // Mostly the first 64 KiB (headers and rings), sometimes anywhere.
            let span = if rng.below(4) == 0 {
                len
            } else {
                len.min(64 << 10)
            };
            let at = rng.below(span);
            let n = (1 + rng.below(16)).min(len - at) as usize;
            let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            let _ = f.write_all_at(&bytes, at);
            writes.fetch_add(1, Ordering::Relaxed);
            if rng.below(8) == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    })
}

/// Issue 8: a hostile process writes random bytes at random offsets of live pipeline channels
/// (opened through `/proc/<pid>/fd`, as root can) while the consumer receives for several
/// seconds: the consumer (this process, debug profile) only ever gets data or errors, never
/// a panic, a hang or a crash; children die of errors, not of signals or panics.
#[test]
fn scribbling_on_live_channels_gives_data_or_errors() {
    let reg = registry();
    shmpipe::init(&reg);
    let t_all = Instant::now();
    let mut rng = Rng(0xbad_5eed);
    let (mut runs, mut errors, mut items) = (0u64, 0u64, 0u64);
    while t_all.elapsed() < Duration::from_secs(4) {
        let p = Pipeline::builder(&reg)
            .source_named("range", serde_json::json!({"n": 50, "len": 64}))
            .epochs(Epochs::Cycle)
            .emitters(1)
            .step("inc")
            .workers(2)
            .batch_bytes(512)
            .start()
            .unwrap();
        let (_, pids, _g) = guarded(&p);
        let files = worker_channels(&pids[1..]);
        assert!(!files.is_empty(), "no channel found to scribble on");
        // Sealed: nobody can shrink (SIGBUS for the other side) or grow a live channel.
        for f in &files {
            let len = f.metadata().unwrap().len();
            assert!(f.set_len(len / 2).is_err(), "a channel could be truncated");
            assert!(f.set_len(len + 4096).is_err(), "a channel could be grown");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let writes = Arc::new(AtomicU64::new(0));
        let scribbler = scribble(
            files,
            Arc::clone(&stop),
            Arc::clone(&writes),
            Rng(rng.next() | 1),
        );
        // Receive for up to a second per pipeline; no call may hang.
        let (n, err) = within(
            Duration::from_secs(10),
            "receiving under scribbling",
            move || {
                let mut p = p;
                let t0 = Instant::now();
                let mut n = 0u64;
                while t0.elapsed() < Duration::from_secs(1) {
                    match p.dequeue() {
                        Ok(Some(_)) => n += 1,
                        Ok(None) => return (n, None),
                        Err(e) => return (n, Some(e)),
                    }
                }
                (n, None)
            },
        );
        stop.store(true, Ordering::Relaxed);
        scribbler.join().unwrap();
        assert!(writes.load(Ordering::Relaxed) > 0);
        items += n;
        runs += 1;
        if let Some(e) = err {
            errors += 1;
            // A child may die of what it read, but by an error exit, never by a signal (a
            // crash) or a panic's exit code.
            if let Error::ProcessDied { status, role, .. } = &e {
                assert!(
                    !status.contains("signal") && !status.contains("code 101"),
                    "{role} crashed: {status}"
                );
            }
        }
        assert!(wait_gone(&pids, Duration::from_secs(2)).is_some());
    }
    eprintln!("{runs} pipelines, {errors} ended in errors, {items} items received");
    assert!(runs >= 2);
}
