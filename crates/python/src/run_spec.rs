//! The spec of a pipeline run as it crosses from Python (`shmpipe.pipeline.RunSpec`, a
//! dataclass read by attribute): typed, every field required. The defaults and the checks
//! that name Python parameters are in one place, `shmpipe.Pipeline`'s signature and
//! `shmpipe._options`; what Rust turns it into is here.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::Value;
use shmpipe::{
    ChannelGeometry, Epochs, JsonLines, OnBadRecord, Pipeline, PipelineBuilder, ReadOrder,
};

use crate::memory_source::FeedSpec;
use crate::worker;

/// One step: a registry name and its arguments as JSON.
#[derive(Debug, FromPyObject)]
pub struct StepSpec {
    pub name: String,
    pub args: String,
}

/// Where a run's items come from (`kind`: `"jsonl"`, `"named"` or `"object"`).
#[derive(Debug, FromPyObject)]
pub struct SourceSpec {
    pub kind: String,
    pub path: Option<String>,
    pub name: Option<String>,
    pub args: Option<String>,
}

/// A source as Rust reads it.
pub enum SourceKind {
    /// A JSON-lines file.
    Jsonl(String),
    /// A source of the registry, with its arguments.
    Named(String, Value),
    /// An in-memory Python source read by this process.
    Object,
}

/// `shmpipe.pipeline.RunSpec`.
#[derive(Debug, FromPyObject)]
pub struct RunSpec {
    pub workers: usize,
    pub emitters: usize,
    pub ordered: bool,
    pub shuffle: bool,
    pub seed: u64,
    pub shuffle_buffer: usize,
    /// `None`: endless.
    pub epochs: Option<u64>,
    pub rank: usize,
    pub world_size: usize,
    pub batch_bytes: Option<usize>,
    pub skip_bad_records: bool,
    /// `(slots, blocks, block_size[, large_pool])`, checked by `shmpipe._options.channel`.
    pub channel: Option<Vec<usize>>,
    pub steps: Vec<StepSpec>,
    pub max_in_flight: u64,
    /// Seconds; `None`: never warn.
    pub warn_idle: Option<f64>,
    pub prefetch: usize,
    /// Read by emitter processes (`None`: enqueue mode, or `feed`).
    pub source: Option<SourceSpec>,
    /// Read by this process.
    pub feed: Option<SourceSpec>,
}

fn json(what: &str, s: &str) -> PyResult<Value> {
    serde_json::from_str(s).map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

impl SourceSpec {
    /// The source, its fields checked against its kind.
    pub fn kind(&self) -> PyResult<SourceKind> {
        let missing =
            |f: &str| PyValueError::new_err(format!("a {} source without {f}", self.kind));
        Ok(match self.kind.as_str() {
            "jsonl" => SourceKind::Jsonl(self.path.clone().ok_or_else(|| missing("path"))?),
            "named" => {
                let name = self.name.clone().ok_or_else(|| missing("name"))?;
                let args = json("source args", self.args.as_deref().unwrap_or("null"))?;
                SourceKind::Named(name, args)
            }
            "object" => SourceKind::Object,
            k => return Err(PyValueError::new_err(format!("unknown source kind {k:?}"))),
        })
    }
}

impl RunSpec {
    /// The builder of this run, its children being `program args..`.
    pub fn builder(&self, program: String, args: Vec<String>) -> PyResult<PipelineBuilder> {
        let reg = worker::registry();
        let mut b = Pipeline::builder(&reg)
            .handle_ctrl_c(false)
            // The pump always waits for output: `Run` says when a user's dequeue waits in vain.
            .warn_idle_after(std::time::Duration::ZERO)
            .child_program(program, args)
            .workers(self.workers)
            .emitters(self.emitters)
            .ordered(self.ordered)
            .shuffle(self.shuffle)
            .shuffle_buffer(self.shuffle_buffer)
            .seed(self.seed)
            .shard(self.rank, self.world_size)
            .epochs(self.epochs.map_or(Epochs::Cycle, Epochs::Finite));
        if let Some(n) = self.batch_bytes {
            b = b.batch_bytes(n);
        }
        if self.skip_bad_records {
            b = b.on_bad_record(OnBadRecord::Skip);
        }
        if let Some(c) = &self.channel {
            b = b.channel(geometry(c)?);
        }
        if let Some(src) = &self.source {
            b = match src.kind()? {
                SourceKind::Jsonl(path) => b.source(JsonLines::new(path)),
                SourceKind::Named(name, args) => b.source_named(&name, args),
                SourceKind::Object => {
                    return Err(PyValueError::new_err(
                        "an in-memory source is fed by this process (feed=), not by emitters",
                    ));
                }
            };
        }
        for s in &self.steps {
            b = b.step_with(&s.name, json(&s.name, &s.args)?);
        }
        Ok(b)
    }

    /// How this process reads its part of a source it feeds (as emitter 0 of its rank).
    pub fn read_order(&self) -> ReadOrder {
        ReadOrder {
            seed: self.seed,
            shuffle: self.shuffle,
            shuffle_buffer: self.shuffle_buffer,
            rank: self.rank,
            emitter: 0,
            on_bad_record: if self.skip_bad_records {
                OnBadRecord::Skip
            } else {
                OnBadRecord::Fail
            },
        }
    }

    /// The settings that concern an in-memory source.
    pub fn feed_spec(&self) -> FeedSpec {
        FeedSpec {
            seed: self.seed,
            shuffle: self.shuffle,
            shuffle_buffer: self.shuffle_buffer,
            epochs: self.epochs,
            rank: self.rank,
            world_size: self.world_size,
        }
    }
}

/// `channel=` as the pipeline's geometry (a 4th value: the large pool; default: any size).
fn geometry(c: &[usize]) -> PyResult<ChannelGeometry> {
    let n32 = |i: usize| u32::try_from(c[i]).map_err(|_| PyValueError::new_err("channel="));
    if !(3..=4).contains(&c.len()) {
        return Err(PyValueError::new_err(
            "channel=(slots, blocks, block_size[, large_pool])",
        ));
    }
    let d = ChannelGeometry::default();
    Ok(ChannelGeometry {
        slots: n32(0)?,
        blocks: n32(1)?,
        block_size: c[2],
        large_pool: c.get(3).copied().unwrap_or(d.large_pool),
    })
}
