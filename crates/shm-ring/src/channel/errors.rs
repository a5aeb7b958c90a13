//! One error type per channel operation, as crossbeam-channel has them: what creating,
//! opening, loaning, sending and receiving can fail with, and nothing else. The non-blocking
//! and timed sends hand the value back ([`TrySendError`], [`SendTimeoutError`]).
//!
//! Every conversion keeps everything: the internal error of the layers below is mapped variant
//! by variant (an operating-system failure stays [`std::io::Error`], never "corrupt"), and each
//! type converts into the crate-wide [`Error`] without loss, so `?` works in a function that
//! returns [`Error`]. A failure reads the same in every type (the wording is
//! `crate::error::text`'s), and says what to change.

use std::fmt;
use std::io;
use std::time::Duration;

use crate::error::{Error, text};
use crate::schema::SchemaError;

/// An internal error that the operation cannot produce, kept whole as the source of an
/// [`io::Error`] (so nothing is lost, and nothing reads as shared-memory corruption).
fn unexpected(e: Error) -> io::Error {
    match e {
        Error::Os(e) => e,
        e => io::Error::other(e),
    }
}

/// Why [`Sender::create`](crate::Sender::create) or [`Sender::anonymous`](crate::Sender::anonymous) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum CreateError {
    /// A bad name or configuration value; the message says which and what is allowed.
    InvalidArgument(String),
    /// The payload type or configuration asks for more than a channel can hold.
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
    /// A live sender serves a channel of that name already.
    AlreadyExists(String),
    /// The socket directory for names cannot be used.
    NotFound(String),
    /// Something on the way to the name we refuse to trust (a socket directory that is a
    /// symlink, of another user or open to others; an entry that is not a socket).
    Untrusted(String),
    /// Memory for the channel cannot be reserved.
    NoSpace {
        /// Segment name.
        name: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes free.
        available: u64,
    },
    /// An operating-system call failed.
    Os(io::Error),
}

/// Why [`Receiver::open`](crate::Receiver::open) (or `open_timeout`, `open_in`, `from_fd`)
/// failed. A refused opener leaves the channel untouched.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// No live sender serves the name (not created yet, closed, or dead).
    NotFound(String),
    /// A socket directory, entry or server we refuse to trust.
    Untrusted(String),
    /// Not a channel of ours (not a sealed memfd, a bad header, a malformed answer).
    NotASegment(String),
    /// The segment was made by an incompatible version of this crate.
    VersionMismatch {
        /// Layout version in the segment.
        found: u32,
        /// Layout version this crate understands.
        expected: u32,
    },
    /// Another live consumer is attached (pid 0: the claim names none).
    Busy(u32),
    /// The channel's consumer (this pid) closed: the stream ended.
    ConsumerClosed(u32),
    /// The channel carries another payload than the receiver's
    /// ([`SchemaError::Mismatch`]), or its schema region is unreadable.
    Schema(SchemaError),
    /// The segment's geometry is inconsistent.
    Corrupt(String),
    /// The name's server accepted but did not answer in time.
    Timeout,
    /// A bad name.
    InvalidArgument(String),
    /// An operating-system call failed.
    Os(io::Error),
}

/// Why a blocking send (or a loan, or a batch send) failed.
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
        waited: Duration,
    },
    /// The message does not fit the channel's configuration.
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
    /// The message holds a loan of another sender.
    InvalidArgument(String),
    /// The message breaks a limit of the encoding (a name, a string, dimensions, a name
    /// twice in one record).
    Encode(crate::EncodeError),
    /// A pool block used for the first time could not be reserved: memory is used up.
    NoSpace {
        /// Segment name.
        name: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes free.
        available: u64,
    },
    /// The consumer wrote an impossible ring index or block number.
    Corrupt(String),
    /// The sender belongs to another process (this one inherited it through `fork()`).
    Forked {
        /// The process the sender belongs to.
        owner: u32,
        /// This process.
        caller: u32,
    },
    /// An operating-system call failed (a futex wait, a liveness check).
    Os(io::Error),
}

