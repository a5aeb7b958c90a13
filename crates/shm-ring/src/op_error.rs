//! One error type per operation: what a send, a non-blocking send and a receive can fail
//! with, each convertible into the umbrella [`Error`] (so `?` works in functions returning
//! [`Error`]).

use std::fmt;

use crate::error::Error;

/// Why a send failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SendError {
    /// The consumer closed its end: nobody will read this.
    Disconnected,
    /// The consumer process died without closing (its slots and blocks were taken back; a new
    /// consumer may attach).
    PeerDied {
        /// Its pid.
        pid: u32,
        /// Pool blocks taken back.
        reclaimed: usize,
    },
    /// The send had to wait, but no consumer attached within
    /// [`ChannelConfig::attach_timeout`](crate::ChannelConfig::attach_timeout).
    NoConsumer {
        /// How long the channel has been without a consumer.
        waited: std::time::Duration,
    },
    /// A send with a timeout ran out of time.
    Timeout,
    /// The message does not fit the channel's configuration (see [`Error::TooLarge`]).
    TooLarge {
        /// What was asked for.
        what: &'static str,
        /// Bytes (or blocks) needed.
        needed: usize,
        /// Bytes (or blocks) available.
        limit: usize,
        /// The setting to raise.
        setting: &'static str,
    },
    /// The message breaks an encoding limit, or holds a loan of another sender.
    InvalidArgument(String),
    /// A pool block used for the first time could not be reserved: memory is used up (see
    /// [`Error::NoSpace`]).
    NoSpace {
        /// Segment name.
        name: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes free.
        available: u64,
    },
    /// An operating-system call failed.
    Os(std::io::Error),
    /// The consumer wrote an impossible ring index or block number (see [`Error::Corrupt`]).
    Corrupt(String),
    /// The sender belongs to another process (this one inherited it through `fork()`; see
    /// [`Error::Forked`]).
    Forked {
        /// The process the sender belongs to.
        owner: u32,
        /// This process.
        caller: u32,
    },
}

/// Why a non-blocking send failed; the value comes back (as crossbeam's `TrySendError`).
#[derive(Debug)]
#[non_exhaustive]
pub enum TrySendError<T> {
    /// The ring has no free slot right now: the consumer has not caught up.
    Full(T),
    /// The consumer closed its end.
    Disconnected(T),
    /// Another failure (see [`SendError`]).
    Failed(SendError, T),
}

impl<T> TrySendError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            TrySendError::Full(v) | TrySendError::Disconnected(v) | TrySendError::Failed(_, v) => v,
        }
    }

    /// Whether the ring was full.
    pub fn is_full(&self) -> bool {
        matches!(self, TrySendError::Full(_))
    }
}

/// Why a receive failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RecvError {
    /// The producer closed its end and everything it sent was received (end of stream).
    Disconnected,
    /// The producer process died without closing; everything it had sent was received.
    PeerDied {
        /// Its pid.
        pid: u32,
    },
    /// A receive with a timeout ran out of time.
    Timeout,
    /// The producer wrote an impossible ring index or record (see [`Error::Corrupt`]).
    Corrupt(String),
    /// The receiver belongs to another process (this one inherited it through `fork()`; see
    /// [`Error::Forked`]).
    Forked {
        /// The process the receiver belongs to.
        owner: u32,
        /// This process.
        caller: u32,
    },
}

impl SendError {
    /// From the crate's internal error (the variants a send can produce).
    pub(crate) fn from_internal(e: Error) -> SendError {
        match e {
            Error::Disconnected => SendError::Disconnected,
            Error::PeerDied { pid, reclaimed } => SendError::PeerDied { pid, reclaimed },
            Error::NoConsumer { waited } => SendError::NoConsumer { waited },
            Error::Timeout | Error::Full => SendError::Timeout,
            Error::TooLarge {
                what,
                needed,
                limit,
                setting,
            } => SendError::TooLarge {
                what,
                needed,
                limit,
                setting,
            },
            Error::InvalidArgument(why) => SendError::InvalidArgument(why),
            Error::NoSpace {
                name,
                needed,
                available,
            } => SendError::NoSpace {
                name,
                needed,
                available,
            },
            Error::Os(e) => SendError::Os(e),
            Error::Corrupt(why) => SendError::Corrupt(why),
            Error::Forked { owner, caller } => SendError::Forked { owner, caller },
            other => SendError::Corrupt(other.to_string()),
        }
    }
}

