//! One copy of the data for all workers: summed PSS of the parent and its workers.
//!
//! Runs the DeepAR-style training workload with 2 and 4 workers over the same
//! dataset held two ways, and samples the summed PSS (`/proc/<pid>/smaps_rollup`) of
//! the parent and every child (workers and emitters) at 75% of the run:
//! - **shared memfd**: parsed once by the parent into a sealed memfd that every
//!   worker maps read-only ([`SharedDataset`]);
//! - **per-worker copies**: every worker parses the file and holds its own entries
//!   (`WorkloadSource::InWorkers`, the crate's in-memory mode before the shared one;
//!   what PyTorch's forked workers end up with after copy-on-access).
//!
//! The fixed overhead (binaries, rings, buffers) is measured by the same run over a
//! 20-series slice of the data; the ratio printed is `(PSS - overhead) / dataset`,
//! where the dataset size is the bytes of its parsed arrays. Goal: shared <= 1.2.
//!
//! `cargo run --release -p shmpipe-timeseries --example shared_memory`

use std::path::{Path, PathBuf};

use clap::Parser;
use shmpipe_timeseries::memstat::{children, pss_kib};
use shmpipe_timeseries::pipeline::{register, run_workload};
use shmpipe_timeseries::rows::{RowStore, RowsWorkload, register_rows, run_rows};
use shmpipe_timeseries::shared::SharedDataset;
use shmpipe_timeseries::synth::{GenConfig, write_file};
use shmpipe_timeseries::workload::{ChainConfig, WorkloadConfig, WorkloadSource, WorkloadStats};
use shmpipe_timeseries::{DataEntry, jsonl};

/// Measures the summed PSS of a pipeline's processes for two ways of holding the data.
#[derive(Parser, Debug)]
struct Args {
    /// A JSON-lines dataset (default: generate 2000 hourly series of 500..=5000 points).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Series to generate.
    #[arg(long, default_value_t = 2000)]
    series: usize,
    /// Windows per run (sets the epochs).
    #[arg(long, default_value_t = 600_000)]
    windows: usize,
    /// Worker counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    workers: Vec<usize>,
    /// Print each process's PSS (heap, files, shared memory) at every sample.
    #[arg(long)]
    detail: bool,
    /// Measure only the shared memfd (not the per-worker copies).
    #[arg(long)]
    shared_only: bool,
}

/// Removes the temporary directory on drop, also on error or panic.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Print where each process's PSS lies (`--detail`).
static DETAIL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Summed PSS (KiB) of this process and all its children; with `--detail`, prints each
/// process's PSS split into anonymous memory (heap), files and shared memory.
fn group_pss_kib() -> u64 {
    let me = std::process::id();
    let mut pids = vec![me];
    pids.extend(children(me));
    let detail = DETAIL.load(std::sync::atomic::Ordering::Relaxed);
    let mut sum = 0;
    for p in pids {
        let Ok(kib) = pss_kib(p) else { continue };
        sum += kib;
        if detail {
            let text =
                std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")).unwrap_or_default();
            let field = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map_or("?", |v| v.trim().trim_end_matches(" kB"))
                    .to_owned()
            };
            let role = std::fs::read(format!("/proc/{p}/environ"))
                .ok()
                .and_then(|e| {
                    let e = String::from_utf8_lossy(&e).into_owned();
                    let i = e.find("\"role\":")?;
                    Some(e[i + 7..].chars().take(40).collect::<String>())
                })
                .unwrap_or_else(|| "parent".into());
            println!(
                "    pid {p:>7} PSS {kib:>7} KiB: anon {:>7} file {:>6} shmem {:>7}  {role}",
                field("Pss_Anon:"),
                field("Pss_File:"),
                field("Pss_Shmem:")
            );
        }
    }
    sum
}

/// Calls `f` with a progress callback that samples the group PSS once, at 75% of
/// `expected` windows (steady state: every worker has long loaded what it holds;
/// a worker of the per-worker mode briefly holds the JSON text too while it parses,
/// which an earlier sample can catch on a loaded machine); returns the sample (KiB).
fn sampled(
    expected: u64,
    f: impl FnOnce(&mut dyn FnMut(&WorkloadStats)) -> Result<WorkloadStats, Box<dyn std::error::Error>>,
) -> Result<u64, Box<dyn std::error::Error>> {
    let mut sample = None;
    let mut cb = |s: &WorkloadStats| {
        if sample.is_none() && s.windows * 4 >= expected * 3 {
            sample = Some(group_pss_kib());
        }
    };
    f(&mut cb)?;
    sample.ok_or_else(|| "the run ended before the sample".into())
}

