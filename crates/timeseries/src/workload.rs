//! The benchmark workload: a DeepAR-style training chain over hourly data,
//! windows of `context_length + prediction_length`, batches of `batch_size`.
//!
//! This module runs it in the current process ([`run_in_process`]); the
//! multi-process version built on the pipeline crate is
//! [`crate::pipeline::run_workload`].

use std::borrow::Cow;
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
use crate::sampler::{ExpectedNumInstanceSampler, InstanceSampler, PredictionSplitSampler};
use crate::transform::{
    AddAgeFeature, AddObservedValuesIndicator, AddTimeFeatures, AsNumpyArray, Chain,
    InstanceSplitter, VstackFeatures,
};

/// Which loader the chain is for: GluonTS's three instance splitters, as its
/// estimators (e.g. DeepAR's `_create_instance_splitter`) build them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Split {
    /// Training: `ExpectedNumInstanceSampler(num_instances, min_past, min_future)`,
    /// random windows, `is_train = true`.
    #[default]
    Train,
    /// Validation: `ValidationSplitSampler(min_past, min_future)`: the last window
    /// that has `min_future` points after it (series shorter than that give none),
    /// `is_train = true`.
    Validation,
    /// Test (prediction): `TestSplitSampler(min_past)`: the window ending at the
    /// end of each series (every series must have `min_past` points), time and
    /// age features extended by `prediction_length`, `is_train = false`.
    Test,
}

impl Split {
    /// `"train"`, `"validation"` or `"test"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
            Split::Test => "test",
        }
    }
}

impl std::str::FromStr for Split {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "train" => Ok(Split::Train),
            "validation" => Ok(Split::Validation),
            "test" => Ok(Split::Test),
            _ => Err(format!(
                "unknown split {s:?}: expected \"train\", \"validation\" or \"test\""
            )),
        }
    }
}

/// Parameters of the transformation chain.
///
/// One chain for each of GluonTS's three loaders: set [`ChainConfig::split`];
/// `min_past` and `min_future` default as in GluonTS's DeepAR estimator
/// (0, and `prediction_length` for training and validation).
///
/// # Examples
/// A training, a validation and a test loader over the same series:
/// ```
/// use std::sync::Arc;
/// use shmpipe_timeseries::{jsonl, synth, workload::*};
/// let g = synth::GenConfig { num_series: 20, ..Default::default() };
/// let series = Arc::new(jsonl::parse_lines(&synth::to_bytes(&g), g.freq).unwrap());
/// let loader = |split, epochs| WorkloadConfig {
///     source: WorkloadSource::Memory(series.clone()),
///     chain: ChainConfig { context_length: 168, prediction_length: 24, split, ..ChainConfig::default() },
///     batch_size: 32, epochs, workers: 2, emitters: 1, group_bytes: 64 << 10, seed: 0,
/// };
/// // Random windows, `num_instances` per series on average, for 3 epochs.
/// let train = run_in_process(&loader(Split::Train, 3), |_| {}).unwrap();
/// // The last 24 points of each series as the future (`ValidationSplitSampler`).
/// let validation = run_in_process(&loader(Split::Validation, 1), |_| {}).unwrap();
/// // A window ending at each series' end, features extended 24 steps (`TestSplitSampler`).
/// let test = run_in_process(&loader(Split::Test, 1), |_| {}).unwrap();
/// assert!(train.windows > 0);
/// assert_eq!((validation.windows, test.windows), (20, 20));
/// ```
/// With [`crate::pipeline::run_workload`] instead of [`run_in_process`] the same
/// configurations run in worker processes.
#[derive(Clone, Debug)]
pub struct ChainConfig {
    /// Frequency of the data.
    pub freq: Freq,
    /// Past window (`past_length`).
    pub context_length: usize,
    /// Future window (`future_length`, and the extra feature length in inference).
    pub prediction_length: usize,
    /// Average windows per series (`ExpectedNumInstanceSampler.num_instances`;
    /// training only).
    pub num_instances: f64,
    /// Use [`FusedDeepAr`] (same outputs, computed for the windows only)
    /// instead of the step-by-step chain.
    pub fused: bool,
    /// Training, validation or test windows.
    pub split: Split,
    /// Points required before a split point (GluonTS's `min_past`; default 0).
    pub min_past: usize,
    /// Points required after a split point (GluonTS's `min_future`); `None` is
    /// GluonTS's default, see [`ChainConfig::min_future`].
    pub min_future: Option<usize>,
    /// The dataset's mean admissible window ([`mean_window`]), which the training sampler
    /// divides `num_instances` by; `None`: GluonTS's running mean of the series the sampler
    /// has seen (per process: in a pipeline, per worker, so the windows then depend on
    /// which worker got which series). The pipeline runners set it.
    pub mean_window: Option<f64>,
}

