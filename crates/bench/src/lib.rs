//! Benchmark harness of shmpipe: how fast `f32` arrays move between processes through
//! shm-ring (copy, zero-copy, adaptive) against the tools users would pick instead (pipes, Unix
//! sockets, iceoryx2), with single-thread memcpy as the yardstick and an in-process channel as
//! the upper bound.
//!
//! The binary `shmpipe-bench` re-executes itself as producer and consumer processes pinned to
//! two different cores (hidden `worker` subcommand); every consumer reads every element of
//! every message and checks it ([`kernel`]), so the data is really moved. Rounds interleave the
//! transports so that they share the VM's noise; results are medians over rounds with the
//! min..max spread, and every ratio is the median of per-round ratios. A cache-line ping-pong
//! probe ([`pingpong`]) runs at the start of each round and labels the results "near" or "far".
//!
//! See `docs/bench.md` for the commands and the latest figures.
#![deny(missing_docs)]

pub mod app;
pub mod cli;
pub mod contention;
pub mod goals;
pub mod headline;
pub mod kernel;
pub mod latency;
pub mod memory;
pub mod meter;
pub mod parse;
pub mod pingpong;
pub mod pipebench;
pub mod plot;
pub mod report;
pub mod runner;
pub mod stats;
pub mod sys;
pub mod transport;
pub mod transports;
pub mod tsbench;
pub mod worker;

/// Error type of the harness: any error, with a message for the user.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
