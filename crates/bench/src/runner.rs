//! The harness side: spawns worker processes (re-executing this binary), runs interleaved
//! rounds and collects the rates.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::BoxError;
use crate::meter::Outcome;
use crate::pingpong;
use crate::transport::{Layout, Transport};
use crate::worker::Role;

/// One measurement: a transport moving arrays of one size for one round.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Transport under test.
    pub transport: Transport,
    /// f32 elements per message.
    pub elements: usize,
    /// Measured time.
    pub duration: Duration,
    /// Unmeasured warm-up before it.
    pub warmup: Duration,
    /// (producer, consumer) CPUs.
    pub cores: (usize, usize),
}

/// Batches of the ping-pong probe at the start of each round (the median is kept).
pub const PROBE_BATCHES: usize = 7;
/// Round trips per probe batch: 0.35 ms at 50 ns, 2.3 ms at 450 ns.
pub const PROBE_TRIPS: u64 = 5_000;

/// Warm-up used for a measured `duration`: a quarter of it, at least 50 ms (enough to touch
/// every pool block of a 10M-float run).
pub fn warmup_for(duration: Duration) -> Duration {
    (duration / 4).max(Duration::from_millis(50))
}

/// A child process that is killed (and reaped) if dropped before it finished.
#[derive(Debug)]
pub(crate) struct Proc {
    role: &'static str,
    child: Option<Child>,
}

impl Proc {
    pub(crate) fn spawn(cmd: &mut Command, role: &'static str) -> Result<Proc, BoxError> {
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the {role}: {e}"))?;
        Ok(Proc {
            role,
            child: Some(child),
        })
    }

