//! Training-style loading of GluonTS-format data with N worker processes.
//!
//! Generates a synthetic hourly dataset in a temporary directory (removed at the
//! end), then runs the DeepAR-style chain (context 168, prediction 24, batch 32)
//! four ways, one table row each (see [`ROWS`]): from JSON lines parsed on every
//! pass (the emitter reads the file and ships lines, or each worker reads its
//! byte ranges itself) and from series parsed once and kept in memory (by the
//! emitter, or by every worker). Prints windows/s, MB/s and the worker count for
//! each, with a progress bar.
//!
//! ```text
//! cargo run --release -p shmpipe-timeseries --example timeseries_loader -- --workers 2
//! cargo run --release -p shmpipe-timeseries --example timeseries_loader -- --long
//! ```

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use shmpipe_timeseries::pipeline::{Layout, register, run_workload_with};
use shmpipe_timeseries::synth::{GenConfig, write_file};
use shmpipe_timeseries::workload::{
    ChainConfig, WorkloadConfig, WorkloadSource, WorkloadStats, run_in_process,
};

/// The four rows: label, what it measures.
const ROWS: [(&str, &str); 4] = [
    (
        "json: emitter reads, workers parse",
        "the emitter reads the file and sends raw lines; workers parse them every pass",
    ),
    (
        "json: workers read + parse",
        "the emitter sends byte ranges only; each worker reads and parses its lines every pass",
    ),
    (
        "memory: emitter parsed once",
        "the emitter parses the file once, then sends parsed series every pass",
    ),
    (
        "memory: each worker parsed once",
        "every worker parses the whole file once and keeps it; the emitter sends line numbers",
    ),
];

/// Loads batches of training windows from a generated dataset (or `--data`) and
/// reports throughput.
///
/// Four rows, the same chain and data each time:
///   json: emitter reads, workers parse  -- raw lines shipped, parsed on every pass
///   json: workers read + parse          -- byte ranges shipped, workers read the file
///   memory: emitter parsed once         -- parsed series shipped on every pass
///   memory: each worker parsed once     -- line numbers shipped, each worker has a copy
/// With --in-process everything runs in this process (no emitter, no workers).
#[derive(Parser, Debug)]
#[command(verbatim_doc_comment)]
struct Args {
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Emitter processes.
    #[arg(long, default_value_t = 1)]
    emitters: usize,
    /// Bytes of series (JSON lines, or parsed arrays) per record from emitter to worker.
    #[arg(long, default_value_t = shmpipe_timeseries::pipeline::DEFAULT_GROUP_BYTES)]
    group_bytes: usize,
    /// Series in the generated dataset (default 4000, or 2000 with --long).
    #[arg(long)]
    series: Option<usize>,
    /// Generate long series with full-precision floats: 500-5,000 points, 1%
    /// missing, 17-digit floats as Python's json writes float64 (~100 MB).
    #[arg(long)]
    long: bool,
    /// Passes when parsing JSON lines on every pass.
    #[arg(long, default_value_t = 4)]
    json_epochs: usize,
    /// Passes over the parsed, in-memory entries.
    #[arg(long, default_value_t = 12)]
    memory_epochs: usize,
    /// Windows per batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Past window.
    #[arg(long, default_value_t = 168)]
    context: usize,
    /// Future window.
    #[arg(long, default_value_t = 24)]
    prediction: usize,
    /// Use the step-by-step chain instead of the fused one (same outputs).
    #[arg(long)]
    unfused: bool,
    /// Staged layout: workers for the parse, transform and batch stages, e.g. `1,1,1`
    /// (default: one fused step in `--workers` workers).
    #[arg(long, value_delimiter = ',')]
    staged: Option<Vec<usize>>,
    /// Run the chain in this process instead of a pipeline.
    #[arg(long)]
    in_process: bool,
    /// Use this JSON-lines file instead of generating one.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Run only these rows (1-4 in the order of the table; 1-2 with --in-process),
    /// e.g. `--rows 2,4` for the two rows of issue 11's goals.
    #[arg(long, value_delimiter = ',')]
    rows: Option<Vec<usize>>,
}

