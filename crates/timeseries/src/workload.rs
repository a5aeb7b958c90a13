//! The benchmark workload: a DeepAR-style training chain over hourly data,
//! windows of `context_length + prediction_length`, batches of `batch_size`.
//!
//! This module runs it in the current process ([`run_in_process`]); the
//! multi-process version built on the pipeline crate is
//! [`crate::pipeline::run_workload`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::Batcher;
use crate::entry::{DataEntry, field};
use crate::error::{BatchError, ReadError, TransformError};
use crate::features::time_features_for;
use crate::fused::FusedDeepAr;
use crate::jsonl::JsonLinesReader;
use crate::period::{Freq, FreqUnit};
use crate::sampler::ExpectedNumInstanceSampler;
use crate::transform::{
    AddAgeFeature, AddObservedValuesIndicator, AddTimeFeatures, AsNumpyArray, Chain,
    InstanceSplitter, VstackFeatures,
};

/// Parameters of the transformation chain.
#[derive(Clone, Debug)]
pub struct ChainConfig {
    /// Frequency of the data.
    pub freq: Freq,
    /// Past window (`past_length`).
    pub context_length: usize,
    /// Future window (`future_length`, and the extra feature length in inference).
    pub prediction_length: usize,
    /// Average windows per series (`ExpectedNumInstanceSampler.num_instances`).
    pub num_instances: f64,
    /// Use [`FusedDeepAr`] (same outputs, computed for the windows only)
    /// instead of the step-by-step chain.
    pub fused: bool,
}

impl Default for ChainConfig {
    /// Hourly, context 168, prediction 24, one window per series on average.
    fn default() -> Self {
        ChainConfig {
            freq: Freq {
                unit: FreqUnit::Hour,
                multiple: 1,
            },
            context_length: 168,
            prediction_length: 24,
            num_instances: 1.0,
            fused: true,
        }
    }
}

/// The DeepAR-style training chain, with the sampler seeded by `seed`:
/// `AsNumpyArray(target)`, `AddObservedValuesIndicator`, `AddTimeFeatures`,
/// `AddAgeFeature(log_scale)`, `VstackFeatures(time_feat, [time_feat, age])`,
/// `InstanceSplitter(ExpectedNumInstanceSampler(min_future = prediction_length),
/// time_series_fields = [time_feat, observed_values])`.
pub fn deepar_chain(cfg: &ChainConfig, seed: u64) -> Chain {
    let p = cfg.prediction_length;
    Chain::new()
        .then(AsNumpyArray::new(field::TARGET, 1))
        .then(AddObservedValuesIndicator::new(
            field::TARGET,
            field::OBSERVED_VALUES,
        ))
        .then(AddTimeFeatures::new(
            field::TARGET,
            field::FEAT_TIME,
            time_features_for(cfg.freq),
            p,
        ))
        .then(AddAgeFeature::new(field::TARGET, field::FEAT_AGE, p, true))
        .then(VstackFeatures::new(
            field::FEAT_TIME,
            &[field::FEAT_TIME, field::FEAT_AGE],
        ))
        .then(InstanceSplitter::new(
            field::TARGET,
            field::IS_PAD,
            Box::new(ExpectedNumInstanceSampler::new(
                cfg.num_instances,
                0,
                p,
                seed,
            )),
            cfg.context_length,
            p,
            &[field::FEAT_TIME, field::OBSERVED_VALUES],
        ))
}

/// The same chain as [`deepar_chain`] as one [`FusedDeepAr`] step.
pub fn deepar_chain_fused(cfg: &ChainConfig, seed: u64) -> Chain {
    let p = cfg.prediction_length;
    Chain::new().then(FusedDeepAr::new(
        time_features_for(cfg.freq),
        Box::new(ExpectedNumInstanceSampler::new(
            cfg.num_instances,
            0,
            p,
            seed,
        )),
        cfg.context_length,
        p,
    ))
}