impl Default for ChainConfig {
    /// Hourly, context 168, prediction 24, one window per series on average, training.
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
            split: Split::Train,
            min_past: 0,
            min_future: None,
            mean_window: None,
        }
    }
}

impl ChainConfig {
    /// `min_future` in effect: as set, else `prediction_length` for training and
    /// validation; always 0 for the test split (`TestSplitSampler` has none).
    pub fn min_future(&self) -> usize {
        match self.split {
            Split::Test => 0,
            _ => self.min_future.unwrap_or(self.prediction_length),
        }
    }

    /// The `is_train` flag the split's loader passes to the transformations.
    pub fn is_train(&self) -> bool {
        self.split != Split::Test
    }

    /// The split's instance sampler, seeded by `seed` (only training draws).
    pub fn sampler(&self, seed: u64) -> Box<dyn InstanceSampler> {
        match self.split {
            Split::Train => {
                let s = ExpectedNumInstanceSampler::new(
                    self.num_instances,
                    self.min_past,
                    self.min_future(),
                    seed,
                );
                Box::new(match self.mean_window {
                    Some(m) => s.with_mean_window(m),
                    None => s,
                })
            }
            Split::Validation => Box::new(PredictionSplitSampler::validation(
                self.min_past,
                self.min_future(),
            )),
            Split::Test => Box::new(PredictionSplitSampler::test(self.min_past)),
        }
    }

    /// The configuration as pipeline step arguments (read by [`ChainConfig::from_args`]).
    pub fn to_args(&self) -> serde_json::Value {
        serde_json::json!({
            "freq": self.freq.to_string(),
            "context_length": self.context_length,
            "prediction_length": self.prediction_length,
            "num_instances": self.num_instances,
            "fused": self.fused,
            "split": self.split.as_str(),
            "min_past": self.min_past,
            "min_future": self.min_future,
            "mean_window": self.mean_window,
        })
    }

    /// Reads step arguments; missing keys take their default.
    ///
    /// # Errors
    /// A bad `freq` or `split`.
    pub fn from_args(a: &serde_json::Value) -> Result<Self, String> {
        let d = ChainConfig::default();
        let size = |k: &str, d: usize| a[k].as_u64().map_or(d, |v| v as usize);
        Ok(ChainConfig {
            freq: a["freq"]
                .as_str()
                .unwrap_or("h")
                .parse()
                .map_err(|e| format!("freq: {e}"))?,
            context_length: size("context_length", d.context_length),
            prediction_length: size("prediction_length", d.prediction_length),
            num_instances: a["num_instances"].as_f64().unwrap_or(d.num_instances),
            fused: a["fused"].as_bool().unwrap_or(d.fused),
            split: a["split"].as_str().unwrap_or("train").parse()?,
            min_past: size("min_past", d.min_past),
            min_future: a["min_future"].as_u64().map(|v| v as usize),
            mean_window: a["mean_window"].as_f64(),
        })
    }
}

/// The mean admissible window of the training split over the series of a JSON-lines file:
/// `len - min_past - min_future + 1` over the series where that is positive, as GluonTS's
/// `ExpectedNumInstanceSampler` averages them (see [`ChainConfig::mean_window`]). Blank and
/// malformed lines are left out (the run reports malformed ones). `None` if no series has
/// an admissible window.
///
/// # Errors
/// If the file cannot be read.
pub fn mean_window(path: &std::path::Path, cfg: &ChainConfig) -> std::io::Result<Option<f64>> {
    let data = std::fs::read(path)?;
    let (mut n, mut total) = (0u64, 0u64);
    for line in crate::jsonl::split_lines(&data) {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let Ok(e) = crate::jsonl::parse_entry(line, cfg.freq) else {
            continue;
        };
        let Some(t) = e.get(crate::field::TARGET) else {
            continue;
        };
        let (a, b) = crate::sampler::bounds(t.time_len(), cfg.min_past, cfg.min_future());
        if b >= a {
            n += 1;
            total += (b - a + 1) as u64;
        }
    }
    Ok((n > 0).then(|| total as f64 / n as f64))
}

