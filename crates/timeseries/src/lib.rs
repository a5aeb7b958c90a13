//! GluonTS-compatible time-series datasets for shmpipe: a fast JSON-lines
//! reader, GluonTS 0.17's transformations and batching.
//!
//! Usable on its own (single process) and as pipeline steps.
//!
//! # Quick start
//! ```
//! use shmpipe_timeseries::{jsonl, workload::{deepar_chain, ChainConfig}, batch::Batcher};
//! let freq = "h".parse().unwrap();
//! let lines = br#"{"start": "2021-03-01 00:00:00", "target": [1, 2, null, 4, 5, 6, 7, 8, 9, 10]}"#;
//! let entries = jsonl::parse_lines(lines, freq).unwrap();
//! let cfg = ChainConfig { freq, context_length: 4, prediction_length: 2, ..ChainConfig::default() };
//! let mut chain = deepar_chain(&cfg, 7);
//! let mut windows = vec![];
//! for e in entries { chain.apply(e, true, &mut windows).unwrap(); }
//! let mut batcher = Batcher::new(32);
//! for w in windows { assert!(batcher.push(w).is_none()); }
//! if let Some(batch) = batcher.finish() {
//!     let batch = batch.unwrap();
//!     assert_eq!(batch.get("past_target").unwrap().shape()[1], 4);
//!     assert_eq!(batch.get("past_time_feat").unwrap().shape()[1..], [4, 5]);
//! }
//! ```
#![deny(missing_docs, missing_debug_implementations)]

pub mod arrow;
pub mod batch;
pub mod entry;
pub mod error;
pub mod features;
pub mod fused;
pub mod jsonl;
pub mod memstat;
pub mod period;
pub mod pipeline;
pub mod rows;
pub mod sampler;
pub mod serde_reader;
pub mod shared;
pub mod synth;
pub mod transform;
pub mod workload;

pub use batch::{Batch, Batcher};
pub use entry::{DataEntry, FieldArray, field};
pub use error::{BatchError, ParseError, ReadError, TimeError, TransformError};
pub use period::{DateTime, Freq, FreqUnit, Period};
pub use transform::{Chain, Transform};

/// docs/timeseries.md, whose Rust blocks run as doc tests (so the guide cannot drift).
#[cfg(doctest)]
#[doc = include_str!("../../../docs/timeseries.md")]
struct TimeseriesGuide;