/// [`deepar_chain_fused`] or [`deepar_chain`], as `cfg.fused` says.
pub fn training_chain(cfg: &ChainConfig, seed: u64) -> Chain {
    if cfg.fused {
        deepar_chain_fused(cfg, seed)
    } else {
        deepar_chain(cfg, seed)
    }
}

/// Where the workload reads series from.
#[derive(Clone, Debug)]
pub enum WorkloadSource {
    /// A JSON-lines file, parsed on every pass (in the pipeline: emitters read the
    /// lines and send their bytes to the workers, which parse them).
    JsonLines(PathBuf),
    /// A JSON-lines file, read and parsed on every pass by the workers themselves
    /// (pipeline runner: emitters send only byte ranges). The in-process runner treats
    /// it as [`WorkloadSource::JsonLines`].
    JsonLinesInWorkers(PathBuf),
    /// A JSON-lines file parsed once at start; every pass reads the parsed
    /// entries from memory.
    ParsedOnce(PathBuf),
    /// Entries already parsed, in memory (in-process runner only).
    Memory(Arc<Vec<DataEntry>>),
    /// A JSON-lines file parsed once by every worker at start (pipeline runner); the
    /// emitters send only line numbers, like an index sampler over a map-style dataset.
    /// The in-process runner treats it as [`WorkloadSource::ParsedOnce`].
    InWorkers(PathBuf),
}

/// What to run.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// The data.
    pub source: WorkloadSource,
    /// The chain.
    pub chain: ChainConfig,
    /// Windows per batch.
    pub batch_size: usize,
    /// Passes over the data.
    pub epochs: usize,
    /// Worker processes (pipeline runner only).
    pub workers: usize,
    /// Emitter processes reading the input (pipeline runner only).
    pub emitters: usize,
    /// Series (or JSON lines) per record sent from an emitter to a worker
    /// (pipeline runner only; see [`crate::pipeline::DEFAULT_GROUP`]).
    pub group: usize,
    /// Seed of the samplers.
    pub seed: u64,
}

/// Throughput of one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadStats {
    /// Series read.
    pub series: u64,
    /// Windows produced.
    pub windows: u64,
    /// Batches produced (the last one of a run may be partial).
    pub batches: u64,
    /// Bytes of batch arrays produced.
    pub batch_bytes: u64,
    /// Bytes of JSON read (0 for in-memory sources).
    pub input_bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Time spent inside the pipeline step, summed over workers (zero in process).
    pub step_time: Duration,
    /// CPU time of the calling thread (in process: the whole workload; robust to
    /// other load on a shared machine).
    pub cpu_time: Duration,
}

impl WorkloadStats {
    fn rate(&self, x: f64) -> f64 {
        x / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Windows per second.
    pub fn windows_per_sec(&self) -> f64 {
        self.rate(self.windows as f64)
    }

    /// Windows per second of [`WorkloadStats::cpu_time`].
    pub fn windows_per_cpu_sec(&self) -> f64 {
        self.windows as f64 / self.cpu_time.as_secs_f64().max(1e-9)
    }

    /// Batches per second.
    pub fn batches_per_sec(&self) -> f64 {
        self.rate(self.batches as f64)
    }

    /// Megabytes (1e6) of batch arrays per second.
    pub fn batch_mb_per_sec(&self) -> f64 {
        self.rate(self.batch_bytes as f64) / 1e6
    }

    /// Megabytes (1e6) of JSON per second.
    pub fn input_mb_per_sec(&self) -> f64 {
        self.rate(self.input_bytes as f64) / 1e6
    }
}

/// The workload failed.
#[derive(Debug)]
pub enum WorkloadError {
    /// Reading the input.
    Read(ReadError),
    /// A transformation.
    Transform(TransformError),
    /// Stacking a batch.
    Batch(BatchError),
    /// The multi-process pipeline.
    Pipeline(String),
}

impl std::fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkloadError::Read(e) => write!(f, "reading input: {e}"),
            WorkloadError::Transform(e) => write!(f, "transforming: {e}"),
            WorkloadError::Batch(e) => write!(f, "batching: {e}"),
            WorkloadError::Pipeline(e) => write!(f, "pipeline: {e}"),
        }
    }
}

