//! Training-style loading of GluonTS-format data with N worker processes.
//!
//! Generates a synthetic hourly dataset in a temporary directory (removed at the
//! end), then runs the DeepAR-style chain (context 168, prediction 24, batch 32)
//! twice: parsing the JSON lines on every pass, and from entries parsed once and
//! kept in memory. Prints windows/s, batches/s and MB/s for each, with a progress bar.
//!
//! `cargo run --release -p shmpipe-timeseries --example timeseries_loader -- --workers 2`

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use shmpipe_timeseries::pipeline::{Layout, register, run_workload_with};
use shmpipe_timeseries::synth::{GenConfig, write_file};
use shmpipe_timeseries::workload::{
    ChainConfig, WorkloadConfig, WorkloadSource, WorkloadStats, run_in_process,
};

/// Loads batches of windows from a generated dataset and reports throughput.
#[derive(Parser, Debug)]
struct Args {
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Emitter processes.
    #[arg(long, default_value_t = 1)]
    emitters: usize,
    /// Series (or JSON lines) per record from emitter to worker.
    #[arg(long, default_value_t = shmpipe_timeseries::pipeline::DEFAULT_GROUP)]
    group: usize,
    /// Series in the generated dataset.
    #[arg(long, default_value_t = 4000)]
    series: usize,
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
            "{prefix:>16} [{bar:30}] {pos}/{len} windows ({per_sec}, eta {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_prefix(label.to_owned());
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

fn report(label: &str, s: &WorkloadStats) {
    let cpu = if s.cpu_time.is_zero() {
        String::new()
    } else {
        format!(" ({:.0} per CPU-s)", s.windows_per_cpu_sec())
    };
    println!(
        "{label:>16}: {:>9.0} windows/s{cpu}  {:>8.1} batches/s  {:>7.1} MB/s of batches{}",
        s.windows_per_sec(),
        s.batches_per_sec(),
        s.batch_mb_per_sec(),
        if s.input_bytes > 0 {
            format!("  {:.1} MB/s of JSON", s.input_mb_per_sec())
        } else {
            String::new()
        }
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reg = register(shmpipe::Registry::new());
    shmpipe::init(&reg); // worker and emitter processes run here and exit
    let a = Args::parse();

    let _guard;
    let path = match &a.data {
        Some(p) => p.clone(),
        None => {
            let dir = std::env::temp_dir().join(format!("shmpipe-ts-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            _guard = TempDir(dir.clone());
            let path = dir.join("train.jsonl");
            let g = GenConfig {
                num_series: a.series,
                seed: a.seed,
                ..GenConfig::default()
            };
            let bytes = write_file(&g, &path)?;
            println!(
                "generated {} hourly series ({}..={} points, {:.0}% missing), {:.1} MB",
                g.num_series,
                g.min_len,
                g.max_len,
                g.missing_prob * 100.0,
                bytes as f64 / 1e6
            );
            path
        }
    };
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
    for (label, source, epochs) in [
        (
            "json lines",
            WorkloadSource::JsonLines(path.clone()),
            a.json_epochs,
        ),
        (
            "json in workers",
            WorkloadSource::JsonLinesInWorkers(path.clone()),
            a.json_epochs,
        ),
        (
            "in memory",
            WorkloadSource::ParsedOnce(path.clone()),
            a.memory_epochs,
        ),
        (
            "in workers",
            WorkloadSource::InWorkers(path.clone()),
            a.memory_epochs,
        ),
    ] {
        let cfg = WorkloadConfig {
            source,
            chain: chain.clone(),
            batch_size: a.batch,
            epochs,
            workers: a.workers,
            emitters: a.emitters,
            group: a.group,
            seed: a.seed,
        };
        let pb = bar((a.series * epochs) as u64, label);
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
        report(label, &stats);
    }
    Ok(())
}