/// Windows per run (one per series and epoch on average): long enough (several
/// seconds) that every worker has loaded its data well before the sample, even when
/// workers start late on a loaded machine.
static WINDOWS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(600_000);

/// Epochs so that a run yields about [`WINDOWS`] windows.
fn epochs_for(series: usize) -> usize {
    (WINDOWS.load(std::sync::atomic::Ordering::Relaxed) / series.max(1)).max(3)
}

fn chain() -> ChainConfig {
    ChainConfig::default()
}

/// Summed PSS (KiB) with the data in a shared memfd.
fn shared_pss(
    reg: &shmpipe::Registry,
    path: &Path,
    workers: usize,
) -> Result<u64, Box<dyn std::error::Error>> {
    let entries: Vec<DataEntry> = jsonl::read_file(path, chain().freq)?;
    let series = entries.len();
    let ds = SharedDataset::create(&entries, chain().freq)?;
    drop(entries);
    let store = RowStore::shared(ds);
    let cfg = RowsWorkload {
        chain: chain(),
        batch_size: 32,
        epochs: epochs_for(series),
        workers,
        emitters: 1,
        group: 16,
        seed: 0,
        transform: true,
    };
    sampled((series * cfg.epochs) as u64, |cb| {
        Ok(run_rows(reg, &store, &cfg, cb)?)
    })
}

/// Summed PSS (KiB) with a parsed copy in every worker.
fn per_worker_pss(
    reg: &shmpipe::Registry,
    path: &Path,
    series: usize,
    workers: usize,
) -> Result<u64, Box<dyn std::error::Error>> {
    let cfg = WorkloadConfig {
        source: WorkloadSource::InWorkers(path.to_path_buf()),
        chain: chain(),
        batch_size: 32,
        epochs: epochs_for(series),
        workers,
        emitters: 1,
        group_bytes: shmpipe_timeseries::pipeline::DEFAULT_GROUP_BYTES,
        seed: 0,
    };
    sampled((series * cfg.epochs) as u64, |cb| {
        Ok(run_workload(reg, &cfg, cb)?)
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reg = register_rows(register(shmpipe::Registry::new()));
    shmpipe::init(&reg); // worker and emitter processes run here and exit
    let a = Args::parse();
    WINDOWS.store(a.windows, std::sync::atomic::Ordering::Relaxed);
    DETAIL.store(a.detail, std::sync::atomic::Ordering::Relaxed);

    let dir = std::env::temp_dir().join(format!("shmpipe-ts-pss-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _guard = TempDir(dir.clone());
    let path = match &a.data {
        Some(p) => p.clone(),
        None => {
            let path = dir.join("train.jsonl");
            let g = GenConfig {
                num_series: a.series,
                min_len: 500,
                max_len: 5000,
                missing_prob: 0.01,
                ..GenConfig::default()
            };
            write_file(&g, &path)?;
            path
        }
    };
    let entries = jsonl::read_file(&path, chain().freq)?;
    let series = entries.len();
    let data_kib = entries.iter().map(|e| e.nbytes() as u64).sum::<u64>() / 1024;
    drop(entries);
    // The same pipeline over 20 series: the fixed overhead.
    let small = dir.join("small.jsonl");
    let text = std::fs::read_to_string(&path)?;
    std::fs::write(
        &small,
        text.lines().take(20).collect::<Vec<_>>().join("\n") + "\n",
    )?;
    drop(text);
    println!(
        "dataset: {series} series, {:.1} MB of parsed arrays ({}); PSS summed over parent, emitter and workers at 75% of the run",
        data_kib as f64 / 1024.0,
        path.display()
    );
    println!(
        "{:>18} {:>7} {:>10} {:>10} {:>20}",
        "data held", "workers", "PSS MB", "fixed MB", "(PSS-fixed)/dataset"
    );
    for &w in &a.workers {
        let mut rows = vec![(
            "shared memfd",
            shared_pss(&reg, &path, w)?,
            shared_pss(&reg, &small, w)?,
        )];
        if !a.shared_only {
            rows.push((
                "per-worker copies",
                per_worker_pss(&reg, &path, series, w)?,
                per_worker_pss(&reg, &small, 20, w)?,
            ));
        }
        for (label, big, fixed) in rows {
            let ratio = big.saturating_sub(fixed) as f64 / data_kib as f64;
            println!(
                "{label:>18} {w:>7} {:>10.1} {:>10.1} {ratio:>19.2}x{}",
                big as f64 / 1024.0,
                fixed as f64 / 1024.0,
                if label == "shared memfd" {
                    if ratio <= 1.2 {
                        "  (goal <= 1.2: met)"
                    } else {
                        "  (goal <= 1.2: NOT met)"
                    }
                } else {
                    ""
                }
            );
        }
    }
    Ok(())
}
