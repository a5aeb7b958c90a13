//! The harness side of `latency`: rounds of fresh pinger/echoer process pairs per peer, peers
//! rotated every round, a placement probe at the start of each round, percentiles over all
//! rounds, the idle-CPU measurement, and the goals.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::idle::IdleCpu;
use super::{LatencyArgs, Peer, Samples, Side};
use crate::BoxError;
use crate::goals::Goal;
use crate::pingpong::{self, Placement};
use crate::runner::{self, PROBE_BATCHES, PROBE_TRIPS, Proc, rotated, unique_name};
use crate::stats::Summary;

/// Round trips of one peer in one round.
#[derive(Debug, Clone)]
pub struct RoundResult {
    /// Round-trip times in ns (empty when the round failed).
    pub ns: Vec<u32>,
    /// Ping-pong probe of the round (median ns).
    pub probe_ns: f64,
}

/// Everything `latency` measured.
#[derive(Debug, Clone)]
pub struct LatencyRun {
    /// Per peer (in plan order), one entry per round.
    pub peers: Vec<(Peer, Vec<RoundResult>)>,
    /// First error of each peer that failed.
    pub errors: Vec<(Peer, String)>,
    /// Probe of each round, median ns.
    pub probes_ns: Vec<f64>,
    /// (pinger, echoer) CPUs.
    pub cores: (usize, usize),
    /// 1-minute load average at the start and the end.
    pub load: (f64, f64),
    /// The idle waiter, if measured.
    pub idle: Option<IdleCpu>,
}

/// Percentiles of one peer over every round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    /// Round trips measured.
    pub n: usize,
    /// Median, ns.
    pub p50: f64,
    /// 90th percentile, ns.
    pub p90: f64,
    /// 99th percentile, ns.
    pub p99: f64,
    /// 99.9th percentile, ns.
    pub p999: f64,
    /// Slowest round trip, ns.
    pub max: f64,
}

/// Nearest-rank percentile `q` (0..=1) of sorted samples.
fn rank(sorted: &[u32], q: f64) -> f64 {
    let n = sorted.len();
    let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
    f64::from(sorted[i])
}

impl Percentiles {
    /// Percentiles of `samples` (nearest rank); `None` when empty.
    pub fn of(samples: &[u32]) -> Option<Percentiles> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        Some(Percentiles {
            n: s.len(),
            p50: rank(&s, 0.5),
            p90: rank(&s, 0.9),
            p99: rank(&s, 0.99),
            p999: rank(&s, 0.999),
            max: rank(&s, 1.0),
        })
    }
}

impl LatencyRun {
    /// The rounds of `peer`, if it was planned.
    pub fn rounds(&self, peer: Peer) -> Option<&[RoundResult]> {
        self.peers
            .iter()
            .find(|(p, _)| *p == peer)
            .map(|(_, r)| r.as_slice())
    }

    /// Percentiles of `peer` over all its rounds.
    pub fn percentiles(&self, peer: Peer) -> Option<Percentiles> {
        let all: Vec<u32> = self
            .rounds(peer)?
            .iter()
            .flat_map(|r| r.ns.iter().copied())
            .collect();
        Percentiles::of(&all)
    }

    /// Median over rounds of `p50(a) / p50(b)` in the same round (rounds where both ran).
    pub fn p50_ratio(&self, a: Peer, b: Peer) -> Option<f64> {
        let (ra, rb) = (self.rounds(a)?, self.rounds(b)?);
        let ratios: Vec<f64> = ra
            .iter()
            .zip(rb)
            .filter_map(|(x, y)| {
                let (px, py) = (Percentiles::of(&x.ns)?, Percentiles::of(&y.ns)?);
                Some(px.p50 / py.p50)
            })
            .collect();
        Summary::of(&ratios).map(|s| s.median)
    }
}