/// Why a non-blocking send failed; the value comes back (as crossbeam's `TrySendError`).
#[derive(Debug)]
#[non_exhaustive]
pub enum TrySendError<T> {
    /// No room right now (ring slots or pool blocks): the consumer has not caught up.
    Full(T),
    /// The consumer closed its end.
    Disconnected(T),
    /// Another failure.
    Failed(SendError, T),
}

/// Why a send with a timeout failed; the value comes back.
#[derive(Debug)]
#[non_exhaustive]
pub enum SendTimeoutError<T> {
    /// Still no room when the time was up.
    Timeout(T),
    /// The consumer closed its end.
    Disconnected(T),
    /// Another failure.
    Failed(SendError, T),
}

/// Why a loan failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoanError {
    /// No free block (or slot) when the time was up (`loan_timeout`).
    Timeout,
    /// Any failure a send can have (the consumer closed or died, the array is too large, ...).
    Send(SendError),
}

/// Why a blocking receive failed.
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
    /// The producer wrote an impossible ring index or record, or a message that fails
    /// validation (it was skipped).
    Corrupt(String),
    /// The receiver belongs to another process (this one inherited it through `fork()`).
    Forked {
        /// The process the receiver belongs to.
        owner: u32,
        /// This process.
        caller: u32,
    },
    /// An operating-system call failed (a futex wait, a liveness check).
    Os(io::Error),
}

/// Why a non-blocking receive returned nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum TryRecvError {
    /// Nothing is there right now.
    Empty,
    /// The channel ended or failed (as a blocking receive would say).
    Failed(RecvError),
}

/// Why a receive with a timeout returned nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum RecvTimeoutError {
    /// Nothing arrived in time.
    Timeout,
    /// The channel ended or failed (as a blocking receive would say).
    Failed(RecvError),
}

impl CreateError {
    pub(crate) fn from_internal(e: Error) -> CreateError {
        match e {
            Error::InvalidArgument(w) => CreateError::InvalidArgument(w),
            Error::TooLarge {
                what,
                needed,
                limit,
                setting,
            } => CreateError::TooLarge {
                what,
                needed,
                limit,
                setting,
            },
            Error::AlreadyExists(n) => CreateError::AlreadyExists(n),
            Error::NotFound(n) => CreateError::NotFound(n),
            Error::Untrusted(w) => CreateError::Untrusted(w),
            Error::NoSpace {
                name,
                needed,
                available,
            } => CreateError::NoSpace {
                name,
                needed,
                available,
            },
            e => CreateError::Os(unexpected(e)),
        }
    }
}

impl OpenError {
    pub(crate) fn from_internal(e: Error) -> OpenError {
        match e {
            Error::NotFound(n) => OpenError::NotFound(n),
            Error::Untrusted(w) => OpenError::Untrusted(w),
            Error::NotASegment(w) => OpenError::NotASegment(w),
            Error::VersionMismatch { found, expected } => {
                OpenError::VersionMismatch { found, expected }
            }
            Error::Busy(pid) => OpenError::Busy(pid),
            Error::ConsumerClosed(pid) => OpenError::ConsumerClosed(pid),
            Error::Schema(s) => OpenError::Schema(s),
            Error::Corrupt(w) => OpenError::Corrupt(w),
            Error::Timeout => OpenError::Timeout,
            Error::InvalidArgument(w) => OpenError::InvalidArgument(w),
            e => OpenError::Os(unexpected(e)),
        }
    }
}

impl SendError {
    /// From the internal error of a send that had no deadline (a `Timeout` cannot come).
    pub(crate) fn from_internal(e: Error) -> SendError {
        match e {
            Error::Disconnected => SendError::Disconnected,
            Error::PeerDied { pid, reclaimed } => SendError::PeerDied { pid, reclaimed },
            Error::NoConsumer { waited } => SendError::NoConsumer { waited },
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
            Error::Encode(e) => SendError::Encode(e),
            Error::NoSpace {
                name,
                needed,
                available,
            } => SendError::NoSpace {
                name,
                needed,
                available,
            },
            Error::Corrupt(why) => SendError::Corrupt(why),
            Error::Forked { owner, caller } => SendError::Forked { owner, caller },
            e => SendError::Os(unexpected(e)),
        }
    }
}