    /// Reads the child's stdout (if piped) to the end and waits for a successful exit.
    pub(crate) fn finish(mut self) -> Result<Vec<u8>, BoxError> {
        let child = self.child.as_mut().expect("finished once");
        let mut out = Vec::new();
        if let Some(mut so) = child.stdout.take() {
            so.read_to_end(&mut out)?;
        }
        let status = child.wait()?;
        self.child = None;
        if status.success() {
            Ok(out)
        } else {
            Err(format!("the {} exited with {status}", self.role).into())
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

static NEXT_NAME: AtomicU64 = AtomicU64::new(0);

/// A rendezvous name unique to this harness process and call.
pub fn unique_name() -> String {
    format!(
        "bench-{}-{}",
        std::process::id(),
        NEXT_NAME.fetch_add(1, Ordering::Relaxed)
    )
}

fn worker(exe: &Path, spec: &Spec, role: Role, name: &str) -> Command {
    let (core, peer_core) = match role {
        Role::Consumer => (spec.cores.1, spec.cores.0),
        _ => spec.cores,
    };
    let mut cmd = Command::new(exe);
    cmd.arg("worker")
        .args(["--role", role_name(role)])
        .args(["--transport", spec.transport.name()])
        .args(["--elements", &spec.elements.to_string()])
        .args([
            "--duration-ms",
            &spec.duration.as_millis().max(1).to_string(),
        ])
        .args(["--warmup-ms", &spec.warmup.as_millis().to_string()])
        .args(["--name", name])
        .args(["--core", &core.to_string()])
        .args(["--peer-core", &peer_core.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    cmd
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Producer => "producer",
        Role::Consumer => "consumer",
        Role::Solo => "solo",
    }
}

/// The executable workers are started from.
///
/// # Errors
/// When the current executable cannot be found.
pub fn worker_exe() -> Result<PathBuf, BoxError> {
    Ok(std::env::current_exe()?)
}

/// Runs one measurement in fresh worker processes and returns the consumer's outcome.
///
/// # Errors
/// A worker that could not start, failed, or printed no outcome. Its processes are killed and
/// reaped; shared-memory segments of dead producers are reclaimed.
pub fn measure(exe: &Path, spec: &Spec) -> Result<Outcome, BoxError> {
    let name = unique_name();
    let result = measure_inner(exe, spec, &name);
    if result.is_err() {
        crate::transports::cleanup_after_failure(spec.transport, &name);
    }
    result
}

fn measure_inner(exe: &Path, spec: &Spec, name: &str) -> Result<Outcome, BoxError> {
    let out = match spec.transport.layout() {
        Layout::Solo => {
            let mut cmd = worker(exe, spec, Role::Solo, name);
            cmd.stdout(Stdio::piped());
            Proc::spawn(&mut cmd, "worker")?.finish()?
        }
        Layout::Pair => {
            let mut pcmd = worker(exe, spec, Role::Producer, name);
            let mut ccmd = worker(exe, spec, Role::Consumer, name);
            ccmd.stdout(Stdio::piped());
            if spec.transport == Transport::Pipe {
                pcmd.stdout(Stdio::piped());
            }
            if spec.transport == Transport::RingMin {
                // The hand-written ring lives in a memory file both get as their stdin.
                let ring = crate::transports::ring::ring_bytes(
                    spec.elements,
                    crate::transports::channel::pool_size(spec.elements),
                );
                let file = crate::sys::shared_memfd(ring)?;
                pcmd.stdin(Stdio::from(file.try_clone()?));
                ccmd.stdin(Stdio::from(file));
            }
            let mut producer = Proc::spawn(&mut pcmd, "producer")?;
            drop(pcmd);
            if let Some(pid) = producer.child.as_ref().map(Child::id) {
                ccmd.args(["--peer-pid", &pid.to_string()]);
            }
            if let Some(pipe) = producer.child.as_mut().and_then(|c| c.stdout.take()) {
                ccmd.stdin(Stdio::from(pipe));
            }
            let consumer = Proc::spawn(&mut ccmd, "consumer")?;
            // The command holds our copy of the pipe's read end: drop it, or the producer
            // would never see the consumer go away.
            drop(ccmd);
            let out = consumer.finish()?;
            producer.finish()?;
            out
        }
    };
    let text = String::from_utf8_lossy(&out);
    let line = text
        .lines()
        .last()
        .ok_or_else(|| format!("{} worker printed no outcome", spec.transport))?;
    let outcome: Outcome = serde_json::from_str(line)
        .map_err(|e| format!("bad outcome `{line}` from {}: {e}", spec.transport))?;
    if outcome.messages == 0 {
        return Err(format!(
            "{} moved no message of {} floats in the measured window",
            spec.transport, spec.elements
        )
        .into());
    }
    Ok(outcome)
}

/// What to run: transports x sizes, interleaved over rounds.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Transports (memcpy is added when missing: every ratio is taken against it).
    pub transports: Vec<Transport>,
    /// Array sizes in f32 elements.
    pub sizes: Vec<usize>,
    /// Number of interleaved rounds.
    pub rounds: u32,
    /// Measured time per cell and round.
    pub duration: Duration,
    /// Whether to draw a progress bar.
    pub progress: bool,
}

/// Rates of one (transport or configuration, size) cell over the rounds.
#[derive(Debug, Clone)]
pub struct Cell {
    /// Transport or configuration name (as in tables and CSV).
    pub name: String,
    /// f32 elements per message.
    pub elements: usize,
    /// Messages per second, indexed by round (NaN where the measurement failed).
    pub rates: Vec<f64>,
    /// Share of each round's window the workers lost to waiting for a CPU or to steal
    /// ([`crate::contention`]), indexed by round (NaN where not measured).
    pub contended: Vec<f64>,
    /// The first error, after which the cell is skipped.
    pub error: Option<String>,
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// One cell per (transport, size), in plan order (size-major).
    pub cells: Vec<Cell>,
    /// Ping-pong round trip (median ns) measured at the start of each round.
    pub probes_ns: Vec<f64>,
    /// (producer, consumer) CPUs.
    pub cores: (usize, usize),
    /// 1-minute load average at the start and at the end of the run.
    pub load: (f64, f64),
}

impl RunResult {
    /// Appends the rounds of `more` (a run of the same plan) to this one.
    pub fn extend(&mut self, more: RunResult) {
        for (c, m) in self.cells.iter_mut().zip(more.cells) {
            c.rates.extend(m.rates);
            c.contended.extend(m.contended);
            c.error = c.error.take().or(m.error);
        }
        self.probes_ns.extend(more.probes_ns);
        self.load.1 = more.load.1;
    }

    /// The cell named `name` at `elements`, if it was planned.
    pub fn cell(&self, name: &str, elements: usize) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.name == name && c.elements == elements)
    }
}

/// The order of `items` in round `round`: rotated by one each round, so that no transport
/// always runs first or right after a given other one.
pub fn rotated<T: Clone>(items: &[T], round: usize) -> Vec<T> {
    let mut v = items.to_vec();
    if !v.is_empty() {
        let k = round % v.len();
        v.rotate_left(k);
    }
    v
}

/// What one measurement returns to [`run_grid`].
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Messages (items) per second.
    pub rate: f64,
    /// Share of the window lost to CPU waits or steal (NaN if not measured).
    pub contended: f64,
}

impl Sample {
    /// A rate without a contention figure.
    pub fn rate_only(rate: f64) -> Sample {
        Sample {
            rate,
            contended: f64::NAN,
        }
    }
}

impl From<Outcome> for Sample {
    fn from(o: Outcome) -> Sample {
        Sample {
            rate: o.rate(),
            contended: o.contended,
        }
    }
}

