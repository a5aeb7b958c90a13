//! # shmpipe: data pipelines whose steps run in worker processes
//!
//! A pipeline reads records in *emitter* processes (a JSON-lines file split into line-aligned
//! byte ranges, or any registered [`Source`]), runs *steps* (flat-maps: 0..n outputs per input)
//! in *worker* processes, and delivers the outputs to the consumer, the process that started
//! it. Items cross processes in byte-sized batches over `shm-ring` shared-memory rings; large
//! arrays go zero-copy through the producer's payload pool.
//!
//! Children are the current executable re-executed with the role in an environment variable;
//! [`init`] at the top of `main` diverts them into their role. Steps and sources are therefore
//! registered by name in a [`Registry`] that the parent and the children build the same way.
//!
//! End of stream is exact: every connection is FIFO and carries one end marker; a node sends
//! its end markers after it holds the markers of all its inputs and has sent its last output.
//! A process that dies is an error at the consumer, never an end.
//!
//! Without a source the caller feeds the pipeline: [`Pipeline::run`] for the common case, or
//! the [`Input`] handle of [`Pipeline::input`], whose drop closes the input. Items hold arrays
//! of any shm-ring [`DType`] (f16, bf16 and bool included). Every [`Error`]'s `Display` names what
//! failed and where: print errors with `{}`, not `{:?}`. A tour of the whole API, compiled and
//! run as doc tests: `docs/pipeline-api.md`.
//!
//! ```
//! use shmpipe::{map, Item, JsonLines, Pipeline, Registry};
//!
//! fn registry() -> Registry {
//!     Registry::new().step("double", |_cx| Ok(map(|mut it: Item| {
//!         if let Some(mut x) = it.array_mut::<f32>("target") { x *= 2.0; }
//!         Ok(it)
//!     })))
//! }
//!
//! fn main() -> Result<(), shmpipe::Error> {
//!     let reg = registry();
//!     shmpipe::init(&reg); // children run their role here and exit
//!
//!     // A small JSON-lines file: one record per line, number arrays become f32 arrays.
//!     let data = std::env::temp_dir().join(format!("shmpipe-root-{}.jsonl", std::process::id()));
//!     std::fs::write(&data, "{\"item_id\": \"a\", \"target\": [1, 2]}\n\
//!                            {\"item_id\": \"b\", \"target\": [3, 4]}\n").expect("write data");
//!
//!     let p = Pipeline::builder(&reg)
//!         .source(JsonLines::new(&data))
//!         .emitters(2)
//!         .step("double")
//!         .workers(2)
//!         .start()?;
//!     for item in p {
//!         let item = item?;
//!         let x = item.array::<f32>("target").expect("every record has a target");
//!         println!("{}: {x}", item.str("item_id").unwrap_or("?"));
//!     }
//!     std::fs::remove_file(&data).expect("remove data");
//!     Ok(())
//! }
//! ```
#![deny(missing_docs)]

mod arena;
mod array;
mod broker;
mod builder;
mod chain;
mod child;
mod config;
mod credit;
mod error;
mod handover;
mod heap;
mod inline;
mod input;
mod item;
mod jsonl;
mod name;
mod node;
mod pipeline;
mod plan;
mod process;
mod ready;
mod records;
mod reorder;
mod roles;
mod seed;
mod share;
mod shm;
mod shuffle;
mod socket;
mod source;
mod step;
mod supervisor;
mod wire;

pub use array::{Array, ArrayRef};
pub use builder::PipelineBuilder;
pub use credit::{DEFAULT_REORDER_WINDOW, REORDER_BYTES};
pub use error::Error;
pub use half;
pub use input::Input;
pub use item::{ArrayOwner, Item, Meta};
pub use jsonl::{FieldKind, JsonLines, JsonLinesPart, split_seeks};
pub use ndarray;
pub use pipeline::{
    DEFAULT_BATCH_BYTES, DEFAULT_PIPELINE_THRESHOLD, DEFAULT_WARN_IDLE, Epochs, Metrics,
    OnBadRecord, Pipeline, Topology,
};
pub use plan::ChannelGeometry;
pub use process::{ROLE_ENV, init};
pub use records::{ReadOrder, Records};
pub use seed::{item_seed, select_input};
pub use share::SharedFd;
pub use shm_ring::{DType, Element, Transfer};
pub use shuffle::{MAX_SHUFFLE_BUFFER, ShuffleBuffer, derive_seed, read_order};
pub use source::{MemorySource, Source, SourceContext, SourceError, part_range};
pub use step::{
    Filter, FlatMap, Map, Registry, Step, StepContext, StepError, WorkerInfo, filter, flat_map, map,
};

// A pipeline can be moved to another thread, and items shared between threads.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<Item>();
    send::<Pipeline>();
};

// The Rust blocks of README.md and docs/pipeline-api.md run as doc tests of this crate
// (`cargo test -p shmpipe --doc`), so the docs cannot drift from the code.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
#[cfg(doctest)]
#[doc = include_str!("../../../docs/pipeline-api.md")]
struct ApiTourDoctests;