impl<T> TrySendError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            TrySendError::Full(v) | TrySendError::Disconnected(v) | TrySendError::Failed(_, v) => v,
        }
    }

    /// From the internal error of a send, giving `v` back (`Timeout`: no room).
    pub(crate) fn from_internal(e: Error, v: T) -> TrySendError<T> {
        match e {
            Error::Timeout | Error::Full => TrySendError::Full(v),
            Error::Disconnected => TrySendError::Disconnected(v),
            e => TrySendError::Failed(SendError::from_internal(e), v),
        }
    }
}

impl<T> SendTimeoutError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            SendTimeoutError::Timeout(v)
            | SendTimeoutError::Disconnected(v)
            | SendTimeoutError::Failed(_, v) => v,
        }
    }

    /// From the internal error of a send with a deadline, giving `v` back.
    pub(crate) fn from_internal(e: Error, v: T) -> SendTimeoutError<T> {
        match e {
            Error::Timeout => SendTimeoutError::Timeout(v),
            Error::Disconnected => SendTimeoutError::Disconnected(v),
            e => SendTimeoutError::Failed(SendError::from_internal(e), v),
        }
    }
}

impl LoanError {
    pub(crate) fn from_internal(e: Error) -> LoanError {
        match e {
            Error::Timeout => LoanError::Timeout,
            e => LoanError::Send(SendError::from_internal(e)),
        }
    }
}

impl RecvError {
    /// From the internal error of a receive (a `Timeout` is the caller's to map first).
    pub(crate) fn from_internal(e: Error) -> RecvError {
        match e {
            Error::Disconnected => RecvError::Disconnected,
            Error::PeerDied { pid, .. } => RecvError::PeerDied { pid },
            Error::Corrupt(why) => RecvError::Corrupt(why),
            Error::Forked { owner, caller } => RecvError::Forked { owner, caller },
            e => RecvError::Os(unexpected(e)),
        }
    }
}

impl TryRecvError {
    pub(crate) fn from_internal(e: Error) -> TryRecvError {
        match e {
            Error::Timeout | Error::Empty => TryRecvError::Empty,
            e => TryRecvError::Failed(RecvError::from_internal(e)),
        }
    }
}

impl RecvTimeoutError {
    pub(crate) fn from_internal(e: Error) -> RecvTimeoutError {
        match e {
            Error::Timeout => RecvTimeoutError::Timeout,
            e => RecvTimeoutError::Failed(RecvError::from_internal(e)),
        }
    }
}

impl From<RecvError> for TryRecvError {
    fn from(e: RecvError) -> Self {
        TryRecvError::Failed(e)
    }
}

impl From<RecvError> for RecvTimeoutError {
    fn from(e: RecvError) -> Self {
        RecvTimeoutError::Failed(e)
    }
}

impl From<SendError> for LoanError {
    fn from(e: SendError) -> Self {
        LoanError::Send(e)
    }
}

// ---- Display: once per type, in the shared wording ----

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::InvalidArgument(w) => text::invalid_argument(f, w),
            CreateError::TooLarge {
                what,
                needed,
                limit,
                setting,
            } => text::too_large(f, what, *needed, *limit, setting),
            CreateError::AlreadyExists(n) => text::already_exists(f, n),
            CreateError::NotFound(n) => write!(
                f,
                "cannot serve the name '{n}': the socket directory cannot be used (set ${} \
                 or ChannelConfig::rendezvous to a directory of this user)",
                crate::sys::dir::DIR_ENV
            ),
            CreateError::Untrusted(w) => f.write_str(w),
            CreateError::NoSpace {
                name,
                needed,
                available,
            } => text::no_space(f, name, *needed, *available),
            CreateError::Os(e) => text::os(f, e),
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::NotFound(n) => text::not_found(f, n),
            OpenError::Untrusted(w) => f.write_str(w),
            OpenError::NotASegment(w) => text::not_a_segment(f, w),
            OpenError::VersionMismatch { found, expected } => {
                text::version_mismatch(f, *found, *expected)
            }
            OpenError::Busy(pid) => text::busy(f, *pid),
            OpenError::ConsumerClosed(pid) => text::consumer_closed(f, *pid),
            OpenError::Schema(e) => write!(f, "{e}"),
            OpenError::Corrupt(w) => text::corrupt_memory(f, w),
            OpenError::Timeout => f.write_str(
                "timed out: the channel's name server accepted the connection but did not \
                 answer within 5 s (is its producer stuck? retry, or restart the producer)",
            ),
            OpenError::InvalidArgument(w) => text::invalid_argument(f, w),
            OpenError::Os(e) => text::os(f, e),
        }
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Disconnected => text::consumer_gone(f),
            SendError::PeerDied { pid, reclaimed } => text::peer_died(f, *pid, *reclaimed),
            SendError::NoConsumer { waited } => text::no_consumer(f, *waited),
            SendError::TooLarge {
                what,
                needed,
                limit,
                setting,
            } => text::too_large(f, what, *needed, *limit, setting),
            SendError::InvalidArgument(w) => text::invalid_argument(f, w),
            SendError::Encode(e) => e.fmt(f),
            SendError::NoSpace {
                name,
                needed,
                available,
            } => text::no_space(f, name, *needed, *available),
            SendError::Corrupt(w) => text::corrupt_memory(f, w),
            SendError::Forked { owner, caller } => text::forked(f, *owner, *caller),
            SendError::Os(e) => text::os(f, e),
        }
    }
}