/// Runs `plan` and returns the per-round rates of every cell.
///
/// # Errors
/// Only when the worker executable cannot be found: failed measurements are recorded in their
/// cell and the run goes on.
pub fn run_plan(plan: &Plan) -> Result<RunResult, BoxError> {
    let exe = worker_exe()?;
    let cores = crate::sys::core_pair();
    let mut transports = plan.transports.clone();
    if !transports.contains(&Transport::Memcpy) {
        transports.insert(0, Transport::Memcpy);
    }
    let jobs: Vec<(String, Transport)> = transports
        .iter()
        .map(|t| (t.name().to_string(), *t))
        .collect();
    let warmup = warmup_for(plan.duration);
    Ok(run_grid(
        &jobs,
        &plan.sizes,
        plan.rounds,
        plan.progress,
        |&transport, elements| {
            if !transport.supports(elements) {
                // No row: a NaN rate has no summary.
                return Ok(Sample::rate_only(f64::NAN));
            }
            let spec = Spec {
                transport,
                elements,
                duration: plan.duration,
                warmup,
                cores,
            };
            measure(&exe, &spec).map(Sample::from)
        },
    ))
}

/// Runs every named job at every size for `rounds` interleaved rounds: a ping-pong probe at
/// the start of each round, then sizes in order and the jobs rotated by one each round.
/// `measure` returns messages (items) per second; a job that fails once is recorded with its
/// error and skipped afterwards.
pub fn run_grid<J>(
    jobs: &[(String, J)],
    sizes: &[usize],
    rounds: u32,
    progress: bool,
    mut measure: impl FnMut(&J, usize) -> Result<Sample, BoxError>,
) -> RunResult {
    let cores = crate::sys::core_pair();
    let mut cells: Vec<Cell> = sizes
        .iter()
        .flat_map(|&elements| {
            jobs.iter().map(move |(name, _)| Cell {
                name: name.clone(),
                elements,
                rates: Vec::new(),
                contended: Vec::new(),
                error: None,
            })
        })
        .collect();
    let total = u64::from(rounds) * cells.len() as u64;
    let bar = if progress {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let order: Vec<usize> = (0..jobs.len()).collect();
    let load_start = crate::sys::load_average();
    let mut probes_ns = Vec::new();
    for round in 0..rounds as usize {
        let probe = pingpong::probe(cores, PROBE_BATCHES, PROBE_TRIPS);
        probes_ns.push(probe.median);
        for (s, &elements) in sizes.iter().enumerate() {
            for j in rotated(&order, round) {
                let (name, job) = &jobs[j];
                bar.set_message(format!(
                    "round {}/{rounds} {name} x {elements} (ping-pong {:.0} ns)",
                    round + 1,
                    probe.median
                ));
                let cell = &mut cells[s * jobs.len() + j];
                let sample = if cell.error.is_some() {
                    Sample::rate_only(f64::NAN)
                } else {
                    match measure(job, elements) {
                        Ok(s) => s,
                        Err(e) => {
                            bar.println(format!("{name} x {elements} failed: {e}"));
                            cell.error = Some(e.to_string());
                            Sample::rate_only(f64::NAN)
                        }
                    }
                };
                cell.rates.push(sample.rate);
                cell.contended.push(sample.contended);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    RunResult {
        cells,
        probes_ns,
        cores,
        load: (load_start, crate::sys::load_average()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_moves_every_item_to_the_front_once() {
        let items = ["a", "b", "c"];
        assert_eq!(rotated(&items, 0), vec!["a", "b", "c"]);
        assert_eq!(rotated(&items, 1), vec!["b", "c", "a"]);
        assert_eq!(rotated(&items, 3), vec!["a", "b", "c"]);
        assert!(rotated::<u8>(&[], 2).is_empty());
    }

    #[test]
    fn warmup_is_a_quarter_with_a_floor() {
        assert_eq!(
            warmup_for(Duration::from_secs(1)),
            Duration::from_millis(250)
        );
        assert_eq!(
            warmup_for(Duration::from_millis(40)),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn grid_interleaves_rounds_and_skips_failed_jobs() {
        let jobs = vec![
            ("a".to_string(), 1),
            ("b".to_string(), 2),
            ("bad".to_string(), 3),
        ];
        let mut calls = Vec::new();
        let run = run_grid(&jobs, &[10, 20], 2, false, |&j, n| {
            calls.push((j, n));
            if j == 3 {
                Err("broken".into())
            } else {
                Ok(Sample::rate_only((j * n) as f64))
            }
        });
        // Round 0 in job order, round 1 rotated by one; "bad" is tried once only.
        assert_eq!(
            calls,
            vec![
                (1, 10),
                (2, 10),
                (3, 10),
                (1, 20),
                (2, 20),
                (3, 20),
                (2, 10),
                (1, 10),
                (2, 20),
                (1, 20)
            ]
        );
        assert_eq!(run.cell("b", 20).unwrap().rates, vec![40.0, 40.0]);
        let bad = run.cell("bad", 10).unwrap();
        assert_eq!(bad.error.as_deref(), Some("broken"));
        assert!(bad.rates.iter().all(|r| r.is_nan()) && bad.rates.len() == 2);
        assert_eq!(run.probes_ns.len(), 2);
    }

    #[test]
    fn names_are_unique() {
        assert_ne!(unique_name(), unique_name());
    }
}
