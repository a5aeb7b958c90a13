//! The pipeline's error type.

use std::fmt;

use crate::source::SourceError;
use crate::wire::{Report, TransportError};

/// What can go wrong in a pipeline. The consumer gets it from
/// [`Pipeline::dequeue`](crate::Pipeline::dequeue) (or the iterator); the pipeline is then
/// shut down.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Invalid builder settings (e.g. an unknown step name).
    Config(String),
    /// A child process could not be started.
    Spawn(std::io::Error),
    /// A connection between processes failed.
    Transport {
        /// What failed, in the pipeline's terms.
        message: String,
        /// The typed error behind it (a shared-memory channel's `shm_ring::Error`, an OS
        /// error) when this process saw it; `None` when another process reported the failure
        /// (it crosses as text, in `message`).
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A malformed record in a source (policy [`OnBadRecord::Fail`](crate::OnBadRecord::Fail)).
    BadRecord {
        /// File (or source name).
        file: String,
        /// 1-based line number.
        line: u64,
        /// The offending field, when one is to blame.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// A source failed (other than a malformed record).
    Source {
        /// The emitter.
        emitter: usize,
        /// The error.
        error: SourceError,
    },
    /// A step returned an error or panicked.
    Step {
        /// Step name.
        step: String,
        /// Stage index (0 in the fused topology).
        stage: usize,
        /// Worker index within the stage.
        worker: usize,
        /// The failing input's emitter (`None` at the end of stream, or building the step).
        emitter: Option<usize>,
        /// The failing input's record: its index in the emitter's stream, counted from 0 over
        /// all epochs (in enqueue mode, the index of the enqueued input).
        record: Option<u64>,
        /// The input: `emitter e, record k` (plus its `item_id` when it has one), or
        /// `end of stream` for [`Step::finish`](crate::Step::finish) and what later steps make
        /// of its outputs.
        input: String,
        /// The error message (or panic message).
        message: String,
    },
    /// A child process died (killed by a signal, or exited unexpectedly).
    ProcessDied {
        /// `emitter 1`, `worker 0 (stage 0)`, ...
        role: String,
        /// Its pid.
        pid: u32,
        /// How it ended, e.g. `killed by signal 9`.
        status: String,
    },
    /// An item (or batch) exceeded what the pipeline's channels carry. Only with a channel
    /// geometry that limits it ([`ChannelGeometry::large_pool`](crate::ChannelGeometry::large_pool)
    /// set small or to 0); the message names the setting.
    TooLarge {
        /// The process that could not send it: `emitter 0`, `worker 1 (stage 0)`.
        role: String,
        /// What was too large, and what to raise.
        message: String,
    },
    /// Ctrl-C (SIGINT) was received.
    Interrupted,
    /// The operation is not possible in this state (e.g. `enqueue` after `close_input`).
    Closed(String),
    /// The handle was used in a process forked from the one that started the pipeline: only
    /// that process may use it (see [`Pipeline`](crate::Pipeline), "Fork").
    Forked {
        /// The process that started the pipeline.
        owner: u32,
        /// The calling process.
        caller: u32,
    },
    /// [`Pipeline::dequeue_timeout`](crate::Pipeline::dequeue_timeout) waited its whole
    /// timeout without an output. Unlike the other errors it stops nothing: the pipeline runs
    /// on.
    Timeout,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(m) => write!(f, "pipeline configuration: {m}"),
            Error::Spawn(e) => write!(f, "cannot start a pipeline process: {e}"),
            Error::Transport {
                message,
                source: Some(e),
            } => write!(f, "pipeline transport: {message}: {e}"),
            Error::Transport { message, .. } => write!(f, "pipeline transport: {message}"),
            Error::BadRecord {
                file,
                line,
                field: Some(field),
                message,
            } => {
                write!(f, "bad record at {file}:{line}, field {field:?}: {message}")
            }
            Error::BadRecord {
                file,
                line,
                field: None,
                message,
            } => {
                write!(f, "bad record at {file}:{line}: {message}")
            }
            Error::Source { emitter, error } => write!(f, "source of emitter {emitter}: {error}"),
            Error::Step {
                step,
                stage,
                worker,
                input,
                message,
                ..
            } => write!(
                f,
                "step {step:?} failed in worker {worker} (stage {stage}) on input {input}: {message}"
            ),
            Error::ProcessDied { role, pid, status } => {
                write!(f, "pipeline {role} (pid {pid}) died: {status}")
            }
            Error::TooLarge { role, message } => write!(f, "pipeline {role}: {message}"),
            Error::Interrupted => f.write_str("pipeline interrupted (Ctrl-C)"),
            Error::Closed(m) => write!(f, "pipeline closed: {m}"),
            Error::Forked { owner, caller } => write!(
                f,
                "pipeline handle used in process {caller}, a fork of process {owner}, which \
                 started the pipeline: only that process may use it (start a pipeline in the \
                 child instead)"
            ),
            Error::Timeout => f.write_str("no pipeline output within the timeout"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Spawn(e) => Some(e),
            Error::Source { error, .. } => Some(error),
            Error::Transport {
                source: Some(e), ..
            } => Some(&**e),
            _ => None,
        }
    }
}

impl Error {
    /// A transport failure known only as text (reported by another process, or described here).
    pub(crate) fn transport(message: impl Into<String>) -> Error {
        Error::Transport {
            message: message.into(),
            source: None,
        }
    }

    /// A transport failure with the typed error behind it.
    pub(crate) fn transport_from(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::Transport {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}

impl From<Report> for Error {
    fn from(r: Report) -> Error {
        match r {
            Report::Step {
                step,
                stage,
                worker,
                emitter,
                record,
                input,
                message,
            } => Error::Step {
                step,
                stage,
                worker,
                emitter,
                record,
                input,
                message,
            },
            Report::Source {
                error:
                    SourceError::BadRecord {
                        file,
                        line,
                        field,
                        message,
                    },
                ..
            } => Error::BadRecord {
                file,
                line,
                field,
                message,
            },
            Report::Source { emitter, error } => Error::Source { emitter, error },
            Report::Other { role, message } => Error::transport(format!("{role}: {message}")),
            Report::TooLarge { role, message } => Error::TooLarge { role, message },
        }
    }
}

impl TransportError {
    /// The pipeline's error for this failure of the connection `context`: the typed error
    /// behind it kept as the source when there is one, the text otherwise.
    pub(crate) fn to_error(&self, context: String) -> Error {
        match self {
            TransportError::Channel(e) => Error::transport_from(context, SharedError(e.clone())),
            other => Error::transport(format!("{context}: {other}")),
        }
    }
}

/// A shared shm-ring error as an error of its own (the `source` of an
/// [`Error::Transport`](crate::Error::Transport)) (its `Display` and `source` are the
/// inner error's), so that one failure can be both kept and reported.
#[derive(Debug)]
pub(crate) struct SharedError(pub std::sync::Arc<shm_ring::Error>);

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}