fn worker(exe: &Path, peer: Peer, side: Side, name: &str, core: usize) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg("latency-worker")
        .args(["--peer", peer.name()])
        .args([
            "--side",
            match side {
                Side::Ping => "ping",
                Side::Echo => "echo",
                Side::Idle => "idle",
            },
        ])
        .args(["--name", name])
        .args(["--core", &core.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    cmd
}

/// One round of `peer`: a fresh echoer and pinger, `trips` measured round trips.
///
/// # Errors
/// A worker that failed or printed no samples (its shared memory is cleaned up).
pub fn measure_round(
    exe: &Path,
    peer: Peer,
    trips: u64,
    warmup: u64,
    cores: (usize, usize),
) -> Result<Vec<u32>, BoxError> {
    let name = unique_name();
    let run = || -> Result<Vec<u32>, BoxError> {
        let counts = |c: &mut Command| {
            c.args(["--trips", &trips.to_string()])
                .args(["--warmup", &warmup.to_string()]);
        };
        let mut e = worker(exe, peer, Side::Echo, &name, cores.1);
        counts(&mut e);
        let mut p = worker(exe, peer, Side::Ping, &name, cores.0);
        counts(&mut p);
        if matches!(peer, Peer::CacheLine | Peer::FutexSpin | Peer::FutexSleep) {
            // The raw peers share a memory file both get as their stdin.
            let file = crate::sys::shared_memfd(super::raw::FILE_LEN)?;
            p.stdin(Stdio::from(file.try_clone()?));
            e.stdin(Stdio::from(file));
        }
        let echoer = Proc::spawn(&mut e, "echoer")?;
        drop(e);
        p.stdout(Stdio::piped());
        let out = Proc::spawn(&mut p, "pinger")?.finish()?;
        echoer.finish()?;
        let text = String::from_utf8_lossy(&out);
        let line = text.lines().last().ok_or("the pinger printed nothing")?;
        let s: Samples = serde_json::from_str(line)?;
        if s.ns.len() as u64 != trips {
            return Err(format!("{} round trips measured, {trips} planned", s.ns.len()).into());
        }
        Ok(s.ns)
    };
    let result = run();
    if result.is_err() {
        let rdv = shm_ring::Rendezvous::default();
        for side in ["ping", "pong"] {
            let _ = rdv.remove_stale(&format!("{name}-{side}"));
        }
    }
    result
}

/// Blocks an shm-ring receiver for `idle` in a fresh process pinned to `core`.
///
/// # Errors
/// The worker failed.
pub fn measure_idle(exe: &Path, idle: Duration, core: usize) -> Result<IdleCpu, BoxError> {
    let mut c = worker(exe, Peer::ShmSpin, Side::Idle, &unique_name(), core);
    c.args(["--trips", "0", "--warmup", "0"])
        .args(["--idle-ms", &idle.as_millis().to_string()])
        .stdout(Stdio::piped());
    let out = Proc::spawn(&mut c, "idle waiter")?.finish()?;
    let text = String::from_utf8_lossy(&out);
    let line = text
        .lines()
        .last()
        .ok_or("the idle waiter printed nothing")?;
    Ok(serde_json::from_str(line)?)
}

/// Runs every peer for `rounds` rounds (rotated each round), then the idle waiter.
///
/// # Errors
/// Only when the worker executable cannot be found: failed peers are recorded and skipped.
pub fn run(
    peers: &[Peer],
    trips: u64,
    rounds: u32,
    warmup: u64,
    idle: Option<Duration>,
    progress: bool,
) -> Result<LatencyRun, BoxError> {
    let exe = runner::worker_exe()?;
    let cores = crate::sys::core_pair();
    let per_round = trips.div_ceil(u64::from(rounds)).max(1);
    let load_start = crate::sys::load_average();
    let mut out: Vec<(Peer, Vec<RoundResult>)> = peers.iter().map(|&p| (p, Vec::new())).collect();
    let mut errors: Vec<(Peer, String)> = Vec::new();
    let mut probes_ns = Vec::new();
    for round in 0..rounds as usize {
        let probe = pingpong::probe(cores, PROBE_BATCHES, PROBE_TRIPS).median;
        probes_ns.push(probe);
        if progress {
            eprintln!(
                "round {}/{rounds}: ping-pong probe {probe:.0} ns ({})",
                round + 1,
                Placement::classify(&[probe]).label()
            );
        }
        let order: Vec<usize> = (0..peers.len()).collect();
        for i in rotated(&order, round) {
            let peer = peers[i];
            let failed = errors.iter().any(|(p, _)| *p == peer);
            let ns = if failed {
                Vec::new()
            } else {
                match measure_round(&exe, peer, per_round, warmup, cores) {
                    Ok(ns) => ns,
                    Err(e) => {
                        eprintln!("{peer} failed: {e}");
                        errors.push((peer, e.to_string()));
                        Vec::new()
                    }
                }
            };
            out[i].1.push(RoundResult {
                ns,
                probe_ns: probe,
            });
        }
    }
    let idle = match idle {
        Some(d) => match measure_idle(&exe, d, cores.1) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("idle waiter failed: {e}");
                None
            }
        },
        None => None,
    };
    Ok(LatencyRun {
        peers: out,
        errors,
        probes_ns,
        cores,
        load: (load_start, crate::sys::load_average()),
        idle,
    })
}

