//! Python exceptions and the mapping of the Rust errors onto them.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyKeyboardInterrupt, PyTimeoutError, PyValueError};
use pyo3::prelude::*;

create_exception!(
    shmpipe,
    ShmpipeError,
    PyException,
    "Base class of every shmpipe error."
);
create_exception!(
    shmpipe,
    PeerDied,
    ShmpipeError,
    "The process at the other end of a channel (or a pipeline process) died without closing."
);
create_exception!(
    shmpipe,
    CorruptMessage,
    ShmpipeError,
    "Data read from shared memory failed validation (the message was skipped)."
);
create_exception!(
    shmpipe,
    Disconnected,
    ShmpipeError,
    "The peer closed its end cleanly and everything it sent has been received."
);
create_exception!(
    shmpipe,
    PoolExhausted,
    ShmpipeError,
    "This receiver holds every block of the sender's pool in live arrays: nothing zero-copy can arrive."
);
create_exception!(
    shmpipe,
    PipelineError,
    ShmpipeError,
    "A pipeline failed (configuration, transport, source or a dead process)."
);
create_exception!(
    shmpipe,
    StepError,
    PipelineError,
    "A pipeline step raised in a worker: attributes step, worker, stage, input, message."
);
create_exception!(
    shmpipe,
    WorkerDied,
    PeerDied,
    "A pipeline process (worker or emitter) died."
);

/// Rust API names in the messages of the Rust crates, and what a Python user of a pipeline
/// sets instead (`shmpipe.Pipeline`'s parameters).
const PIPELINE_TERMS: &[(&str, &str)] = &[
    (
        "PipelineBuilder::channel",
        "channel=(slots, blocks, block_size)",
    ),
    (
        "ChannelConfig::block_size",
        "block_size (channel=(slots, blocks, block_size))",
    ),
    (
        "ChannelConfig::slots (or slot_size)",
        "slots (channel=(slots, blocks, block_size))",
    ),
    (
        "ChannelConfig::slots",
        "slots (channel=(slots, blocks, block_size))",
    ),
    (
        "ChannelConfig::blocks",
        "blocks (channel=(slots, blocks, block_size))",
    ),
    (" (when creating the Sender)", ""),
    ("PipelineBuilder::batch_bytes", "batch_bytes="),
    ("PipelineBuilder::workers", "workers="),
    ("PipelineBuilder::emitters", "emitters="),
];

/// `msg` with the Rust API names a pipeline's errors may carry replaced by the Python
/// parameters that set the same thing.
pub fn python_terms(msg: &str) -> String {
    let mut out = msg.to_owned();
    for (rust, python) in PIPELINE_TERMS {
        if out.contains(rust) {
            out = out.replace(rust, python);
        }
    }
    out
}

/// A pipeline error as a Python exception (its message in Python terms: [`python_terms`]).
pub fn pipe_err(py: Python<'_>, e: shmpipe::Error) -> PyErr {
    use shmpipe::Error as E;
    let msg = python_terms(&e.to_string());
    match e {
        E::Step {
            step,
            stage,
            worker,
            input,
            message,
        } => {
            // A Python step's message starts with the callable's name (see `worker::PyStep`).
            let (step, message) = match message.split_once('\n') {
                Some((name, rest)) if step == crate::worker::PY_STEP => {
                    (name.to_owned(), rest.to_owned())
                }
                _ => (step, message),
            };
            let message = python_terms(&message);
            let err = StepError::new_err(format!(
                "step {step:?} failed in worker {worker} (stage {stage}) on input {input}:\n{message}"
            ));
            let v = err.value(py);
            let _ = v.setattr("step", step);
            let _ = v.setattr("stage", stage);
            let _ = v.setattr("worker", worker);
            let _ = v.setattr("input", input);
            let _ = v.setattr("message", message);
            err
        }
        E::ProcessDied { role, pid, status } => {
            let err = WorkerDied::new_err(msg);
            let v = err.value(py);
            let _ = v.setattr("role", role);
            let _ = v.setattr("pid", pid);
            let _ = v.setattr("status", status);
            err
        }
        E::TooLarge { role, message } => {
            // The Rust message names ChannelGeometry; a Python user has `channel=`.
            let what = message.split(": raise").next().unwrap_or(&message);
            PipelineError::new_err(format!(
                "pipeline {role}: {what}: raise large_pool, the 4th value of \
                 channel=(slots, blocks, block_size, large_pool), or leave it out (the default \
                 carries any item the machine holds)"
            ))
        }
        E::Interrupted => PyKeyboardInterrupt::new_err(msg),
        E::Timeout => PyTimeoutError::new_err(msg),
        E::Config(_) => PyValueError::new_err(msg),
        _ => PipelineError::new_err(msg),
    }
}

/// Registers the exception classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ShmpipeError", py.get_type::<ShmpipeError>())?;
    m.add("PeerDied", py.get_type::<PeerDied>())?;
    m.add("CorruptMessage", py.get_type::<CorruptMessage>())?;
    m.add("Disconnected", py.get_type::<Disconnected>())?;
    m.add("PoolExhausted", py.get_type::<PoolExhausted>())?;
    m.add("PipelineError", py.get_type::<PipelineError>())?;
    m.add("StepError", py.get_type::<StepError>())?;
    m.add("WorkerDied", py.get_type::<WorkerDied>())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipeline_errors_name_python_parameters() {
        // The message a pipeline whose channel is too small for an item gave until issue 18.
        let rust = "pipeline transport: enqueue: zero-copy array needs 4000000 bytes but the \
                    limit is 1048576 bytes: set ChannelConfig::block_size to at least 4000000 \
                    (when creating the Sender) (raise the pool block size with \
                    PipelineBuilder::channel, or lower batch_bytes)";
        let py = python_terms(rust);
        assert!(!py.contains("::"), "{py}");
        assert!(py.contains("set block_size (channel=(slots, blocks, block_size)) to at least"));
        assert!(py.contains("with channel=(slots, blocks, block_size), or lower batch_bytes"));
        for (rust, _) in PIPELINE_TERMS {
            assert!(!python_terms(rust).contains("::"), "{rust}");
        }
    }
}
