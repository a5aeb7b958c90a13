//! The subcommands: plan, run, print, write files.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use crate::BoxError;
use crate::cli::{DemoArgs, PipelineArgs, RunArgs, TransportArgs};
use crate::pingpong::Placement;
use crate::pipebench::PipeConfig;
use crate::report::{self, Row};
use crate::runner::{self, Plan, RunResult};
use crate::stats::Summary;
use crate::transport::Transport;

/// Transports of `demo`: the three shm-ring policies, the Unix socket and memcpy.
pub const DEMO_TRANSPORTS: [Transport; 5] = [
    Transport::Memcpy,
    Transport::ShmCopy,
    Transport::ShmZeroCopy,
    Transport::ShmAdaptive,
    Transport::UnixSocket,
];

/// Rejects transports this binary was built without, naming the feature to enable.
///
/// # Errors
/// A message for the first transport that is not built.
pub fn check_built(transports: &[Transport]) -> Result<(), BoxError> {
    match transports.iter().find(|t| !t.is_built()) {
        Some(t) => Err(format!(
            "{t} is not in this build: rebuild with `--features {}`",
            t.name()
        )
        .into()),
        None => Ok(()),
    }
}

/// One line describing where the run happened.
pub fn placement_line(run: &RunResult) -> String {
    let probes: Vec<String> = run.probes_ns.iter().map(|ns| format!("{ns:.0}")).collect();
    let median = Summary::of(&run.probes_ns).map_or(f64::NAN, |s| s.median);
    format!(
        "producer on CPU {}, consumer on CPU {}; cache-line ping-pong {median:.0} ns per round trip \
         (rounds: {} ns) -> placement {}; load average {:.2} at start, {:.2} at end",
        run.cores.0,
        run.cores.1,
        probes.join(", "),
        Placement::classify(&run.probes_ns).label(),
        run.load.0,
        run.load.1
    )
}

fn plan(transports: Vec<Transport>, sizes: Vec<usize>, run: &RunArgs) -> Plan {
    Plan {
        transports,
        sizes,
        rounds: run.rounds,
        duration: run.duration,
        progress: !run.no_progress,
    }
}

/// Creates the CSV file (if asked) before anything is measured, so that a bad path fails at
/// once rather than after the run.
///
/// # Errors
/// The file cannot be created, or the plot path is not an `.svg`.
fn open_outputs(args: &RunArgs) -> Result<Option<File>, BoxError> {
    if let Some(plot) = &args.plot
        && !is_svg(plot)
    {
        return Err(format!(
            "--plot {}: only SVG is supported (use a .svg name)",
            plot.display()
        )
        .into());
    }
    args.csv
        .as_ref()
        .map(|path| {
            File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()).into())
        })
        .transpose()
}

fn write_outputs(
    args: &RunArgs,
    csv: Option<File>,
    title: &str,
    rows: &[Row],
) -> Result<(), BoxError> {
    if let (Some(f), Some(path)) = (csv, &args.csv) {
        report::write_csv(BufWriter::new(f), rows)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        crate::plot::write_svg(path, title, rows)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn failures(run: &RunResult) -> Result<(), BoxError> {
    let failed: Vec<String> = run
        .cells
        .iter()
        .filter_map(|c| {
            c.error
                .as_ref()
                .map(|e| format!("  {} x {}: {e}", c.name, c.elements))
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} measurement(s) failed:\n{}",
            failed.len(),
            failed.join("\n")
        )
        .into())
    }
}

fn estimate(plan: &Plan) -> f64 {
    let cells = plan.sizes.len() * (plan.transports.len() + 1);
    let per_cell = plan.duration + runner::warmup_for(plan.duration);
    plan.rounds as f64 * cells as f64 * (per_cell.as_secs_f64() + 0.03)
}

/// `transport`: sizes x transports.
///
/// # Errors
/// Bad options, failed measurements (after printing and writing what was measured), file errors.
pub fn transport(a: &TransportArgs) -> Result<(), BoxError> {
    let transports = if a.transports.is_empty() {
        Transport::built()
    } else {
        a.transports.clone()
    };
    check_built(&transports)?;
    let csv = open_outputs(&a.run)?;
    let plan = plan(transports, a.sizes.clone(), &a.run);
    eprintln!(
        "shmpipe-bench transport: {} sizes x {} transports x {} rounds of {:?} (about {:.0} s)",
        plan.sizes.len(),
        plan.transports.len(),
        plan.rounds,
        plan.duration,
        estimate(&plan)
    );
    let run = runner::run_plan(&plan)?;
    let rows = report::rows(&run);
    println!("{}", placement_line(&run));
    print!("{}", report::table(&rows));
    println!("{}", report::legend(&rows));
    println!("{}", transport_legend(&plan.transports));
    println!("\nGoals (medians of per-round ratios):");
    print!("{}", crate::goals::goals_text(&report::goals(&run)));
    let title = format!(
        "shmpipe transports: f32 arrays between two processes on 2 pinned cores \
         (ping-pong {:.0} ns, {}; load {:.1})",
        rows.first().map_or(f64::NAN, |r| r.pingpong_ns),
        Placement::classify(&run.probes_ns).label(),
        run.load.0.max(run.load.1)
    );
    write_outputs(&a.run, csv, &title, &rows)?;
    failures(&run)
}