/// The table: one line per peer with its percentiles and its p50 in each round.
pub fn table(run: &LatencyRun) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<16} {:>7} {:>8} {:>8} {:>8} {:>8} {:>9}   p50 per round (n = near, f = far)",
        "round trip, ns", "trips", "p50", "p90", "p99", "p99.9", "max"
    );
    for (peer, rounds) in &run.peers {
        let Some(p) = run.percentiles(*peer) else {
            let _ = writeln!(out, "  {:<16} failed", peer.name());
            continue;
        };
        let per_round: Vec<String> = rounds
            .iter()
            .map(|r| match Percentiles::of(&r.ns) {
                Some(q) => format!(
                    "{:.0}{}",
                    q.p50,
                    if r.probe_ns < pingpong::NEAR_LIMIT_NS {
                        "n"
                    } else {
                        "f"
                    }
                ),
                None => "-".into(),
            })
            .collect();
        let _ = writeln!(
            out,
            "  {:<16} {:>7} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>9.0}   {}",
            peer.name(),
            p.n,
            p.p50,
            p.p90,
            p.p99,
            p.p999,
            p.max,
            per_round.join(" ")
        );
    }
    out
}

/// Idle CPU a blocked receiver may use, % of a core (the issue: "stays ~0.3%").
pub const IDLE_CPU_TARGET_PCT: f64 = 0.5;
/// How close the sleeping round trip must stay to the raw futex's (the issue: "~1x", 0.99x
/// before issue 9).
pub const SLEEP_RATIO_TARGET: f64 = 1.1;

/// The latency goals this run has data for (iceoryx2's say "not measured" without it).
pub fn goals(run: &LatencyRun) -> Vec<Goal> {
    let iox_missing = if cfg!(feature = "iceoryx2") {
        "not measured: iceoryx2-poll not in --peers"
    } else {
        "not measured: iceoryx2 not built (--features iceoryx2)"
    };
    let mut g = Vec::new();
    for (spin, sleep) in [
        (Peer::ShmTypedSpin, Peer::ShmTypedSleep),
        (Peer::ShmSpin, Peer::ShmSleep),
    ] {
        let iox = if run.rounds(Peer::Iceoryx2Poll).is_some() {
            format!("not measured: {spin} not in --peers")
        } else {
            iox_missing.to_string()
        };
        g.push(
            Goal::at_most(
                format!("{spin} p50 <= 0.5x iceoryx2-poll p50"),
                run.p50_ratio(spin, Peer::Iceoryx2Poll),
                0.5,
            )
            .missing(iox),
        );
        g.push(
            Goal::at_most(
                format!("{spin} p50 <= 2x futex-spin p50"),
                run.p50_ratio(spin, Peer::FutexSpin),
                2.0,
            )
            .missing(format!("not measured: {spin} or futex-spin not in --peers")),
        );
        g.push(
            Goal::at_most(
                format!("{sleep} p50 ~ futex-sleep p50 (<= {SLEEP_RATIO_TARGET}x)"),
                run.p50_ratio(sleep, Peer::FutexSleep),
                SLEEP_RATIO_TARGET,
            )
            .missing(format!(
                "not measured: {sleep} or futex-sleep not in --peers"
            )),
        );
    }
    g.push(
        Goal::at_most(
            "idle CPU of a blocked shm-ring receiver, % of a core",
            run.idle.map(|c| c.percent()),
            IDLE_CPU_TARGET_PCT,
        )
        .unit("%")
        .missing("not measured (--idle 0)"),
    );
    g
}

