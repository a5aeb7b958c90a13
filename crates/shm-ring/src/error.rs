//! Error type of channel and segment operations.

use std::fmt;
use std::io;

/// The `setting` of [`Error::TooLarge`] for an array, body or loan over the block size on a
/// channel without a large pool: either setting lifts the limit.
pub(crate) const BLOCK_OR_LARGE_POOL: &str =
    "ChannelConfig::block_size or ChannelConfig::large_pool";

/// What went wrong in a segment or channel operation.
///
/// Errors that concern shared memory contents ([`Error::Corrupt`]) mean that a peer wrote
/// something that failed validation; the reader never trusts such data.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A blocking call ran out of time.
    Timeout,
    /// Nothing to receive right now (a non-blocking receive: [`TryRecvError::Empty`]).
    ///
    /// [`TryRecvError::Empty`]: crate::TryRecvError::Empty
    Empty,
    /// The ring is full or the pool has no free block (a non-blocking send).
    Full,
    /// The peer closed its end cleanly, and everything it sent has been received.
    Disconnected,
    /// The peer process exited without closing its end (crashed or was killed).
    PeerDied {
        /// The pid of the process that died.
        pid: u32,
        /// Pool blocks the producer took back from the dead consumer (0 on the consumer side).
        reclaimed: usize,
    },
    /// A value read from shared memory failed validation.
    Corrupt(String),
    /// A message, array or segment is larger than the configured limit.
    TooLarge {
        /// What was asked for.
        what: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes (or, for [`ChannelConfig::blocks`](crate::ChannelConfig::blocks), blocks)
        /// available under the configuration.
        limit: usize,
        /// The setting to raise, e.g. `"ChannelConfig::block_size"`.
        setting: &'static str,
    },
    /// Memory for the channel cannot be reserved (`fallocate` of its memfd failed: the
    /// machine's or the memory cgroup's memory is exhausted).
    NoSpace {
        /// Segment name.
        name: String,
        /// Bytes the segment needs.
        needed: u64,
        /// Bytes free on the file system when creation failed.
        available: u64,
    },
    /// A sender had to wait, but no consumer attached within
    /// [`ChannelConfig::attach_timeout`](crate::ChannelConfig::attach_timeout).
    NoConsumer {
        /// How long the channel has been without a consumer.
        waited: std::time::Duration,
    },
    /// A live sender serves a channel of that name already.
    AlreadyExists(String),
    /// No live sender serves a channel of that name (not created yet, closed, or dead).
    NotFound(String),
    /// The segment was made by an incompatible version of this crate.
    VersionMismatch {
        /// Layout version in the segment.
        found: u32,
        /// Layout version this crate understands.
        expected: u32,
    },
    /// A descriptor (passed, or served for a name) that is not a channel of ours: not a
    /// sealed memfd, a bad header, or a malformed answer of a name's server. The message says
    /// which, in terms of how the channel was reached.
    NotASegment(String),
    /// Something on the way to a named channel that we refuse to trust: a socket directory
    /// that is a symlink, not a directory, of another user or open to others; an entry that is
    /// not a socket; a server of another user. The message names path, owner and mode.
    Untrusted(String),
    /// Another live consumer is attached to this channel.
    Busy(u32),
    /// The channel's consumer (this pid) closed: that ended the stream, and a channel takes
    /// no other consumer after it.
    ConsumerClosed(u32),
    /// A name or configuration value is invalid.
    InvalidArgument(String),
    /// The channel's schema is unreadable or not the one asked for.
    Schema(crate::schema::SchemaError),
    /// A field of a message that could not be read (absent, another dtype, invalid).
    Field(crate::schema::FieldError),
    /// A message body that could not be decoded.
    Decode(crate::DecodeError),
    /// A message that cannot be encoded.
    Encode(crate::EncodeError),
    /// [`calibrate`](crate::calibrate) failed.
    Calibrate(crate::CalibrateError),
    /// A handle was used in a process other than the one that made it (a child that inherited
    /// it through `fork()`): handles are not fork-safe (see the crate docs, "Fork").
    Forked {
        /// The process the handle belongs to.
        owner: u32,
        /// The process that tried to use it.
        caller: u32,
    },
    /// An operating-system call failed.
    Os(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use text::*;
        match self {
            Error::Timeout => timeout(f),
            Error::Empty => empty(f),
            Error::Full => full(f),
            Error::Disconnected => disconnected(f),
            Error::PeerDied { pid, reclaimed } => peer_died(f, *pid, *reclaimed),
            Error::Corrupt(why) => corrupt_memory(f, why),
            Error::TooLarge {
                what,
                needed,
                limit,
                setting,
            } => too_large(f, what, *needed, *limit, setting),
            Error::NoSpace {
                name,
                needed,
                available,
            } => no_space(f, name, *needed, *available),
            Error::NoConsumer { waited } => no_consumer(f, *waited),
            Error::AlreadyExists(n) => already_exists(f, n),
            Error::NotFound(n) => not_found(f, n),
            Error::VersionMismatch { found, expected } => version_mismatch(f, *found, *expected),
            Error::NotASegment(why) => not_a_segment(f, why),
            Error::Busy(pid) => busy(f, *pid),
            Error::ConsumerClosed(pid) => consumer_closed(f, *pid),
            Error::Untrusted(why) => f.write_str(why),
            Error::InvalidArgument(why) => invalid_argument(f, why),
            Error::Schema(e) => write!(f, "{e}"),
            Error::Field(e) => write!(f, "{e}"),
            Error::Decode(e) => write!(f, "{e}"),
            Error::Encode(e) => write!(f, "{e}"),
            Error::Calibrate(e) => write!(f, "{e}"),
            Error::Forked { owner, caller } => forked(f, *owner, *caller),
            Error::Os(e) => os(f, e),
        }
    }
}

