//! The GluonTS-style workload of `shmpipe-timeseries` (DeepAR-style training chain over
//! synthetic hourly series, batches of 32 windows) in the `pipeline` subcommand: in one
//! process and through the pipeline with N workers, reading JSON lines on every pass or
//! entries parsed once and kept in memory. Rate: windows per second as the timeseries crate
//! measures it (from the first batch to the last).

use std::path::{Path, PathBuf};

use shmpipe::Registry;
use shmpipe_timeseries::pipeline::{DEFAULT_GROUP_BYTES, run_workload};
use shmpipe_timeseries::synth::{GenConfig, write_file};
use shmpipe_timeseries::workload::{
    ChainConfig, WorkloadConfig, WorkloadSource, WorkloadStats, run_in_process,
};

use crate::BoxError;

/// Windows per batch.
pub const BATCH: usize = 32;

/// Where the series come from on each pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// JSON lines parsed on every pass.
    JsonLines,
    /// Parsed once at start, read from memory on every pass.
    Memory,
}

/// One timeseries job: where it runs and what it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TsJob {
    /// `None`: in the harness process; `Some(n)`: the pipeline with `n` workers.
    pub workers: Option<usize>,
    /// Input of every pass.
    pub input: Input,
}

impl TsJob {
    /// Name in tables and CSV, e.g. `timeseries json w2`, `timeseries memory in-process`.
    pub fn label(&self) -> String {
        let input = match self.input {
            Input::JsonLines => "json",
            Input::Memory => "memory",
        };
        match self.workers {
            None => format!("timeseries {input} in-process"),
            Some(w) => format!("timeseries {input} w{w}"),
        }
    }
}

/// A temporary directory with a generated dataset, removed on drop.
#[derive(Debug)]
pub struct Dataset {
    dir: PathBuf,
    /// The JSON-lines file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
}

impl Dataset {
    /// Generates `series` synthetic hourly series (400..=1600 points, 2% missing).
    ///
    /// # Errors
    /// File errors.
    pub fn generate(series: usize) -> Result<Dataset, BoxError> {
        let dir = std::env::temp_dir().join(format!("shmpipe-bench-ts-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("train.jsonl");
        let g = GenConfig {
            num_series: series,
            ..GenConfig::default()
        };
        let bytes = write_file(&g, &path)?;
        Ok(Dataset { dir, path, bytes })
    }
}

impl Drop for Dataset {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config(path: &Path, job: &TsJob, epochs: usize) -> WorkloadConfig {
    WorkloadConfig {
        source: match job.input {
            Input::JsonLines => WorkloadSource::JsonLines(path.to_path_buf()),
            Input::Memory => WorkloadSource::ParsedOnce(path.to_path_buf()),
        },
        chain: ChainConfig::default(),
        batch_size: BATCH,
        epochs,
        workers: job.workers.unwrap_or(1),
        emitters: 1,
        group_bytes: DEFAULT_GROUP_BYTES,
        seed: 0,
    }
}

/// Runs `job` over `epochs` passes of the dataset at `path`.
///
/// # Errors
/// Workload or pipeline errors; a run that produced no window.
pub fn run(
    reg: &Registry,
    path: &Path,
    job: &TsJob,
    epochs: usize,
) -> Result<WorkloadStats, BoxError> {
    let cfg = config(path, job, epochs);
    let stats = match job.workers {
        None => run_in_process(&cfg, |_| {})?,
        Some(_) => run_workload(reg, &cfg, |_| {})?,
    };
    if stats.windows == 0 {
        return Err(format!("{} produced no window", job.label()).into());
    }
    Ok(stats)
}

/// f32 elements per window of the batches (all arrays of a window, from a run's totals).
pub fn floats_per_window(stats: &WorkloadStats) -> usize {
    (stats.batch_bytes / stats.windows.max(1) / 4) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        let j = TsJob {
            workers: Some(2),
            input: Input::JsonLines,
        };
        assert_eq!(j.label(), "timeseries json w2");
        let j = TsJob {
            workers: None,
            input: Input::Memory,
        };
        assert_eq!(j.label(), "timeseries memory in-process");
    }

    #[test]
    fn in_process_run_on_a_small_dataset() {
        let data = Dataset::generate(40).unwrap();
        assert!(data.bytes > 0 && data.path.exists());
        let job = TsJob {
            workers: None,
            input: Input::Memory,
        };
        let stats = run(&Registry::new(), &data.path, &job, 1).unwrap();
        assert!(stats.windows > 0);
        // A window holds at least its past and future targets (168 + 24 points).
        assert!(floats_per_window(&stats) >= 192, "{stats:?}");
        let dir = data.dir.clone();
        drop(data);
        assert!(!dir.exists());
    }
}
