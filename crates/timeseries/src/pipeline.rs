//! The workload as a multi-process [`shmpipe`] pipeline.
//!
//! Emitters read line-aligned parts of the JSON-lines file; workers parse,
//! transform, split and batch (one fused step, [`STEP_TRAIN`]); the consumer
//! receives stacked batches. Register the steps and sources once with
//! [`register`], call [`shmpipe::init`] first thing in `main`, then
//! [`run_workload`]:
//!
//! ```no_run
//! use shmpipe_timeseries::pipeline::{register, run_workload};
//! use shmpipe_timeseries::workload::{ChainConfig, WorkloadConfig, WorkloadSource};
//!
//! let reg = register(shmpipe::Registry::new());
//! shmpipe::init(&reg); // worker and emitter processes run their role here and exit
//! let cfg = WorkloadConfig {
//!     source: WorkloadSource::JsonLines("data.jsonl".into()),
//!     chain: ChainConfig::default(),
//!     batch_size: 32, epochs: 3, workers: 2, emitters: 1, group_bytes: 64 << 10, seed: 0,
//! };
//! let stats = run_workload(&reg, &cfg, |_| {}).unwrap();
//! println!("{:.0} windows/s", stats.windows_per_sec());
//! ```
//!
//! This file holds the names, [`register`] and the runner; `pipeline/convert.rs` turns
//! entries, windows and batches into items and back, `pipeline/step.rs` is the worker step
//! and `pipeline/sources.rs` the emitters' sources.

mod convert;
mod names;
mod sources;
mod step;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;
use shmpipe::{Epochs, Pipeline, Registry, SourceContext, SourceError, StepContext, Topology};

pub use convert::{
    batch_rows, batch_to_item, entry_to_item, group_items, item_to_entry, split_group,
};
pub use names::{
    DEFAULT_GROUP_BYTES, FORECAST_START_FIELD, FORECAST_START_META, GROUP_META, ITEM_ID_META,
    ITEM_IDS_META, LINE_FIELD, LINE_NO_META, LINES_FIELD, RANGES_FIELD, SOURCE_INDICES,
    SOURCE_LINES, SOURCE_PARSED, SOURCE_RANGES, START_FIELD, START_META, STEP_BATCH, STEP_PARSE,
    STEP_TRAIN, STEP_TRANSFORM,
};
pub(crate) use sources::I64Records;
use sources::{LinesSource, ParsedSource};
use step::TrainStep;

use crate::period::Freq;
use crate::workload::{
    Split, WorkloadConfig, WorkloadError, WorkloadSource, WorkloadStats, mean_window,
};

/// Adds [`STEP_TRAIN`], [`STEP_PARSE`], [`STEP_TRANSFORM`], [`STEP_BATCH`],
/// [`SOURCE_LINES`] and [`SOURCE_PARSED`] to a registry.
pub fn register(reg: Registry) -> Registry {
    reg.step(STEP_TRAIN, |cx: &StepContext<'_>| {
        TrainStep::from_context(cx, true, true)
    })
    .step(STEP_PARSE, |cx: &StepContext<'_>| {
        TrainStep::from_context(cx, false, false)
    })
    .step(STEP_TRANSFORM, |cx: &StepContext<'_>| {
        TrainStep::from_context(cx, true, false)
    })
    .step(STEP_BATCH, |cx: &StepContext<'_>| {
        TrainStep::from_context(cx, false, true)
    })
    .source(SOURCE_LINES, |cx: &SourceContext<'_>| {
        LinesSource::open(
            &path_arg(cx.args)?,
            group_bytes_arg(cx.args),
            cx.part,
            cx.parts,
        )
    })
    .source(SOURCE_RANGES, |cx: &SourceContext<'_>| {
        I64Records::ranges(
            &path_arg(cx.args)?,
            group_bytes_arg(cx.args),
            cx.part,
            cx.parts,
        )
    })
    .source(SOURCE_INDICES, |cx: &SourceContext<'_>| {
        I64Records::indices(
            &path_arg(cx.args)?,
            group_bytes_arg(cx.args),
            cx.part,
            cx.parts,
        )
    })
    .source(SOURCE_PARSED, |cx: &SourceContext<'_>| {
        ParsedSource::open(
            &path_arg(cx.args)?,
            freq_arg(cx.args),
            group_bytes_arg(cx.args),
            cx.part,
            cx.parts,
        )
    })
}

fn path_arg(args: &serde_json::Value) -> Result<PathBuf, SourceError> {
    args["path"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| SourceError::Other("source needs a \"path\" argument".into()))
}

fn group_bytes_arg(args: &serde_json::Value) -> usize {
    args["group_bytes"]
        .as_u64()
        .map_or(DEFAULT_GROUP_BYTES, |g| g as usize)
}