/// The wording of each kind of failure, shared by [`Error`] and the per-operation errors
/// (`crate::channel::errors`), so that one failure reads the same whichever type carries it.
pub(crate) mod text {
    use std::fmt::{self, Formatter};
    use std::time::Duration;

    use super::BLOCK_OR_LARGE_POOL;

    pub(crate) fn timeout(f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(
            "timed out: the peer did not answer in time (check that the other process is \
             running and attached, or pass a longer timeout)",
        )
    }

    pub(crate) fn full(f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(
            "channel full: the consumer has not caught up (wait with `send` or \
             `send_timeout`, or raise ChannelConfig::slots, and for messages with pool \
             arrays ChannelConfig::blocks)",
        )
    }

    pub(crate) fn empty(f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str("nothing to receive right now (wait with `recv` or `recv_timeout`)")
    }

    pub(crate) fn consumer_gone(f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(
            "the consumer closed its end of the channel: nothing more will be read (stop \
             sending; what was sent and not yet read is dropped with the channel)",
        )
    }

    pub(crate) fn disconnected(f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(
            "the peer closed its end of the channel and everything it sent was received \
             (a normal end of stream)",
        )
    }

    pub(crate) fn peer_died(f: &mut Formatter<'_>, pid: u32, reclaimed: usize) -> fmt::Result {
        write!(f, "peer process {pid} died without closing the channel")?;
        if reclaimed > 0 {
            write!(f, " ({reclaimed} pool blocks reclaimed)")?;
        }
        f.write_str(
            "; find out why it died (its stderr, exit status) and restart it: a new \
             consumer may attach to the same channel",
        )
    }

    pub(crate) fn corrupt_memory(f: &mut Formatter<'_>, why: &str) -> fmt::Result {
        write!(
            f,
            "corrupt shared memory: {why} (another process wrote inconsistent data into the \
             channel: a bug, a version mix-up or a hostile process; the data was not used)"
        )
    }

    pub(crate) fn too_large(
        f: &mut Formatter<'_>,
        what: &str,
        needed: usize,
        limit: usize,
        setting: &str,
    ) -> fmt::Result {
        if setting == "ChannelConfig::blocks" {
            write!(
                f,
                "{what} needs {needed} pool blocks but the channel has {limit}: set \
                 {setting} to at least {needed}"
            )
        } else if setting.contains("slots") {
            write!(
                f,
                "{what} needs {needed} bytes but the descriptor ring takes at most \
                 {limit}: raise {setting} (slots x slot_size must be at least 4x the \
                 record), or give the channel pool blocks (ChannelConfig::blocks)"
            )
        } else if setting == BLOCK_OR_LARGE_POOL {
            write!(
                f,
                "{what} needs {needed} bytes but the limit is {limit} bytes: set \
                 ChannelConfig::block_size to at least {needed}, or give the channel a \
                 large pool for items of any size (ChannelConfig::large_pool, e.g. \
                 shm_ring::machine_large_pool()), when creating the Sender"
            )
        } else if let Some(advice) = setting.strip_prefix("nothing: ") {
            write!(
                f,
                "{what} needs {needed} bytes but the limit is {limit} bytes: {advice}"
            )
        } else {
            write!(
                f,
                "{what} needs {needed} bytes but the limit is {limit} bytes: set \
                 {setting} to at least {needed} (when creating the Sender)"
            )
        }
    }

