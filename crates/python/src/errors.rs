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

/// A shm-ring error as a Python exception.
pub fn ring_err(e: shm_ring::Error) -> PyErr {
    use shm_ring::Error as E;
    let msg = e.to_string();
    match e {
        E::Timeout => PyTimeoutError::new_err(msg),
        E::PeerDied { .. } => PeerDied::new_err(msg),
        E::Corrupt(_) | E::NotASegment(_) | E::VersionMismatch { .. } => {
            CorruptMessage::new_err(msg)
        }
        E::Disconnected => Disconnected::new_err(msg),
        E::TooLarge {
            what,
            needed,
            limit,
            setting,
        } => PyValueError::new_err(too_large(what, needed, limit, setting)),
        E::InvalidArgument(_) => PyValueError::new_err(msg),
        E::NotFound(_) => pyo3::exceptions::PyFileNotFoundError::new_err(msg),
        E::AlreadyExists(_) => pyo3::exceptions::PyFileExistsError::new_err(msg),
        _ => ShmpipeError::new_err(msg),
    }
}

/// A channel's size limit in the parameters of `Sender.create` (the Rust message names
/// `ChannelConfig` fields; a Python channel has no large pool, so its block is the limit).
fn too_large(what: &str, needed: usize, limit: usize, setting: &str) -> String {
    if setting == "ChannelConfig::blocks" {
        format!(
            "{what} needs {needed} pool blocks but the channel has {limit}: create the Sender \
             with blocks={needed} or more"
        )
    } else if setting.contains("slots") {
        format!(
            "{what} needs {needed} bytes but the descriptor ring takes at most {limit}: create \
             the Sender with more slots= (or with blocks= so that large records travel in the \
             pool)"
        )
    } else if setting.starts_with("ChannelConfig::") {
        format!(
            "{what} needs {needed} bytes but the limit is {limit} bytes: create the Sender with \
             block_size={needed} or more (each array of a message travels in one block of the \
             channel's pool), or send it through a Pipeline, which carries items of any size"
        )
    } else {
        format!("{what} needs {needed} bytes but the limit is {limit} bytes: change {setting}")
    }
}

/// A pipeline error as a Python exception.
pub fn pipe_err(py: Python<'_>, e: shmpipe::Error) -> PyErr {
    use shmpipe::Error as E;
    let msg = e.to_string();
    let _ = &msg;
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