fn freq_arg(args: &serde_json::Value) -> Result<Freq, String> {
    args["freq"]
        .as_str()
        .unwrap_or("h")
        .parse()
        .map_err(|e| format!("{e}"))
}
/// Runs the workload with `cfg.workers` worker processes and `cfg.emitters` emitters,
/// calling `progress` after every batch. `reg` must come from [`register`] and
/// [`shmpipe::init`] must have been called with it at the top of `main`.
///
/// Rates are measured from the first batch received to the last, so process
/// start-up (and, for [`WorkloadSource::ParsedOnce`], the one-time parse) is excluded;
/// the first batch is not counted.
///
/// # Errors
/// [`WorkloadError::Pipeline`] with the pipeline's error (which names the file,
/// line and field of a malformed record), or for a [`WorkloadSource::Memory`] source.
pub fn run_workload(
    reg: &Registry,
    cfg: &WorkloadConfig,
    progress: impl FnMut(&WorkloadStats),
) -> Result<WorkloadStats, WorkloadError> {
    run_workload_with(reg, cfg, Layout::Fused, progress)
}

/// How the work is laid out over worker processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// One step ([`STEP_TRAIN`]) in `cfg.workers` workers (the default).
    Fused,
    /// Three stages ([`STEP_PARSE`], [`STEP_TRANSFORM`], [`STEP_BATCH`]) with the given
    /// numbers of workers, connected by the pipeline's staged topology.
    Staged {
        /// Workers per stage.
        workers: [usize; 3],
    },
}

/// [`run_workload`] with an explicit [`Layout`].
///
/// # Errors
/// As [`run_workload`].
pub fn run_workload_with(
    reg: &Registry,
    cfg: &WorkloadConfig,
    layout: Layout,
    progress: impl FnMut(&WorkloadStats),
) -> Result<WorkloadStats, WorkloadError> {
    let perr = |e: shmpipe::Error| WorkloadError::Pipeline(e.to_string());
    let (source, args, input_bytes) = match &cfg.source {
        WorkloadSource::JsonLines(p) => (SOURCE_LINES, p, file_len(p)),
        WorkloadSource::ParsedOnce(p) => (SOURCE_PARSED, p, 0),
        WorkloadSource::InWorkers(p) => (SOURCE_INDICES, p, 0),
        WorkloadSource::JsonLinesInWorkers(p) => (SOURCE_RANGES, p, file_len(p)),
        WorkloadSource::Memory(_) => {
            return Err(WorkloadError::Pipeline(
                "WorkloadSource::Memory cannot cross processes; use ParsedOnce".into(),
            ));
        }
    };
    let mut c = cfg.chain.clone();
    // The training sampler's mean window from the whole file, once, here: the windows of a
    // series then do not depend on which worker gets it.
    if c.split == Split::Train && c.mean_window.is_none() {
        c.mean_window = mean_window(args, &c)
            .map_err(|e| WorkloadError::Pipeline(format!("{}: {e}", args.display())))?;
    }
    let c = &c;
    let mut step_args = c.to_args();
    step_args["batch_size"] = json!(cfg.batch_size);
    match &cfg.source {
        WorkloadSource::InWorkers(p) => step_args["cache_path"] = json!(p.display().to_string()),
        WorkloadSource::JsonLinesInWorkers(p) => {
            step_args["read_path"] = json!(p.display().to_string())
        }
        _ => {}
    }
    let b = Pipeline::builder(reg)
        .source_named(
            source,
            json!({
                "path": args.display().to_string(),
                "freq": c.freq.to_string(),
                "group_bytes": cfg.group_bytes,
            }),
        )
        .emitters(cfg.emitters.max(1))
        .epochs(Epochs::Finite(cfg.epochs as u64))
        .seed(cfg.seed);
    let b = match layout {
        Layout::Fused => b
            .step_with(STEP_TRAIN, step_args)
            .workers(cfg.workers.max(1)),
        Layout::Staged { workers } => b
            .step_with(STEP_PARSE, step_args.clone())
            .step_with(STEP_TRANSFORM, step_args.clone())
            .step_with(STEP_BATCH, step_args)
            .topology(Topology::Staged {
                workers: workers.iter().map(|&w| w.max(1)).collect(),
            }),
    };
    let mut p = b.start().map_err(perr)?;
    let mut stats = consume_batches(&mut p, progress)?;
    stats.input_bytes = input_bytes * cfg.epochs as u64;
    Ok(stats)
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// Takes every batch of a started workload pipeline, calling `progress` after each; rates
/// run from the first batch to the last (start-up and the first batch's latency are not
/// throughput). Step time from the pipeline's metrics (printed with `SHMPIPE_TS_METRICS`).
pub(crate) fn consume_batches(
    p: &mut shmpipe::Pipeline,
    mut progress: impl FnMut(&WorkloadStats),
) -> Result<WorkloadStats, WorkloadError> {
    let mut stats = WorkloadStats::default();
    let mut t0: Option<Instant> = None;
    while let Some(item) = p
        .dequeue()
        .map_err(|e| WorkloadError::Pipeline(e.to_string()))?
    {
        match t0 {
            None => t0 = Some(Instant::now()),
            Some(t) => {
                stats.batches += 1;
                stats.windows += batch_rows(&item) as u64;
                stats.batch_bytes += item.nbytes() as u64;
                stats.elapsed = t.elapsed();
                progress(&stats);
            }
        }
    }
    let m = p.metrics();
    stats.step_time = m.steps.iter().map(|s| s.2).sum();
    if std::env::var_os("SHMPIPE_TS_METRICS").is_some() {
        eprintln!("{m:?}");
    }
    Ok(stats)
}