    pub(crate) fn no_space(
        f: &mut Formatter<'_>,
        name: &str,
        needed: u64,
        available: u64,
    ) -> fmt::Result {
        write!(
            f,
            "channel '{name}' needs {needed} bytes ({:.1} MiB) of shared memory, but only \
             {available} bytes ({:.1} MiB) could be reserved (the machine's or the memory \
             cgroup's memory is used up); free memory, raise the container's memory limit, \
             or configure a smaller pool (ChannelConfig::blocks, ChannelConfig::block_size)",
            needed as f64 / 1048576.0,
            available as f64 / 1048576.0
        )
    }

    pub(crate) fn no_consumer(f: &mut Formatter<'_>, waited: Duration) -> fmt::Result {
        write!(
            f,
            "no consumer attached to the channel in {waited:.1?} \
             (ChannelConfig::attach_timeout): start the consumer (Receiver::open or \
             Receiver::open_timeout), check that it did not die before attaching, or raise \
             ChannelConfig::attach_timeout"
        )
    }

    pub(crate) fn already_exists(f: &mut Formatter<'_>, n: &str) -> fmt::Result {
        write!(
            f,
            "a channel named '{n}' already exists: a live Sender serves this name in the \
             socket directory; pick another name or close that Sender (the name of a \
             creator that died is taken over by the next create)"
        )
    }

    pub(crate) fn not_found(f: &mut Formatter<'_>, n: &str) -> fmt::Result {
        write!(
            f,
            "no channel named '{n}': either its producer has not created it yet, or the \
             producer closed it and its ChannelConfig::linger ended, or it died; start the \
             producer first, or open with Receiver::open_timeout to wait for it (both \
             processes must use the same socket directory: ${} or \
             ChannelConfig::rendezvous)",
            crate::sys::dir::DIR_ENV
        )
    }

    pub(crate) fn version_mismatch(
        f: &mut Formatter<'_>,
        found: u32,
        expected: u32,
    ) -> fmt::Result {
        write!(
            f,
            "segment layout version {found}, but this build understands version {expected}: \
             build both processes against the same shm-ring version"
        )
    }

    pub(crate) fn not_a_segment(f: &mut Formatter<'_>, why: &str) -> fmt::Result {
        write!(f, "not a shm-ring channel: {why}")
    }

    pub(crate) fn busy(f: &mut Formatter<'_>, pid: u32) -> fmt::Result {
        write!(
            f,
            "another consumer (pid {pid}) is attached: a channel has one Receiver at a \
             time; close that one first or create one channel per consumer"
        )
    }

    pub(crate) fn consumer_closed(f: &mut Formatter<'_>, pid: u32) -> fmt::Result {
        write!(
            f,
            "the consumer of this channel (pid {pid}) closed: that ended the stream, and \
             a channel takes no other Receiver after it; the producer must create a new \
             channel"
        )
    }

    pub(crate) fn invalid_argument(f: &mut Formatter<'_>, why: &str) -> fmt::Result {
        write!(f, "invalid argument: {why}")
    }

    pub(crate) fn forked(f: &mut Formatter<'_>, owner: u32, caller: u32) -> fmt::Result {
        write!(
            f,
            "this channel handle belongs to process {owner}; process {caller} inherited it \
             through fork() and may not send, receive or loan with it (handles are not \
             fork-safe: open or create the channel in the child, or pass it a descriptor)"
        )
    }

    pub(crate) fn os(f: &mut Formatter<'_>, e: &std::io::Error) -> fmt::Result {
        write!(f, "os error: {e}")
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Os(e) => std::error::Error::source(e),
            Error::Schema(e) => std::error::Error::source(e),
            Error::Field(e) => std::error::Error::source(e),
            Error::Decode(e) => std::error::Error::source(e),
            Error::Encode(e) => std::error::Error::source(e),
            Error::Calibrate(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Os(e)
    }
}

impl From<crate::schema::SchemaError> for Error {
    fn from(e: crate::schema::SchemaError) -> Self {
        Error::Schema(e)
    }
}

impl From<crate::schema::FieldError> for Error {
    fn from(e: crate::schema::FieldError) -> Self {
        Error::Field(e)
    }
}

impl From<crate::DecodeError> for Error {
    fn from(e: crate::DecodeError) -> Self {
        Error::Decode(e)
    }
}

impl From<crate::EncodeError> for Error {
    fn from(e: crate::EncodeError) -> Self {
        Error::Encode(e)
    }
}

impl From<crate::CalibrateError> for Error {
    fn from(e: crate::CalibrateError) -> Self {
        Error::Calibrate(e)
    }
}

impl From<rustix::io::Errno> for Error {
    fn from(e: rustix::io::Errno) -> Self {
        Error::Os(e.into())
    }
}

impl From<crate::ring::RingError> for Error {
    fn from(e: crate::ring::RingError) -> Self {
        Error::Corrupt(e.to_string())
    }
}

pub(crate) fn corrupt(why: impl Into<String>) -> Error {
    Error::Corrupt(why.into())
}