impl RecvError {
    /// From the crate's internal error (the variants a receive can produce).
    pub(crate) fn from_internal(e: Error) -> RecvError {
        match e {
            Error::Disconnected => RecvError::Disconnected,
            Error::PeerDied { pid, .. } => RecvError::PeerDied { pid },
            Error::Timeout => RecvError::Timeout,
            Error::Corrupt(why) => RecvError::Corrupt(why),
            Error::Forked { owner, caller } => RecvError::Forked { owner, caller },
            other => RecvError::Corrupt(other.to_string()),
        }
    }
}

impl From<SendError> for Error {
    fn from(e: SendError) -> Error {
        match e {
            SendError::TooLarge {
                what,
                needed,
                limit,
                setting,
            } => Error::TooLarge {
                what,
                needed,
                limit,
                setting,
            },
            SendError::InvalidArgument(why) => Error::InvalidArgument(why),
            SendError::NoSpace {
                name,
                needed,
                available,
            } => Error::NoSpace {
                name,
                needed,
                available,
            },
            SendError::Os(e) => Error::Os(e),
            SendError::Disconnected => Error::Disconnected,
            SendError::PeerDied { pid, reclaimed } => Error::PeerDied { pid, reclaimed },
            SendError::NoConsumer { waited } => Error::NoConsumer { waited },
            SendError::Timeout => Error::Timeout,
            SendError::Corrupt(why) => Error::Corrupt(why),
            SendError::Forked { owner, caller } => Error::Forked { owner, caller },
        }
    }
}

impl<T> From<TrySendError<T>> for Error {
    fn from(e: TrySendError<T>) -> Error {
        match e {
            TrySendError::Full(_) => Error::Full,
            TrySendError::Disconnected(_) => Error::Disconnected,
            TrySendError::Failed(e, _) => e.into(),
        }
    }
}

impl From<RecvError> for Error {
    fn from(e: RecvError) -> Error {
        match e {
            RecvError::Disconnected => Error::Disconnected,
            RecvError::PeerDied { pid } => Error::PeerDied { pid, reclaimed: 0 },
            RecvError::Timeout => Error::Timeout,
            RecvError::Corrupt(why) => Error::Corrupt(why),
            RecvError::Forked { owner, caller } => Error::Forked { owner, caller },
        }
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One wording for the whole crate: the umbrella error's.
        let e: Error = match self {
            SendError::TooLarge {
                what,
                needed,
                limit,
                setting,
            } => Error::TooLarge {
                what,
                needed: *needed,
                limit: *limit,
                setting,
            },
            SendError::InvalidArgument(why) => Error::InvalidArgument(why.clone()),
            SendError::NoSpace {
                name,
                needed,
                available,
            } => Error::NoSpace {
                name: name.clone(),
                needed: *needed,
                available: *available,
            },
            SendError::Os(e) => return write!(f, "os error: {e}"),
            SendError::Disconnected => Error::Disconnected,
            SendError::PeerDied { pid, reclaimed } => Error::PeerDied {
                pid: *pid,
                reclaimed: *reclaimed,
            },
            SendError::NoConsumer { waited } => Error::NoConsumer { waited: *waited },
            SendError::Timeout => Error::Timeout,
            SendError::Corrupt(why) => Error::Corrupt(why.clone()),
            SendError::Forked { owner, caller } => Error::Forked {
                owner: *owner,
                caller: *caller,
            },
        };
        e.fmt(f)
    }
}

impl<T> fmt::Display for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => Error::Full.fmt(f),
            TrySendError::Disconnected(_) => Error::Disconnected.fmt(f),
            TrySendError::Failed(e, _) => e.fmt(f),
        }
    }
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e: Error = match self {
            RecvError::Disconnected => Error::Disconnected,
            RecvError::PeerDied { pid } => Error::PeerDied {
                pid: *pid,
                reclaimed: 0,
            },
            RecvError::Timeout => Error::Timeout,
            RecvError::Corrupt(why) => Error::Corrupt(why.clone()),
            RecvError::Forked { owner, caller } => Error::Forked {
                owner: *owner,
                caller: *caller,
            },
        };
        e.fmt(f)
    }
}

impl std::error::Error for SendError {}
impl<T: fmt::Debug> std::error::Error for TrySendError<T> {}
impl std::error::Error for RecvError {}
