//! Every per-operation error converts into the umbrella [`Error`] without loss (for `?`).
//! Here, beside the per-operation errors, so that `error.rs` (the bottom layer) knows nothing
//! of channels.

use super::errors::{
    CreateError, LoanError, OpenError, RecvError, RecvTimeoutError, SendError, SendTimeoutError,
    TryRecvError, TrySendError,
};
use crate::error::Error;

impl From<CreateError> for Error {
    fn from(e: CreateError) -> Error {
        match e {
            CreateError::InvalidArgument(w) => Error::InvalidArgument(w),
            CreateError::TooLarge {
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
            CreateError::AlreadyExists(n) => Error::AlreadyExists(n),
            CreateError::NotFound(n) => Error::NotFound(n),
            CreateError::Untrusted(w) => Error::Untrusted(w),
            CreateError::NoSpace {
                name,
                needed,
                available,
            } => Error::NoSpace {
                name,
                needed,
                available,
            },
            CreateError::Os(e) => Error::Os(e),
        }
    }
}

impl From<OpenError> for Error {
    fn from(e: OpenError) -> Error {
        match e {
            OpenError::NotFound(n) => Error::NotFound(n),
            OpenError::Untrusted(w) => Error::Untrusted(w),
            OpenError::NotASegment(w) => Error::NotASegment(w),
            OpenError::VersionMismatch { found, expected } => {
                Error::VersionMismatch { found, expected }
            }
            OpenError::Busy(pid) => Error::Busy(pid),
            OpenError::ConsumerClosed(pid) => Error::ConsumerClosed(pid),
            OpenError::Schema(s) => Error::Schema(s),
            OpenError::Corrupt(w) => Error::Corrupt(w),
            OpenError::Timeout => Error::Timeout,
            OpenError::InvalidArgument(w) => Error::InvalidArgument(w),
            OpenError::Os(e) => Error::Os(e),
        }
    }
}

impl From<SendError> for Error {
    fn from(e: SendError) -> Error {
        match e {
            SendError::Disconnected => Error::Disconnected,
            SendError::PeerDied { pid, reclaimed } => Error::PeerDied { pid, reclaimed },
            SendError::NoConsumer { waited } => Error::NoConsumer { waited },
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
            SendError::InvalidArgument(w) => Error::InvalidArgument(w),
            SendError::Encode(e) => Error::Encode(e),
            SendError::NoSpace {
                name,
                needed,
                available,
            } => Error::NoSpace {
                name,
                needed,
                available,
            },
            SendError::Corrupt(w) => Error::Corrupt(w),
            SendError::Forked { owner, caller } => Error::Forked { owner, caller },
            SendError::Os(e) => Error::Os(e),
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

impl<T> From<SendTimeoutError<T>> for Error {
    fn from(e: SendTimeoutError<T>) -> Error {
        match e {
            SendTimeoutError::Timeout(_) => Error::Timeout,
            SendTimeoutError::Disconnected(_) => Error::Disconnected,
            SendTimeoutError::Failed(e, _) => e.into(),
        }
    }
}

impl From<LoanError> for Error {
    fn from(e: LoanError) -> Error {
        match e {
            LoanError::Timeout => Error::Timeout,
            LoanError::Send(e) => e.into(),
        }
    }
}

impl From<RecvError> for Error {
    fn from(e: RecvError) -> Error {
        match e {
            RecvError::Disconnected => Error::Disconnected,
            RecvError::PeerDied { pid } => Error::PeerDied { pid, reclaimed: 0 },
            RecvError::Corrupt(w) => Error::Corrupt(w),
            RecvError::Forked { owner, caller } => Error::Forked { owner, caller },
            RecvError::Os(e) => Error::Os(e),
        }
    }
}

impl From<TryRecvError> for Error {
    fn from(e: TryRecvError) -> Error {
        match e {
            TryRecvError::Empty => Error::Empty,
            TryRecvError::Failed(e) => e.into(),
        }
    }
}

impl From<RecvTimeoutError> for Error {
    fn from(e: RecvTimeoutError) -> Error {
        match e {
            RecvTimeoutError::Timeout => Error::Timeout,
            RecvTimeoutError::Failed(e) => e.into(),
        }
    }
}
