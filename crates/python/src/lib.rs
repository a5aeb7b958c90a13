//! `shmpipe._native`: the native part of the Python package `shmpipe`.
//!
//! A thin layer over the Rust crates: channels (`shm-ring`), pipelines (`shmpipe`) and the
//! GluonTS loader (`shmpipe-timeseries`). Logic lives in those crates; this crate converts
//! between numpy/Python objects and their types and handles the GIL and signals.

use pyo3::prelude::*;

mod channel;
mod dtype;
mod exceptions;
mod gluonts_line;
mod item;
mod item_arrays;
mod memory_source;
mod pipeline;
mod pipeline_errors;
mod pump;
mod run;
mod run_spec;
mod timefeat;
mod timeout;
mod worker;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    exceptions::register(m)?;
    m.add_class::<channel::Sender>()?;
    m.add_class::<channel::SenderStats>()?;
    m.add_class::<channel::Receiver>()?;
    m.add_class::<channel::Message>()?;
    m.add_class::<channel::Loan>()?;
    m.add_class::<channel::Lease>()?;
    m.add_class::<channel::Records>()?;
    m.add_class::<item::ItemLease>()?;
    m.add_class::<pipeline::PipelineRun>()?;
    m.add_function(wrap_pyfunction!(worker::worker_main, m)?)?;
    m.add_function(wrap_pyfunction!(worker::builtin_steps, m)?)?;
    m.add_function(wrap_pyfunction!(timefeat::time_features, m)?)?;
    m.add_function(wrap_pyfunction!(gluonts_line::parse_plain_line, m)?)?;
    m.add_function(wrap_pyfunction!(pipeline::item_seed, m)?)?;
    Ok(())
}
