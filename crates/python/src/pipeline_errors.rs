//! Pipeline errors (`shmpipe::Error`) as Python exceptions, in Python's terms.

use pyo3::exceptions::{PyKeyboardInterrupt, PyTimeoutError, PyValueError};
use pyo3::prelude::*;

use crate::exceptions::{PipelineError, StepError, WorkerDied};

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
    ("PipelineBuilder::shuffle_buffer", "shuffle_buffer="),
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

/// Where a run's inputs come from, and where its steps run: what a step error can truthfully
/// say about the failing input and the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Emitter processes read a file or a named source: `emitter e, record k` is true.
    Emitters,
    /// This process feeds an in-memory source.
    Fed,
    /// This process reads a file or named source and feeds it (persistent workers,
    /// `workers=0`).
    FedFile,
    /// The user enqueues the inputs.
    Enqueued,
}

/// The failing input as a Python user knows it: `input` (the pipeline's words, `emitter e,
/// record k` and a summary in parentheses) retold for `origin`.
fn input_words(input: &str, emitter: Option<usize>, record: Option<u64>, origin: Origin) -> String {
    let (Some(e), Some(k)) = (emitter, record) else {
        return input.to_owned();
    };
    let what = match origin {
        Origin::Emitters => return input.to_owned(),
        Origin::Fed => format!("item {k} fed by this process (counted from 0, in feeding order)"),
        Origin::FedFile => format!("record {k} read by this process (counted from 0)"),
        Origin::Enqueued => format!("enqueued input {k} (counted from 0)"),
    };
    // The summary of the item's fields that follows the pipeline's own words, if any.
    let summary = input
        .strip_prefix(&format!("emitter {e}, record {k}"))
        .unwrap_or_default();
    format!("{what}{summary}")
}

/// A step's failure as `StepError`, with its fields as attributes. `inline`: the steps ran
/// in this process (`workers=0`), so there is no worker.
fn step_err(py: Python<'_>, e: shmpipe::Error, origin: Origin, inline: bool) -> PyErr {
    let shmpipe::Error::Step {
        step,
        stage,
        worker,
        emitter,
        record,
        input,
        message,
        ..
    } = e
    else {
        return pipe_err(py, e);
    };
    let message = python_terms(&message);
    let input = input_words(&input, emitter, record, origin);
    let place = if inline {
        "in this process (workers=0)".to_owned()
    } else {
        format!("in worker {worker} (stage {stage})")
    };
    let err = StepError::new_err(format!(
        "step {step:?} failed {place} on input {input}:\n{message}"
    ));
    let v = err.value(py);
    let _ = v.setattr("step", step);
    let _ = v.setattr("stage", stage);
    let _ = v.setattr("worker", (!inline).then_some(worker));
    let _ = v.setattr("input", input);
    let _ = v.setattr("record", record);
    let _ = v.setattr("message", message);
    err
}

/// A pipeline error of a run as a Python exception: [`pipe_err`], with a step's failure
/// told as `origin` and `inline` make true.
pub fn run_err(py: Python<'_>, e: shmpipe::Error, origin: Origin, inline: bool) -> PyErr {
    match e {
        shmpipe::Error::Step { .. } => step_err(py, e, origin, inline),
        e => pipe_err(py, e),
    }
}

/// A pipeline error as a Python exception (its message in Python terms: [`python_terms`]).
pub fn pipe_err(py: Python<'_>, e: shmpipe::Error) -> PyErr {
    use shmpipe::Error as E;
    let msg = python_terms(&e.to_string());
    match e {
        E::Step { .. } => step_err(py, e, Origin::Emitters, false),
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

/// A source's error as the pipeline's (a bad record keeps its file, line and field).
pub(crate) fn source_err(e: shmpipe::SourceError) -> shmpipe::Error {
    match e {
        shmpipe::SourceError::BadRecord {
            file,
            line,
            field,
            message,
        } => shmpipe::Error::BadRecord {
            file,
            line,
            field,
            message,
        },
        error => shmpipe::Error::Source { emitter: 0, error },
    }
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

    #[test]
    fn inputs_fed_by_this_process_are_not_called_an_emitter_s_records() {
        let input = "emitter 0, record 7 (x: float32[3])";
        let words = |origin| input_words(input, Some(0), Some(7), origin);
        assert_eq!(words(Origin::Emitters), input);
        let fed = words(Origin::Fed);
        assert!(fed.starts_with("item 7 fed by this process") && !fed.contains("emitter"));
        assert!(fed.ends_with(" (x: float32[3])"), "{fed}");
        let enq = input_words("emitter 0, record 12", Some(0), Some(12), Origin::Enqueued);
        assert_eq!(enq, "enqueued input 12 (counted from 0)");
        assert_eq!(
            input_words("end of stream", None, None, Origin::Fed),
            "end of stream"
        );
    }
}
