//! The `pipeline` subcommand: the pipeline crate (`shmpipe`) moving f32 arrays through worker
//! processes, over workers x topology x batch bytes x transfer mode x array size.
//!
//! Workload `arrays`: an emitter generates items holding one f32 array `x` of N elements
//! (message `seq` filled with [`kernel::value_for`]`(seq)`, `seq` in metadata); step
//! `bench-check` reads every element and checks it, step `bench-scale` doubles every element
//! in place; the consumer (the harness process) checks every item it gets. With the fused
//! topology each worker runs both steps; staged runs one stage per step.

use std::ops::Range;
use std::time::{Duration, Instant};

use serde_json::json;
use shmpipe::{
    Epochs, Item, MemorySource, Pipeline, Registry, Source, SourceContext, SourceError, StepError,
    Topology, Transfer, map, part_range,
};

use crate::BoxError;
use crate::kernel;
use crate::meter::{Meter, stride_for};

/// Registered name of the array source.
pub const SOURCE: &str = "bench-arrays";
/// Registered name of the checking step.
pub const STEP_CHECK: &str = "bench-check";
/// Registered name of the scaling step.
pub const STEP_SCALE: &str = "bench-scale";
/// Factor of `bench-scale` (a power of two keeps the checked sums exact).
pub const FACTOR: f32 = 2.0;
/// Items in one epoch of the source; the pipeline cycles over epochs until the harness stops.
pub const EPOCH_ITEMS: usize = 10_000;

/// Layout of the steps over worker processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TopologyKind {
    /// Every worker runs both steps.
    Fused,
    /// One stage of workers per step.
    Staged,
}

/// Transfer mode of the pipeline's channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransferKind {
    /// Arrays copied inline.
    Copy,
    /// Arrays in pool blocks.
    ZeroCopy,
    /// The pipeline's default adaptive policy (threshold 64 KiB).
    Adaptive,
    /// The pipeline's Unix-socket reference transport instead of shared memory.
    Socket,
}

/// One pipeline configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipeConfig {
    /// Worker processes per stage.
    pub workers: usize,
    /// Step layout.
    pub topology: TopologyKind,
    /// Target batch size in bytes.
    pub batch_bytes: usize,
    /// Transfer mode.
    pub transfer: TransferKind,
}

impl PipeConfig {
    /// Name used in tables and CSV, e.g. `fused w2 64KiB adaptive`.
    pub fn label(&self) -> String {
        let topo = match self.topology {
            TopologyKind::Fused => "fused",
            TopologyKind::Staged => "staged",
        };
        let transfer = match self.transfer {
            TransferKind::Copy => "copy",
            TransferKind::ZeroCopy => "zero-copy",
            TransferKind::Adaptive => "adaptive",
            TransferKind::Socket => "socket",
        };
        format!(
            "{topo} w{} {} {transfer}",
            self.workers,
            bytes_label(self.batch_bytes)
        )
    }

    pub(crate) fn topology(&self) -> Topology {
        match self.topology {
            TopologyKind::Fused => Topology::Fused,
            TopologyKind::Staged => Topology::Staged { workers: vec![] },
        }
    }

    fn transfer(&self) -> Transfer {
        match self.transfer {
            TransferKind::Copy => Transfer::Copy,
            TransferKind::ZeroCopy => Transfer::ZeroCopy,
            TransferKind::Adaptive | TransferKind::Socket => Transfer::Adaptive {
                threshold: shmpipe::DEFAULT_PIPELINE_THRESHOLD,
            },
        }
    }

    /// Pool geometry for items of `elements` floats: blocks that hold a whole batch plus one
    /// item (at least 1 MiB), about 64 MiB per channel, 4 to 16 blocks.
    pub fn channel(&self, elements: usize) -> (u32, u32, usize) {
        let block = (self.batch_bytes + elements * 4 + (64 << 10))
            .next_multiple_of(4096)
            .max(1 << 20);
        let blocks = ((64 << 20) / block).clamp(4, 16) as u32;
        (1024, blocks, block)
    }
}

/// `65536` -> `64KiB`, `1048576` -> `1MiB`, `1000` -> `1000B`.
pub fn bytes_label(b: usize) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{}KiB", b >> 10)
    } else {
        format!("{b}B")
    }
}

/// The source: item `k` of the whole stream carries an array of `elements` floats.
#[derive(Debug)]
struct ArraySource {
    elements: usize,
    range: Range<usize>,
}

impl Source for ArraySource {
    fn len(&self) -> usize {
        self.range.len()
    }

    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        let seq = (self.range.start + index) as u64;
        let x = ndarray::Array1::from_elem(self.elements, kernel::value_for(seq));
        Ok(Item::new().with_meta("seq", seq as i64).with("x", x))
    }
}

fn seq_of(item: &Item) -> Result<u64, StepError> {
    item.i64("seq")
        .map(|s| s as u64)
        .ok_or_else(|| StepError::new("item without seq"))
}

