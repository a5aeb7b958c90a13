//! Training-style loading from GluonTS's own Arrow file, side by side with GluonTS.
//!
//! Generates (or takes) a JSON-lines dataset, has GluonTS's `ArrowWriter` convert it to
//! an Arrow IPC file (`tools/gluonts_arrow_bench.py --write`), then runs the DeepAR-style
//! chain (context 168, prediction 24, batch 32) over that file:
//! - with N worker processes that map the file copied once into a sealed memfd (one copy
//!   for all workers, arrays read in place; the file itself is never mapped, so changing
//!   it cannot reach them), and
//! - with the series parsed once from the file into a sealed shared memfd,
//!
//! and GluonTS 0.17's `TrainDataLoader` over `FileDataset(<file>.feather)` (its
//! `ArrowFile` reader), and prints the ratios.
//!
//! ```text
//! pip install gluonts==0.17.0 pandas numpy pyarrow
//! cargo run --release -p shmpipe-timeseries --example arrow_loader -- --workers 2
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use shmpipe_timeseries::arrow::ArrowDataset;
use shmpipe_timeseries::memstat::cpu_with_children;
use shmpipe_timeseries::rows::{RowStore, RowsWorkload, register_rows, run_rows};
use shmpipe_timeseries::shared::SharedDataset;
use shmpipe_timeseries::synth::{GenConfig, write_file};
use shmpipe_timeseries::workload::{ChainConfig, WorkloadStats};

/// Loads batches of windows from GluonTS's Arrow file and compares with GluonTS.
#[derive(Parser, Debug)]
struct Args {
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Series per record from emitter to worker.
    #[arg(long, default_value_t = 16)]
    group: usize,
    /// Passes over the data.
    #[arg(long, default_value_t = 40)]
    epochs: usize,
    /// An Arrow file written by GluonTS (default: generate and convert).
    #[arg(long)]
    arrow: Option<PathBuf>,
    /// Series to generate (500..=5000 hourly points, 1% missing).
    #[arg(long, default_value_t = 2000)]
    series: usize,
    /// Seconds GluonTS's loader runs.
    #[arg(long, default_value_t = 15.0)]
    gluonts_seconds: f64,
    /// Skip GluonTS (no ratios).
    #[arg(long)]
    no_gluonts: bool,
    /// Python interpreter with gluonts 0.17 and pyarrow.
    #[arg(long, default_value = "python3")]
    python: String,
}

/// Removes the temporary directory on drop, also on error or panic.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tool(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools")
        .join(name)
}