/// The run's header line, the table with its legend and the idle receiver's line.
fn print_report(a: &LatencyArgs, peers: &[Peer], per_round: u64, run: &LatencyRun) {
    let probes: Vec<String> = run.probes_ns.iter().map(|p| format!("{p:.0}")).collect();
    println!(
        "one 16-float message there and back between two processes: pinger on CPU {}, echoer on \
         CPU {}; {} rounds of {per_round} round trips per peer (+{} warm-up), peers rotated each \
         round; cache-line ping-pong probe per round: {} ns -> placement {}; load average {:.2} \
         at start, {:.2} at end",
        run.cores.0,
        run.cores.1,
        a.rounds,
        a.warmup,
        probes.join(", "),
        Placement::classify(&run.probes_ns).label(),
        run.load.0,
        run.load.1
    );
    println!();
    print!("{}", table(run));
    let legend: Vec<String> = peers
        .iter()
        .map(|p| format!("{} = {}", p.name(), p.describe()))
        .collect();
    println!(
        "(percentiles over every round trip of every round, nearest rank, one clock read \
         included; rows: {})",
        legend.join("; ")
    );
    if let Some(c) = run.idle {
        println!(
            "\nidle: a blocked shm-ring receiver (default WaitConfig) used {:.3}% of a core over \
             {:.2} s ({:.2} ms of CPU by /proc/thread-self/schedstat; {} clock ticks by \
             /proc/self/stat)",
            c.percent(),
            c.wall_s,
            c.cpu_ns as f64 / 1e6,
            c.ticks
        );
    }
}

/// `latency`: prints the table, the idle line and the goals.
///
/// # Errors
/// Bad options, file errors, or peers that failed (after printing what was measured).
pub fn latency(a: &LatencyArgs) -> Result<(), BoxError> {
    let peers = if a.peers.is_empty() {
        Peer::built()
    } else {
        a.peers.clone()
    };
    if let Some(p) = peers.iter().find(|p| !p.is_built()) {
        return Err(format!("{p} is not in this build: rebuild with `--features iceoryx2`").into());
    }
    let mut csv = a
        .csv
        .as_ref()
        .map(|p| {
            std::fs::File::create(p).map_err(|e| format!("cannot create {}: {e}", p.display()))
        })
        .transpose()?;
    let idle = (!a.idle.is_zero()).then_some(a.idle);
    let per_round = a.trips.div_ceil(u64::from(a.rounds)).max(1);
    eprintln!(
        "shmpipe-bench latency: {} peers x {} rounds of {per_round} round trips (+{} warm-up), \
         then {:?} of an idle receiver",
        peers.len(),
        a.rounds,
        a.warmup,
        a.idle
    );
    let run = run(&peers, a.trips, a.rounds, a.warmup, idle, !a.no_progress)?;
    print_report(a, &peers, per_round, &run);
    println!("\nGoals (p50 ratios: median over rounds of the ratio within each round):");
    print!("{}", crate::goals::goals_text(&goals(&run)));
    if let (Some(f), Some(path)) = (csv.as_mut(), &a.csv) {
        write_csv(f, &run)?;
        println!("wrote {}", path.display());
    }
    if run.errors.is_empty() {
        Ok(())
    } else {
        let lines: Vec<String> = run
            .errors
            .iter()
            .map(|(p, e)| format!("  {p}: {e}"))
            .collect();
        Err(format!("{} peer(s) failed:\n{}", lines.len(), lines.join("\n")).into())
    }
}

/// CSV header of `latency --csv`.
pub const CSV_HEADER: &str = "peer,trips,p50_ns,p90_ns,p99_ns,p999_ns,max_ns,pingpong_ns,placement";

