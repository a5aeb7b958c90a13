//! shm-ring errors as Python exceptions, in the Python user's words: the parameters they can
//! change (`timeout=`, `blocks=`, `block_size=`, `slots=`) and the calls they can make, never
//! the Rust API; the numbers travel as attributes too (`e.needed`, `e.limit`, `e.parameter`,
//! `e.pid`).

use pyo3::exceptions::{PyFileExistsError, PyFileNotFoundError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;

use crate::exceptions::{CorruptMessage, Disconnected, PeerDied, ShmpipeError};

/// The Python parameter of a shm-ring setting named in an error (`ChannelConfig::blocks`).
fn parameter(setting: &str) -> &'static str {
    match setting {
        s if s.contains("block_size") => "block_size",
        s if s.contains("blocks") => "blocks",
        s if s.contains("slot") => "slots",
        _ => "",
    }
}

/// Rewrites Rust API names left in a text (from errors this module does not word itself):
/// `ChannelConfig::x` becomes `x=`, `Receiver::open_timeout` becomes `Receiver.open(timeout=)`,
/// any other `A::b` becomes `A.b`.
pub(super) fn pythonize(text: &str) -> String {
    let mut s = text
        .replace("Receiver::open_timeout", "Receiver.open(name, timeout=...)")
        .replace("send_timeout", "send(..., timeout=...)")
        .replace(
            "ChannelConfig::rendezvous",
            &format!("${}", shm_ring::Rendezvous::DIR_ENV),
        );
    while let Some(i) = s.find("ChannelConfig::") {
        let rest = &s[i + "ChannelConfig::".len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let name = rest[..end].to_string();
        s.replace_range(i..i + "ChannelConfig::".len() + end, &format!("{name}="));
    }
    s.replace("::", ".")
}

/// A shm-ring error as the Python exception a user of `shmpipe.Sender`/`Receiver` gets.
pub fn ring_err(py: Python<'_>, e: impl Into<shm_ring::Error>) -> PyErr {
    let e: shm_ring::Error = e.into();
    use shm_ring::Error as E;
    match e {
        E::Timeout => PyTimeoutError::new_err(
            "timed out: the peer did not answer in time (check that the other process is \
             running and attached, or pass a longer timeout=)",
        ),
        E::Full => PyTimeoutError::new_err(
            "channel full: the consumer has not caught up (pass timeout= to wait, or create \
             the Sender with more slots= or blocks=)",
        ),
        E::PeerDied { pid, reclaimed } => {
            let err = PeerDied::new_err(pythonize(&E::PeerDied { pid, reclaimed }.to_string()));
            let _ = err.value(py).setattr("pid", pid);
            err
        }
        E::TooLarge {
            what,
            needed,
            limit,
            setting,
        } => too_large(py, what, needed, limit, parameter(setting)),
        E::NoConsumer { waited } => ShmpipeError::new_err(format!(
            "no consumer attached to the channel in {waited:.1?}: start the consumer \
             (Receiver.open(name, timeout=...)), and check that it did not die before attaching"
        )),
        E::AlreadyExists(n) => PyFileExistsError::new_err(format!(
            "a channel named {n:?} already exists: a live Sender (in this or another process) \
             serves that name; pick another name, or close that Sender first"
        )),
        E::NotFound(n) => PyFileNotFoundError::new_err(format!(
            "no channel named {n:?}: its producer has not created it yet, or closed it, or \
             died; start the producer first, or wait for it with Receiver.open(name, \
             timeout=seconds) (both processes must use the same socket directory: ${})",
            shm_ring::Rendezvous::DIR_ENV
        )),
        E::Busy(pid) => {
            let err = ShmpipeError::new_err(format!(
                "another Receiver (pid {pid}) is attached to this channel: a channel has one \
                 Receiver at a time; close() that one first, or create one channel per consumer"
            ));
            let _ = err.value(py).setattr("pid", pid);
            err
        }
        E::ConsumerClosed(pid) => {
            let err = ShmpipeError::new_err(format!(
                "the Receiver of this channel (pid {pid}) was closed: that ended the stream, and \
                 a channel takes no other Receiver after it; have the producer create a new \
                 channel (Sender.create) for a new consumer"
            ));
            let _ = err.value(py).setattr("pid", pid);
            err
        }
        E::VersionMismatch { found, expected } => CorruptMessage::new_err(format!(
            "channel layout version {found}, but this shmpipe understands version {expected}: \
             use the same shmpipe version in both processes"
        )),
        e @ (E::Corrupt(_)
        | E::NotASegment(_)
        | E::Decode(_)
        | E::Field(
            shm_ring::FieldError::Corrupt(_)
            | shm_ring::FieldError::Misaligned { .. }
            | shm_ring::FieldError::NotABool { .. },
        )) => CorruptMessage::new_err(pythonize(&e.to_string())),
        e @ E::Disconnected => Disconnected::new_err(e.to_string()),
        e @ (E::InvalidArgument(_) | E::Encode(_)) => {
            PyValueError::new_err(pythonize(&e.to_string()))
        }
        E::Os(io) => {
            let err = ShmpipeError::new_err(format!("os error: {io}"));
            if let Some(n) = io.raw_os_error() {
                let _ = err.value(py).setattr("errno", n);
            }
            err
        }
        e => ShmpipeError::new_err(pythonize(&e.to_string())),
    }
}

/// The `TimeoutError` of `Receiver.recv`/`recv_many` when no message came within `timeout`
/// seconds while the sender stayed alive (a dead or closed sender raises its own error).
pub fn no_message(timeout: Option<f64>) -> PyErr {
    let t = timeout.map_or_else(|| "None".to_string(), |t| t.to_string());
    PyTimeoutError::new_err(format!(
        "no message came within timeout={t} s (the sender is alive but sent nothing in that \
         time): pass a longer timeout= (None waits as long as it takes), or use try_recv()"
    ))
}

/// `what` needs more than the channel's `parameter` allows: a `ValueError` saying which
/// argument of `Sender.create`/`Sender.anonymous`/`shmpipe.pipe` to raise.
fn too_large(py: Python<'_>, what: &str, needed: usize, limit: usize, parameter: &str) -> PyErr {
    let msg = match parameter {
        "blocks" => format!(
            "{what} needs {needed} pool blocks but the channel has {limit}: create the Sender \
             with blocks={needed} or more"
        ),
        "slots" => format!(
            "{what} needs {needed} bytes but the descriptor ring takes at most {limit}: create \
             the Sender with more slots= (the ring must hold 4x the message), or with pool \
             blocks (blocks=) for large messages"
        ),
        _ => format!(
            "{what} needs {needed} bytes but a pool block holds {limit}: create the Sender with \
             block_size={needed} or more (each array of a message travels in one block), or \
             send it through a Pipeline, which carries items of any size"
        ),
    };
    let err = PyValueError::new_err(msg);
    let v = err.value(py);
    let _ = v.setattr("needed", needed);
    let _ = v.setattr("limit", limit);
    let _ = v.setattr("parameter", parameter);
    err
}

/// Why `Receiver.from_fd(fd)` refused a descriptor (an anonymous descriptor has no name to
/// pick again).
pub fn from_fd_err(py: Python<'_>, fd: i32, e: impl Into<shm_ring::Error>) -> PyErr {
    let e: shm_ring::Error = e.into();
    use shm_ring::Error as E;
    match e {
        E::NotASegment(why) | E::Untrusted(why) | E::InvalidArgument(why) => {
            ShmpipeError::new_err(format!(
                "descriptor {fd} is not a shmpipe channel ({}): pass the descriptor of \
                 Sender.anonymous() (its fileno(), or a handle from shmpipe.pipe())",
                pythonize(&why)
            ))
        }
        e => ring_err(py, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_names_become_python_ones() {
        assert_eq!(
            pythonize("set ChannelConfig::block_size to 5, or ChannelConfig::slots (or x)"),
            "set block_size= to 5, or slots= (or x)"
        );
        assert_eq!(
            pythonize("open with Receiver::open_timeout; Sender::create"),
            "open with Receiver.open(name, timeout=...); Sender.create"
        );
        assert_eq!(parameter("ChannelConfig::slots (or slot_size)"), "slots");
        assert_eq!(parameter("ChannelConfig::blocks"), "blocks");
        assert_eq!(parameter("ChannelConfig::block_size"), "block_size");
    }
}