/// The DeepAR-style chain, with the split's sampler seeded by `seed`:
/// `AsNumpyArray(target)`, `AddObservedValuesIndicator`, `AddTimeFeatures`,
/// `AddAgeFeature(log_scale)`, `VstackFeatures(time_feat, [time_feat, age])`,
/// `InstanceSplitter(sampler, time_series_fields = [time_feat, observed_values])`
/// with [`ChainConfig::sampler`] (training: `ExpectedNumInstanceSampler(min_future =
/// prediction_length)` by default).
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
            cfg.sampler(seed),
            cfg.context_length,
            p,
            &[field::FEAT_TIME, field::OBSERVED_VALUES],
        ))
}

/// The same chain as [`deepar_chain`] as one [`FusedDeepAr`] step.
pub fn deepar_chain_fused(cfg: &ChainConfig, seed: u64) -> Chain {
    Chain::new().then(FusedDeepAr::new(
        time_features_for(cfg.freq),
        cfg.sampler(seed),
        cfg.context_length,
        cfg.prediction_length,
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
    /// Bytes of series (JSON text, or parsed arrays) per record sent from an emitter to a
    /// worker; a larger series travels alone (pipeline runner only; see
    /// [`crate::pipeline::DEFAULT_GROUP_BYTES`]).
    pub group_bytes: usize,
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
///     chain: ChainConfig::default(), batch_size: 32, epochs: 2, workers: 1, emitters: 1, group_bytes: 64 << 10, seed: 0,
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
    let mut emit = |e: Cow<'_, DataEntry>,
                    stats: &mut WorkloadStats,
                    chain: &mut Chain|
     -> Result<(), WorkloadError> {
        stats.series += 1;
        windows.clear();
        let is_train = cfg.chain.is_train();
        match e {
            Cow::Owned(e) => chain.apply(e, is_train, &mut windows),
            // Series held in memory are read in place, not copied each pass.
            Cow::Borrowed(e) => chain.apply_ref(e, is_train, &mut windows),
        }
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
        one_pass(cfg, &mut parsed, &mut stats, &mut chain, &mut emit)?;
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

/// One pass over the workload's source: each series to `emit` (series held in memory are
/// lent, not copied; a file read once is kept in `parsed` for the next passes).
fn one_pass(
    cfg: &WorkloadConfig,
    parsed: &mut Option<Vec<DataEntry>>,
    stats: &mut WorkloadStats,
    chain: &mut Chain,
    emit: &mut impl FnMut(
        Cow<'_, DataEntry>,
        &mut WorkloadStats,
        &mut Chain,
    ) -> Result<(), WorkloadError>,
) -> Result<(), WorkloadError> {
    match &cfg.source {
        WorkloadSource::JsonLines(path) | WorkloadSource::JsonLinesInWorkers(path) => {
            let mut reader =
                JsonLinesReader::open(path, cfg.chain.freq).map_err(WorkloadError::Read)?;
            for e in reader.by_ref() {
                let e = e.map_err(WorkloadError::Read)?;
                emit(Cow::Owned(e), stats, chain)?;
            }
            stats.input_bytes += reader.bytes_read();
        }
        WorkloadSource::Memory(entries) => {
            for e in entries.iter() {
                emit(Cow::Borrowed(e), stats, chain)?;
            }
        }
        WorkloadSource::ParsedOnce(path) | WorkloadSource::InWorkers(path) => {
            let entries = match &*parsed {
                Some(p) => p,
                None => parsed.insert(
                    crate::jsonl::read_file(path, cfg.chain.freq).map_err(WorkloadError::Read)?,
                ),
            };
            for e in entries.iter() {
                emit(Cow::Borrowed(e), stats, chain)?;
            }
        }
    }
    Ok(())
}

/// CPU time consumed by the calling thread.
pub fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