impl<T> fmt::Display for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => text::full(f),
            TrySendError::Disconnected(_) => text::consumer_gone(f),
            TrySendError::Failed(e, _) => e.fmt(f),
        }
    }
}

impl<T> fmt::Display for SendTimeoutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendTimeoutError::Timeout(_) => f.write_str(
                "timed out: no room in the channel in time (the consumer has not caught up: \
                 wait longer, or raise ChannelConfig::slots, and for messages with pool arrays \
                 ChannelConfig::blocks)",
            ),
            SendTimeoutError::Disconnected(_) => text::consumer_gone(f),
            SendTimeoutError::Failed(e, _) => e.fmt(f),
        }
    }
}

impl fmt::Display for LoanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoanError::Timeout => f.write_str(
                "timed out: no free pool block (a message's array) or ring slot (a typed \
                 value) in time (the consumer still holds them: drop received messages \
                 sooner, wait longer, or raise ChannelConfig::blocks or ChannelConfig::slots)",
            ),
            LoanError::Send(e) => e.fmt(f),
        }
    }
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecvError::Disconnected => text::disconnected(f),
            RecvError::PeerDied { pid } => text::peer_died(f, *pid, 0),
            RecvError::Corrupt(w) => text::corrupt_memory(f, w),
            RecvError::Forked { owner, caller } => text::forked(f, *owner, *caller),
            RecvError::Os(e) => text::os(f, e),
        }
    }
}

impl fmt::Display for TryRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryRecvError::Empty => text::empty(f),
            TryRecvError::Failed(e) => e.fmt(f),
        }
    }
}

impl fmt::Display for RecvTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecvTimeoutError::Timeout => text::timeout(f),
            RecvTimeoutError::Failed(e) => e.fmt(f),
        }
    }
}

// ---- std::error::Error: a wrapped error's text is already part of Display, so source()
// skips it and hands on its own source (as thiserror's `transparent`): a chain prints
// each message once. ----

impl std::error::Error for CreateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CreateError::Os(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Os(e) => std::error::Error::source(e),
            OpenError::Schema(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::Os(e) => std::error::Error::source(e),
            SendError::Encode(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}

impl<T: fmt::Debug> std::error::Error for TrySendError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TrySendError::Failed(e, _) => std::error::Error::source(e),
            _ => None,
        }
    }
}

impl<T: fmt::Debug> std::error::Error for SendTimeoutError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendTimeoutError::Failed(e, _) => std::error::Error::source(e),
            _ => None,
        }
    }
}

impl std::error::Error for LoanError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoanError::Send(e) => std::error::Error::source(e),
            LoanError::Timeout => None,
        }
    }
}

impl std::error::Error for RecvError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RecvError::Os(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}

impl std::error::Error for TryRecvError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TryRecvError::Failed(e) => std::error::Error::source(e),
            TryRecvError::Empty => None,
        }
    }
}

impl std::error::Error for RecvTimeoutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RecvTimeoutError::Failed(e) => std::error::Error::source(e),
            RecvTimeoutError::Timeout => None,
        }
    }
}