/// The one-line legend of the transport rows of a table.
fn transport_legend(transports: &[Transport]) -> String {
    let parts: Vec<String> = transports
        .iter()
        .map(|t| format!("{} = {}", t.name(), t.describe()))
        .collect();
    format!("(rows: {})", parts.join("; "))
}

/// `demo`: 1M-float arrays, copy vs zero-copy vs adaptive with memcpy and a Unix socket.
///
/// # Errors
/// As [`transport`].
pub fn demo(a: &DemoArgs) -> Result<(), BoxError> {
    let csv = open_outputs(&a.run)?;
    let plan = plan(DEMO_TRANSPORTS.to_vec(), vec![a.elements], &a.run);
    eprintln!(
        "shmpipe demo: {} between two processes on two cores; {} rounds of {:?} (about {:.0} s)",
        report::size_label(a.elements),
        plan.rounds,
        plan.duration,
        estimate(&plan)
    );
    let mut run = runner::run_plan(&plan)?;
    // Rounds where another process held a CPU say little about shm-ring: add rounds (up to
    // twice the plan more) until every transport has a few with the CPUs free.
    let mut extra = 0;
    while crate::headline::fewest_free(&run, &DEMO_TRANSPORTS, a.elements)
        < crate::headline::WANT_FREE
        && extra < 2 * plan.rounds
    {
        let more = Plan {
            rounds: plan.rounds.min(2 * plan.rounds - extra),
            ..plan.clone()
        };
        eprintln!(
            "too few rounds with both CPUs free (load {:.1}): {} more",
            crate::sys::load_average(),
            more.rounds
        );
        run.extend(runner::run_plan(&more)?);
        extra += more.rounds;
    }
    let rows = report::rows(&run);
    println!("{}", placement_line(&run));
    print!("{}", report::table(&rows));
    println!("{}", report::legend(&rows));
    println!("{}", transport_legend(&plan.transports));
    println!();
    let n = a.elements;
    for line in crate::headline::lines(&run, n) {
        println!("{line}");
    }
    write_outputs(&a.run, csv, "shmpipe demo", &rows)?;
    failures(&run)
}

/// `pipeline`: the pipeline crate's array workload over the configuration grid, with memcpy
/// of the same sizes as the yardstick.
///
/// # Errors
/// As [`transport`].
pub fn pipeline(a: &PipelineArgs) -> Result<(), BoxError> {
    if a.workload == crate::cli::Workload::Timeseries {
        return timeseries(a);
    }
    let csv = open_outputs(&a.run)?;
    let reg = crate::pipebench::registry();
    let exe = runner::worker_exe()?;
    let cores = crate::sys::core_pair();
    let mut jobs: Vec<(String, Option<PipeConfig>)> = vec![("memcpy".to_string(), None)];
    for &workers in &a.workers {
        for &topology in &a.topology {
            for &batch_bytes in &a.batch_bytes {
                for &transfer in &a.transfer {
                    let cfg = PipeConfig {
                        workers,
                        topology,
                        batch_bytes,
                        transfer,
                    };
                    jobs.push((cfg.label(), Some(cfg)));
                }
            }
        }
    }
    let warmup = runner::warmup_for(a.run.duration);
    let per_cell = (a.run.duration + warmup).as_secs_f64() + 0.2;
    eprintln!(
        "shmpipe-bench pipeline: {} sizes x {} configurations x {} rounds of {:?} (about {:.0} s)",
        a.sizes.len(),
        jobs.len() - 1,
        a.run.rounds,
        a.run.duration,
        per_cell * (a.sizes.len() * jobs.len()) as f64 * f64::from(a.run.rounds)
    );
    let run = runner::run_grid(
        &jobs,
        &a.sizes,
        a.run.rounds,
        !a.run.no_progress,
        |job, elements| match job {
            None => {
                let spec = runner::Spec {
                    transport: Transport::Memcpy,
                    elements,
                    duration: a.run.duration,
                    warmup,
                    cores,
                };
                runner::measure(&exe, &spec).map(runner::Sample::from)
            }
            Some(cfg) => crate::pipebench::measure(&reg, cfg, elements, warmup, a.run.duration)
                .map(runner::Sample::rate_only),
        },
    );
    let rows = report::rows(&run);
    println!("{}", placement_line(&run));
    print!("{}", report::table(&rows));
    println!("{}", report::legend(&rows));
    println!(
        "(rows: memcpy = one thread copying the array, the yardstick; <topology> w<N> <batch> \
         <transfer> = the pipeline with steps check and scale, fused (every worker runs both) or \
         staged (one stage per step), N worker processes per stage, batches of about <batch> \
         bytes, arrays sent by copy, zero-copy, adaptive or over a Unix socket)"
    );
    let title = format!(
        "shmpipe pipeline, f32 arrays through check + scale steps (ping-pong {:.0} ns, {})",
        rows.first().map_or(f64::NAN, |r| r.pingpong_ns),
        Placement::classify(&run.probes_ns).label()
    );
    write_outputs(&a.run, csv, &title, &rows)?;
    failures(&run)
}