/// Removes the temporary directory on drop, also on error or panic.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bar(expected: u64, label: &str) -> ProgressBar {
    let pb = ProgressBar::new(expected);
    pb.set_style(
        ProgressStyle::with_template(
            "{prefix:>34} [{bar:30}] {pos}/{len} windows ({per_sec}, eta {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_prefix(label.to_owned());
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// One row: windows/s, MB/s of batches and of JSON, workers.
fn report(label: &str, s: &WorkloadStats, workers: &str) {
    let cpu = if s.cpu_time.is_zero() {
        String::new()
    } else {
        format!(" ({:.0}/CPU-s)", s.windows_per_cpu_sec())
    };
    let json = if s.input_bytes > 0 {
        format!("{:.0}", s.input_mb_per_sec())
    } else {
        "-".to_owned()
    };
    println!(
        "{label:>34} | {:>9.0} windows/s{cpu} | {:>7.1} MB/s batches | {json:>5} MB/s JSON | {workers}",
        s.windows_per_sec(),
        s.batch_mb_per_sec(),
    );
}

/// The JSON-lines file to read: `--data`, or `series` series generated into a temporary
/// directory (removed when the returned guard drops).
fn dataset(
    a: &Args,
    series: usize,
) -> Result<(PathBuf, Option<TempDir>), Box<dyn std::error::Error>> {
    if let Some(p) = &a.data {
        return Ok((p.clone(), None));
    }
    let dir = std::env::temp_dir().join(format!("shmpipe-ts-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let guard = TempDir(dir.clone());
    let path = dir.join("train.jsonl");
    let base = if a.long {
        GenConfig::long_series()
    } else {
        GenConfig {
            num_series: 4000,
            ..GenConfig::default()
        }
    };
    let g = GenConfig {
        num_series: series,
        seed: a.seed,
        ..base
    };
    let bytes = write_file(&g, &path)?;
    println!(
        "generated {} hourly series ({}..={} points, {:.0}% missing, {}), {:.1} MB",
        g.num_series,
        g.min_len,
        g.max_len,
        g.missing_prob * 100.0,
        if a.long {
            "17-digit floats"
        } else {
            "3-decimal floats"
        },
        bytes as f64 / 1e6
    );
    Ok((path, Some(guard)))
}

/// The rows of the table to run (indices into [`ROWS`]): rows 2 and 4 equal rows 1 and 3 in
/// one process; `--rows` picks some of them.
fn chosen_rows(a: &Args) -> Vec<usize> {
    let mut rows = if a.in_process {
        vec![0, 2]
    } else {
        vec![0, 1, 2, 3]
    };
    if let Some(only) = &a.rows {
        let all = rows.clone();
        rows.retain(|r| {
            let pos = all.iter().position(|x| x == r).expect("a row of the table");
            only.contains(&(pos + 1))
        });
    }
    rows
}

/// The legend line and one line per row to run.
fn print_legend(in_process: bool, rows: &[usize]) {
    println!(
        "legend: windows/s of training windows (wall clock); MB/s of stacked batches and of JSON read; rows:"
    );
    for &r in rows {
        let (label, what) = match (in_process, r) {
            (true, 0) => (
                "json: this process parses",
                "this process reads and parses the file every pass",
            ),
            (true, _) => (
                "memory: this process parsed once",
                "this process parses the file once, then reads memory",
            ),
            (false, _) => ROWS[r],
        };
        println!("  {label}: {what}");
    }
}

/// Prints the error's message (not its `Debug` form) and exits with status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("timeseries_loader: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let reg = register(shmpipe::Registry::new());
    shmpipe::init(&reg); // worker and emitter processes run here and exit
    let a = Args::parse();

    // Windows per pass, for the progress bars (about one per series).
    let series = a.series.unwrap_or(if a.long { 2000 } else { 4000 });
    let (path, _guard) = dataset(&a, series)?;
    let chain = ChainConfig {
        context_length: a.context,
        prediction_length: a.prediction,
        fused: !a.unfused,
        ..ChainConfig::default()
    };
    println!(
        "chain: DeepAR-style, context {}, prediction {}, batch {}, {}",
        a.context,
        a.prediction,
        a.batch,
        match (&a.staged, a.in_process) {
            (_, true) => "in this process".to_owned(),
            (Some(w), false) => format!("staged: {w:?} workers for parse, transform, batch"),
            (None, false) => format!("{} worker processes", a.workers),
        }
    );
    let sources = [
        WorkloadSource::JsonLines(path.clone()),
        WorkloadSource::JsonLinesInWorkers(path.clone()),
        WorkloadSource::ParsedOnce(path.clone()),
        WorkloadSource::InWorkers(path.clone()),
    ];
    let epochs = [
        a.json_epochs,
        a.json_epochs,
        a.memory_epochs,
        a.memory_epochs,
    ];
    let workers = if a.in_process {
        "in this process".to_owned()
    } else if let Some(w) = &a.staged {
        format!("{} workers (staged)", w.iter().sum::<usize>())
    } else {
        format!("{} workers, {} emitter(s)", a.workers, a.emitters)
    };
    let rows = chosen_rows(&a);
    print_legend(a.in_process, &rows);
    for r in rows {
        let label = match (a.in_process, r) {
            (true, 0) => "json: this process parses",
            (true, _) => "memory: this process parsed once",
            (false, _) => ROWS[r].0,
        };
        let (source, epochs) = (sources[r].clone(), epochs[r]);
        let cfg = WorkloadConfig {
            source,
            chain: chain.clone(),
            batch_size: a.batch,
            epochs,
            workers: a.workers,
            emitters: a.emitters,
            group_bytes: a.group_bytes,
            seed: a.seed,
        };
        let pb = bar((series * epochs) as u64, label);
        let update = |s: &WorkloadStats| pb.set_position(s.windows);
        let stats = if a.in_process {
            run_in_process(&cfg, update)?
        } else {
            let layout = match a.staged.as_deref() {
                Some(&[p, t, b]) => Layout::Staged { workers: [p, t, b] },
                Some(_) => return Err("--staged takes three numbers, e.g. 1,1,1".into()),
                None => Layout::Fused,
            };
            run_workload_with(&reg, &cfg, layout, update)?
        };
        pb.finish_and_clear();
        report(label, &stats, &workers);
    }
    Ok(())
}