/// The harness's steps and sources, and those of the timeseries workload. Every process of the
/// binary passes it to `shmpipe::init`.
pub fn registry() -> Registry {
    shmpipe_timeseries::pipeline::register(Registry::new())
        .source(SOURCE, |cx: &SourceContext<'_>| {
            let elements = cx.args["elements"].as_u64().unwrap_or(1000) as usize;
            let items = cx.args["items"]
                .as_u64()
                .map_or(EPOCH_ITEMS, |n| n as usize);
            Ok(ArraySource {
                elements,
                range: part_range(items, cx.part, cx.parts),
            })
        })
        .source("bench-empty", |_| Ok(MemorySource::new(Vec::new())))
        .step(STEP_CHECK, |_| {
            Ok(map(|item: Item| {
                let seq = seq_of(&item)?;
                let x = item
                    .array::<f32>("x")
                    .ok_or_else(|| StepError::new("no f32 array x"))?;
                let xs = x
                    .as_slice()
                    .ok_or_else(|| StepError::new("x not contiguous"))?;
                kernel::check(xs, seq).map_err(StepError::new)?;
                Ok(item)
            }))
        })
        .step(STEP_SCALE, |_| {
            Ok(map(|mut item: Item| {
                item.array_mut::<f32>("x")
                    .ok_or_else(|| StepError::new("no f32 array x"))?
                    .mapv_inplace(|v| v * FACTOR);
                Ok(item)
            }))
        })
}

/// Runs `cfg` on arrays of `elements` floats: starts the pipeline, reads for `warmup` plus
/// `duration` after the first item, checks every item, and returns items per second in the
/// measured window. The pipeline is dropped (children killed, segments unlinked) at the end.
///
/// # Errors
/// Pipeline errors, or an item that fails the check.
pub fn measure(
    reg: &Registry,
    cfg: &PipeConfig,
    elements: usize,
    warmup: Duration,
    duration: Duration,
) -> Result<f64, BoxError> {
    let (slots, blocks, block_size) = cfg.channel(elements);
    let mut p = Pipeline::builder(reg)
        .source_named(SOURCE, json!({ "elements": elements }))
        .epochs(Epochs::Cycle)
        .step(STEP_CHECK)
        .step(STEP_SCALE)
        .workers(cfg.workers)
        .topology(cfg.topology())
        .batch_bytes(cfg.batch_bytes)
        .transfer(cfg.transfer())
        .channel(shmpipe::ChannelGeometry {
            slots,
            blocks,
            block_size,
            ..shmpipe::ChannelGeometry::default()
        })
        .socket_transport(cfg.transfer == TransferKind::Socket)
        .start()?;
    let mut meter = Meter::new(warmup, stride_for(elements));
    let mut end: Option<Instant> = None;
    let mut seen = 0u64;
    while let Some(item) = p.dequeue()? {
        let seq = seq_of(&item)?;
        let x = item.array::<f32>("x").ok_or("item without f32 array x")?;
        let xs = x.as_slice().ok_or("x not contiguous")?;
        if xs.len() != elements {
            return Err(format!("array of {} floats, expected {elements}", xs.len()).into());
        }
        meter.record(kernel::check_scaled(xs, seq, FACTOR)?);
        seen += 1;
        let end = *end.get_or_insert_with(|| Instant::now() + warmup + duration);
        if seen.is_multiple_of(u64::from(stride_for(elements))) && Instant::now() >= end {
            break;
        }
    }
    let outcome = meter.finish();
    drop(p);
    if outcome.messages == 0 {
        return Err(format!("{} delivered no item in the window", cfg.label()).into());
    }
    Ok(outcome.rate())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        let cfg = PipeConfig {
            workers: 2,
            topology: TopologyKind::Staged,
            batch_bytes: 64 << 10,
            transfer: TransferKind::ZeroCopy,
        };
        assert_eq!(cfg.label(), "staged w2 64KiB zero-copy");
        assert_eq!(bytes_label(1 << 20), "1MiB");
        assert_eq!(bytes_label(1000), "1000B");
        assert_eq!(cfg.transfer(), Transfer::ZeroCopy);
        let (_, blocks, block) = cfg.channel(1_000_000);
        assert!(block >= 4_000_000 + (64 << 10) && block.is_multiple_of(4096));
        assert!((4..=16).contains(&blocks));
        assert_eq!(cfg.channel(10).2, 1 << 20);
    }

    #[test]
    fn source_parts_cover_the_stream() {
        let mut a = ArraySource {
            elements: 8,
            range: part_range(10, 1, 2),
        };
        assert_eq!(a.len(), 5);
        let item = a.read(0).unwrap();
        assert_eq!(item.i64("seq"), Some(5));
        let x = item.array::<f32>("x").unwrap();
        assert_eq!(kernel::check(x.as_slice().unwrap(), 5), Ok(8.0 * 2.0));
    }
}