/// `pipeline --workload timeseries`: the GluonTS-style loader in one process and through the
/// pipeline with each `--workers` count, from JSON lines and from memory, interleaved rounds.
///
/// # Errors
/// As [`transport`].
pub fn timeseries(a: &PipelineArgs) -> Result<(), BoxError> {
    use crate::tsbench::{self, Input, TsJob};
    let csv = open_outputs(&a.run)?;
    let reg = crate::pipebench::registry();
    let data = tsbench::Dataset::generate(a.series)?;
    eprintln!(
        "shmpipe-bench pipeline --workload timeseries: {} hourly series ({:.1} MB of JSON), \
         {} passes per measurement, {} rounds",
        a.series,
        data.bytes as f64 / 1e6,
        a.epochs,
        a.run.rounds
    );
    // One short run to learn the batch geometry (floats per window) for the size column.
    let probe = TsJob {
        workers: None,
        input: Input::Memory,
    };
    let floats = tsbench::floats_per_window(&tsbench::run(&reg, &data.path, &probe, 1)?);
    let mut jobs = Vec::new();
    for input in [Input::JsonLines, Input::Memory] {
        let mut workers: Vec<Option<usize>> = vec![None];
        workers.extend(a.workers.iter().map(|&w| Some(w)));
        for w in workers {
            let job = TsJob { workers: w, input };
            jobs.push((job.label(), job));
        }
    }
    let run = runner::run_grid(
        &jobs,
        &[floats],
        a.run.rounds,
        !a.run.no_progress,
        |job, _| {
            tsbench::run(&reg, &data.path, job, a.epochs)
                .map(|s| runner::Sample::rate_only(s.windows_per_sec()))
        },
    );
    let rows = report::rows(&run);
    println!("{}", placement_line(&run));
    println!("(size = f32 elements per window of the batches; msgs/s = windows/s)");
    print!("{}", report::table(&rows));
    println!("{}", report::legend(&rows));
    println!(
        "(rows: json = JSON lines parsed on every pass (in the pipeline: emitters read the lines, \
         workers parse them); memory = parsed once at start, every pass reads the parsed entries; \
         in-process = the whole loader in this process; w<N> = through the pipeline with N worker \
         processes)"
    );
    println!();
    for input in ["json", "memory"] {
        for &w in &a.workers {
            let r = report::ratio(
                &run,
                &format!("timeseries {input} w{w}"),
                &format!("timeseries {input} in-process"),
                floats,
            );
            if let Some(r) = r {
                println!("pipeline with {w} workers vs one process, {input}: {r:.2}x");
            }
        }
    }
    let title = format!(
        "shmpipe-timeseries loader: windows/s (ping-pong {:.0} ns, {})",
        rows.first().map_or(f64::NAN, |r| r.pingpong_ns),
        Placement::classify(&run.probes_ns).label()
    );
    write_outputs(&a.run, csv, &title, &rows)?;
    failures(&run)
}

/// `plot`: redraws an SVG from a CSV file.
///
/// # Errors
/// File errors, a CSV that does not parse, a non-SVG output name.
pub fn plot(a: &crate::cli::PlotArgs) -> Result<(), BoxError> {
    if !is_svg(&a.out) {
        return Err(format!("--out {}: only SVG is supported", a.out.display()).into());
    }
    let text = std::fs::read_to_string(&a.csv)
        .map_err(|e| format!("cannot read {}: {e}", a.csv.display()))?;
    let rows = report::read_csv(&text).map_err(|e| format!("{}: {e}", a.csv.display()))?;
    crate::plot::write_svg(&a.out, &a.title, &rows)?;
    println!("wrote {}", a.out.display());
    Ok(())
}

/// Whether `path` looks like an SVG file name.
pub fn is_svg(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"))
}
