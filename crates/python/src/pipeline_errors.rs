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

/// The pipeline's description of an input (`emitter e, record k` plus a summary in
/// parentheses) split into `(e, k, summary)`; `None` for other inputs (the end of stream).
fn record_of(input: &str) -> Option<(u64, u64, &str)> {
    let rest = input.strip_prefix("emitter ")?;
    let (e, rest) = rest.split_once(", record ")?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    Some((e.parse().ok()?, rest[..end].parse().ok()?, &rest[end..]))
}

/// The failing input as a Python user knows it, and its record number.
fn input_words(input: &str, origin: Origin) -> (String, Option<u64>) {
    let Some((e, k, summary)) = record_of(input) else {
        return (input.to_owned(), None);
    };
    let what = match origin {
        Origin::Emitters => return (input.to_owned(), Some(k)),
        Origin::Fed => format!("item {k} fed by this process (counted from 0, in feeding order)"),
        Origin::FedFile => format!("record {k} read by this process (counted from 0)"),
        Origin::Enqueued => format!("enqueued input {k} (counted from 0)"),
    };
    debug_assert_eq!(e, 0, "a source fed by this process is emitter 0");
    (format!("{what}{summary}"), Some(k))
}

/// A step's failure as `StepError`, with its fields as attributes. `inline`: the steps ran
/// in this process (`workers=0`), so there is no worker.
fn step_err(py: Python<'_>, e: shmpipe::Error, origin: Origin, inline: bool) -> PyErr {
    let shmpipe::Error::Step {
        step,
        stage,
        worker,
        input,
        message,
    } = e
    else {
        return pipe_err(py, e);
    };
    // A Python step's message starts with the callable's name (see `worker::PyStep`).
    let (step, message) = match message.split_once('\n') {
        Some((name, rest)) if step == crate::worker::PY_STEP => (name.to_owned(), rest.to_owned()),
        _ => (step, message),
    };
    let message = python_terms(&message);
    let (input, record) = input_words(&input, origin);
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
        assert_eq!(record_of(input), Some((0, 7, " (x: float32[3])")));
        assert_eq!(
            input_words(input, Origin::Emitters),
            (input.to_owned(), Some(7))
        );
        let (fed, k) = input_words(input, Origin::Fed);
        assert!(fed.starts_with("item 7 fed by this process") && !fed.contains("emitter"));
        assert!(fed.ends_with(" (x: float32[3])") && k == Some(7), "{fed}");
        let (enq, _) = input_words("emitter 0, record 12", Origin::Enqueued);
        assert!(enq.starts_with("enqueued input 12"), "{enq}");
        assert_eq!(
            input_words("end of stream", Origin::Fed),
            ("end of stream".into(), None)
        );
    }
}