fn write_csv(w: &mut impl std::io::Write, run: &LatencyRun) -> std::io::Result<()> {
    writeln!(w, "{CSV_HEADER}")?;
    let probe = Summary::of(&run.probes_ns).map_or(f64::NAN, |s| s.median);
    for (peer, _) in &run.peers {
        if let Some(p) = run.percentiles(*peer) {
            writeln!(
                w,
                "{},{},{:.0},{:.0},{:.0},{:.0},{:.0},{probe:.0},{}",
                peer.name(),
                p.n,
                p.p50,
                p.p90,
                p.p99,
                p.p999,
                p.max,
                Placement::classify(&run.probes_ns).label()
            )?;
        }
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let xs: Vec<u32> = (1..=1000).collect();
        let p = Percentiles::of(&xs).unwrap();
        assert_eq!(
            (p.n, p.p50, p.p90, p.p99, p.p999, p.max),
            (1000, 500.0, 900.0, 990.0, 999.0, 1000.0)
        );
        assert_eq!(Percentiles::of(&[7]).unwrap().p999, 7.0);
        assert_eq!(Percentiles::of(&[]), None);
    }

    fn round(ns: &[u32], probe: f64) -> RoundResult {
        RoundResult {
            ns: ns.to_vec(),
            probe_ns: probe,
        }
    }

    fn sample() -> LatencyRun {
        LatencyRun {
            peers: vec![
                (
                    Peer::FutexSpin,
                    vec![round(&[100, 100, 300], 50.0), round(&[400, 400], 450.0)],
                ),
                (
                    Peer::ShmSpin,
                    vec![round(&[150, 150, 900], 50.0), round(&[1000, 1000], 450.0)],
                ),
                (Peer::FutexSleep, vec![round(&[], 50.0), round(&[], 450.0)]),
            ],
            errors: vec![(Peer::FutexSleep, "broken".into())],
            probes_ns: vec![50.0, 450.0],
            cores: (0, 1),
            load: (0.1, 0.2),
            idle: Some(IdleCpu {
                wall_s: 2.0,
                cpu_ns: 4_000_000,
                ticks: 0,
            }),
        }
    }

    #[test]
    fn ratios_pair_rounds() {
        let run = sample();
        // Round 1: 150 / 100 = 1.5; round 2: 1000 / 400 = 2.5 -> median 2.0.
        assert_eq!(run.p50_ratio(Peer::ShmSpin, Peer::FutexSpin), Some(2.0));
        assert_eq!(run.p50_ratio(Peer::ShmSpin, Peer::FutexSleep), None);
        assert_eq!(run.percentiles(Peer::ShmSpin).unwrap().max, 1000.0);
    }

    #[test]
    fn goals_and_table() {
        let run = sample();
        let g = goals(&run);
        let spin = g
            .iter()
            .find(|g| g.text.starts_with("shm-spin p50 <= 2x futex-spin"))
            .unwrap();
        assert_eq!((spin.measured, spin.met()), (Some(2.0), Some(true)));
        let iox = g.iter().find(|g| g.text.contains("iceoryx2")).unwrap();
        assert_eq!(iox.met(), None);
        let typed = g
            .iter()
            .find(|g| g.text.starts_with("shm-typed-spin p50 <= 2x"))
            .unwrap();
        assert!(typed.met().is_none() && typed.missing.contains("not in --peers"));
        let idle = g.iter().find(|g| g.text.contains("idle")).unwrap();
        assert!((idle.measured.unwrap() - 0.2).abs() < 1e-12 && idle.met() == Some(true));
        let t = table(&run);
        assert!(t.contains("futex-sleep      failed"), "{t}");
        assert!(t.contains("150n 1000f"), "{t}");
        let mut csv = Vec::new();
        write_csv(&mut csv, &run).unwrap();
        let csv = String::from_utf8(csv).unwrap();
        assert_eq!(
            csv.lines().count(),
            3,
            "header + the two peers that ran\n{csv}"
        );
        assert!(
            csv.contains("shm-spin,5,900,1000,1000,1000,1000,250,mixed"),
            "{csv}"
        );
    }
}
