//! The settings types of a pipeline and their defaults, and the process-wide Ctrl-C flag.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How the steps are laid out over worker processes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Topology {
    /// Every worker runs all steps: one queue in, one queue out (the default; the seed found
    /// it faster).
    #[default]
    Fused,
    /// One stage per step with queues between stages.
    Staged {
        /// Workers per stage; empty: [`PipelineBuilder::workers`](crate::PipelineBuilder::workers) for every stage.
        workers: Vec<usize>,
    },
}

/// How many passes over the data the emitters make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Epochs {
    /// This many epochs, then the end of stream.
    Finite(u64),
    /// Endless: epoch after epoch (each with its own permutation when shuffling). Use
    /// [`Pipeline::take_epoch`](crate::Pipeline::take_epoch) to take a fixed number of outputs per training epoch.
    Cycle,
}

/// What an emitter does with a malformed record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum OnBadRecord {
    /// Stop the pipeline with [`Error::BadRecord`](crate::Error::BadRecord) (the default).
    #[default]
    Fail,
    /// Skip it and count it ([`Metrics::skipped_records`]).
    Skip,
}

/// Default of [`PipelineBuilder::warn_idle_after`](crate::PipelineBuilder::warn_idle_after).
pub const DEFAULT_WARN_IDLE: Duration = Duration::from_secs(5);

/// The default batch size in bytes (see `docs/figures.md` for the measurement behind it).
pub const DEFAULT_BATCH_BYTES: usize = 16 << 10;

/// Default adaptive threshold of a pipeline: arrays of at least this many bytes go zero-copy.
///
/// Higher than shm-ring's own [`shm_ring::DEFAULT_THRESHOLD`] (which is measured for producers
/// that fill loans in place): a pipeline's items are ordinary heap arrays, so zero-copy costs a
/// copy into a pool block plus a block per array (which also caps how many arrays a batch may
/// hold). Chosen with `pipeline_bench`: zero-copy loses to copying for small arrays and the
/// two are close from 16 KiB up (figures and the date of the run in `docs/figures.md`).
pub const DEFAULT_PIPELINE_THRESHOLD: usize = 64 << 10;

/// The process-wide Ctrl-C flag; registers the handlers on first use when `install`.
pub(crate) fn interrupt_flag(install: bool) -> &'static Arc<AtomicBool> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        if install {
            // A second Ctrl-C (flag already set) exits at once with the conventional status.
            let _ = signal_hook::flag::register_conditional_shutdown(
                signal_hook::consts::SIGINT,
                130,
                Arc::clone(&flag),
            );
            let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&flag));
        }
        flag
    })
}

/// Throughput and transfer counters. Step times and transfer counts arrive with the end
/// markers, so they are complete once the stream has ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Items delivered to the consumer.
    pub items: u64,
    /// Array bytes delivered to the consumer.
    pub bytes: u64,
    /// Time since start.
    pub elapsed: Duration,
    /// Per step: (name, inputs processed over all workers, total time in the step). A worker
    /// running a single step times runs of inputs as a whole (the time then includes the
    /// per-input overhead around the step); with several steps, every call is timed.
    pub steps: Vec<(String, u64, Duration)>,
    /// Fraction of the consumer's receive attempts that found a batch waiting (near 1: the
    /// workers are ahead of the consumer; near 0: the consumer waits for the workers).
    pub queue_occupancy: f64,
    /// Arrays that crossed a process boundary zero-copy.
    pub arrays_zero_copy: u64,
    /// Arrays that were copied.
    pub arrays_copied: u64,
    /// Malformed records skipped ([`OnBadRecord::Skip`]).
    pub skipped_records: u64,
}

impl Metrics {
    /// Items per second.
    pub fn items_per_sec(&self) -> f64 {
        self.items as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Array bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}
