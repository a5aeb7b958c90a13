//! The Python exception classes of `shmpipe` (`shmpipe.ShmpipeError` and its subclasses).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
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
    "A pipeline step raised: attributes step, worker (None: in this process), stage, input, message."
);
create_exception!(
    shmpipe,
    WorkerDied,
    PeerDied,
    "A pipeline process (worker or emitter) died."
);

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