impl std::error::Error for WorkloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WorkloadError::Read(e) => Some(e),
            WorkloadError::Transform(e) => Some(e),
            WorkloadError::Batch(e) => Some(e),
            WorkloadError::Pipeline(_) => None,
        }
    }
}

/// Runs the workload in this process, calling `progress(&stats)` after every batch.
///
/// # Errors
/// The first read, transform or batch error.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use shmpipe_timeseries::{synth, jsonl, workload::*};
/// let g = synth::GenConfig { num_series: 50, ..Default::default() };
/// let entries = jsonl::parse_lines(&synth::to_bytes(&g), g.freq).unwrap();
/// let cfg = WorkloadConfig {
///     source: WorkloadSource::Memory(Arc::new(entries)),
///     chain: ChainConfig::default(), batch_size: 32, epochs: 2, workers: 1, emitters: 1, group: 16, seed: 0,
/// };
/// let stats = run_in_process(&cfg, |_| {}).unwrap();
/// assert_eq!(stats.series, 100);
/// assert!(stats.windows > 50);
/// ```
pub fn run_in_process(
    cfg: &WorkloadConfig,
    mut progress: impl FnMut(&WorkloadStats),
) -> Result<WorkloadStats, WorkloadError> {
    let t0 = Instant::now();
    let c0 = thread_cpu_time();
    let mut stats = WorkloadStats::default();
    let mut chain = training_chain(&cfg.chain, cfg.seed);
    let mut batcher = Batcher::new(cfg.batch_size);
    let mut windows = Vec::new();
    let mut parsed: Option<Vec<DataEntry>> = None;
    let mut emit =
        |e: DataEntry, stats: &mut WorkloadStats, chain: &mut Chain| -> Result<(), WorkloadError> {
            stats.series += 1;
            windows.clear();
            chain
                .apply(e, true, &mut windows)
                .map_err(WorkloadError::Transform)?;
            for w in windows.drain(..) {
                stats.windows += 1;
                if let Some(b) = batcher.push(w) {
                    let b = b.map_err(WorkloadError::Batch)?;
                    stats.batches += 1;
                    stats.batch_bytes += b.nbytes() as u64;
                    stats.elapsed = t0.elapsed();
                    progress(stats);
                }
            }
            Ok(())
        };
    for _ in 0..cfg.epochs {
        match &cfg.source {
            WorkloadSource::JsonLines(path) | WorkloadSource::JsonLinesInWorkers(path) => {
                let mut reader =
                    JsonLinesReader::open(path, cfg.chain.freq).map_err(WorkloadError::Read)?;
                for e in reader.by_ref() {
                    emit(e.map_err(WorkloadError::Read)?, &mut stats, &mut chain)?;
                }
                stats.input_bytes += reader.bytes_read();
            }
            WorkloadSource::Memory(entries) => {
                for e in entries.iter() {
                    emit(e.clone(), &mut stats, &mut chain)?;
                }
            }
            WorkloadSource::ParsedOnce(path) | WorkloadSource::InWorkers(path) => {
                let entries = match &parsed {
                    Some(p) => p,
                    None => parsed.insert(
                        crate::jsonl::read_file(path, cfg.chain.freq)
                            .map_err(WorkloadError::Read)?,
                    ),
                };
                for e in entries.iter() {
                    emit(e.clone(), &mut stats, &mut chain)?;
                }
            }
        }
    }
    if let Some(b) = batcher.finish() {
        let b = b.map_err(WorkloadError::Batch)?;
        stats.batches += 1;
        stats.batch_bytes += b.nbytes() as u64;
    }
    stats.elapsed = t0.elapsed();
    stats.cpu_time = thread_cpu_time().saturating_sub(c0);
    Ok(stats)
}

/// CPU time consumed by the calling thread.
pub fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