fn bar(expected: u64, label: &str) -> ProgressBar {
    let pb = ProgressBar::new(expected);
    pb.set_style(
        ProgressStyle::with_template("{prefix:>14} [{bar:30}] {pos}/{len} windows ({per_sec})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_owned());
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// The Arrow file to read: `--arrow`, or `--series` series generated as JSON lines and
/// written as Arrow by GluonTS into a temporary directory (removed when the guard drops).
fn arrow_file(a: &Args) -> Result<(PathBuf, Option<TempDir>), Box<dyn std::error::Error>> {
    if let Some(p) = &a.arrow {
        return Ok((p.clone(), None));
    }
    let dir = std::env::temp_dir().join(format!("shmpipe-ts-arrow-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let guard = TempDir(dir.clone());
    let jsonl = dir.join("train.jsonl");
    let g = GenConfig {
        num_series: a.series,
        min_len: 500,
        max_len: 5000,
        missing_prob: 0.01,
        ..GenConfig::default()
    };
    let bytes = write_file(&g, &jsonl)?;
    println!(
        "generated {} hourly series (500..=5000 points, 1% missing), {:.1} MB of JSON",
        g.num_series,
        bytes as f64 / 1e6
    );
    let arrow = dir.join("train.feather");
    let st = Command::new(&a.python)
        .arg(tool("gluonts_arrow_bench.py"))
        .args(["--write".as_ref(), jsonl.as_os_str(), arrow.as_os_str()])
        .status()?;
    if !st.success() {
        return Err(
            "GluonTS could not write the Arrow file (pip install gluonts==0.17.0 pyarrow pandas)"
                .into(),
        );
    }
    Ok((arrow, Some(guard)))
}

/// Runs GluonTS's own loader over the same file and prints both ratios to it.
fn compare_with_gluonts(
    a: &Args,
    arrow: &Path,
    mapped: &WorkloadStats,
    shared: &WorkloadStats,
) -> Result<(), Box<dyn std::error::Error>> {
    let out = Command::new(&a.python)
        .arg(tool("gluonts_arrow_bench.py"))
        .arg(arrow)
        .args(["--seconds", &a.gluonts_seconds.to_string(), "--json"])
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "GluonTS loader failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let g = v["arrow"]["windows_per_sec"].as_f64().unwrap_or(f64::NAN);
    let gc = v["arrow"]["windows_per_cpu_sec"]
        .as_f64()
        .unwrap_or(f64::NAN);
    println!(
        "{:>14}: {g:>9.0} windows/s ({gc:.0} per CPU-s)  (GluonTS {} ArrowFile, 1 process)",
        "gluonts", v["gluonts"]
    );
    println!(
        "ratio vs GluonTS ArrowFile, wall clock: arrow (memfd) {:.0}x, shared memfd {:.0}x  (goal >= 100x with {} workers)",
        mapped.windows_per_sec() / g,
        shared.windows_per_sec() / g,
        a.workers
    );
    println!(
        "ratio per CPU-second: arrow (memfd) {:.0}x, shared memfd {:.0}x",
        mapped.windows_per_cpu_sec() / gc,
        shared.windows_per_cpu_sec() / gc
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reg = register_rows(shmpipe::Registry::new());
    shmpipe::init(&reg); // worker and emitter processes run here and exit
    let a = Args::parse();
    let chain = ChainConfig::default();

    let (arrow, _guard) = arrow_file(&a)?;
    let ds = ArrowDataset::open(&arrow, chain.freq)?;
    let series = ds.len();
    println!(
        "Arrow file {} ({:.1} MB, {series} series); chain: DeepAR-style, context {}, prediction {}, batch 32, {} workers",
        arrow.display(),
        std::fs::metadata(&arrow)?.len() as f64 / 1e6,
        chain.context_length,
        chain.prediction_length,
        a.workers
    );
    let cfg = RowsWorkload {
        chain: chain.clone(),
        batch_size: 32,
        epochs: a.epochs,
        workers: a.workers,
        emitters: 1,
        group: a.group,
        seed: 0,
        transform: true,
    };
    // CPU time of this process and its reaped children (workers, emitters): windows
    // per CPU-second is robust to other load on a shared machine, like GluonTS's figure.
    let run = |label: &str,
               store: &RowStore|
     -> Result<WorkloadStats, Box<dyn std::error::Error>> {
        let pb = bar((series * a.epochs) as u64, label);
        let c0 = cpu_with_children()?;
        let mut s = run_rows(&reg, store, &cfg, |s| pb.set_position(s.windows))?;
        s.cpu_time = cpu_with_children()?.saturating_sub(c0);
        pb.finish_and_clear();
        println!(
            "{label:>14}: {:>9.0} windows/s ({:.0} per CPU-s, start-up included)  {:>7.1} MB/s of batches  ({} workers)",
            s.windows_per_sec(),
            s.windows_per_cpu_sec(),
            s.batch_mb_per_sec(),
            a.workers
        );
        Ok(s)
    };
    // The Arrow file copied once into a sealed memfd that every worker maps.
    let mapped = run("arrow (memfd)", &RowStore::arrow_shared(&arrow)?)?;
    let shared = SharedDataset::create(&ds.entries()?, chain.freq)?;
    drop(ds);
    let shared = run("shared memfd", &RowStore::shared(shared))?;

    if a.no_gluonts {
        return Ok(());
    }
    compare_with_gluonts(&a, &arrow, &mapped, &shared)
}
