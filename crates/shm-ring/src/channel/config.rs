//! Configuration of a channel and of blocked calls.

pub use crate::link::wait::WaitConfig;
pub use crate::pool::large::MAX_LARGE_POOL;
use std::time::Duration;

use crate::rendezvous::Rendezvous;
use crate::transfer::Transfer;

/// How long a free extent of the large size class keeps its pages for reuse before they are
/// given back (see [`ChannelConfig::large_pool`]).
pub const LARGE_KEEP: Duration = Duration::from_millis(500);

/// A [`ChannelConfig::large_pool`] for this machine: twice its memory rounded up to a power of
/// two (so any item the machine can hold fits, with room for the next while one is held),
/// between 1 GiB and [`MAX_LARGE_POOL`]. Address space only: nothing is reserved until used.
pub fn machine_large_pool() -> usize {
    let total = crate::sys::mem_total().unwrap_or(16 << 30);
    (2 * total.next_power_of_two()).clamp(1 << 30, MAX_LARGE_POOL)
}

/// Configuration of a channel, fixed at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelConfig {
    /// Descriptor ring capacity in slots: a power of two, 2 to 2^20 (default 1024).
    pub slots: u32,
    /// Bytes per slot: a multiple of 64 from 64 to 65536 (default 64), with `slots x
    /// slot_size` at most 4 GiB (lengths travel as `u32`). Small messages travel inline in
    /// one or more slots.
    pub slot_size: u32,
    /// Number of pool blocks (default 16; 0 disables zero-copy).
    pub blocks: u32,
    /// Bytes per pool block (default 1 MiB), from 64 bytes to 4 GiB - 64 (lengths travel as
    /// `u32`); one zero-copy array, or one large message body, per block. Ignored when
    /// `blocks` is 0.
    pub block_size: usize,
    /// Address space of the pool's large size class, in bytes (default 0: none; a multiple of
    /// 4096, at most [`MAX_LARGE_POOL`], and only with `blocks` > 0). An array (or a message
    /// body) larger than `block_size` then goes zero-copy into an extent of its own size in
    /// this area instead of failing with [`Error::TooLarge`](crate::Error::TooLarge). The
    /// area costs address space only: an extent's pages are reserved (`fallocate`) when it is
    /// handed out, kept for reuse while large items keep coming, and given back (a punched
    /// hole) once free for [`LARGE_KEEP`] (or at [`Sender::trim_memory`](super::Sender::trim_memory)).
    /// [`machine_large_pool`] sizes it from the machine's memory, as pipelines do.
    pub large_pool: usize,
    /// Per-array transfer policy.
    pub transfer: Transfer,
    /// Waiting behaviour of blocked calls (per process; not stored in the segment).
    pub wait: WaitConfig,
    /// How long a dropped [`Sender`](super::Sender) of a *named* channel keeps serving its name
    /// while no consumer has attached yet (default 10 s; zero disables). The drop waits, up to
    /// this long, for a consumer to attach, so a producer that sends and exits before its
    /// consumer starts still delivers every message (the consumer opens with
    /// [`Receiver::open_timeout`](super::Receiver::open_timeout)). Once a consumer has attached
    /// the name is no longer needed (the consumer holds the memory, and reads everything sent
    /// before it sees the close): the drop does not wait. Anonymous channels never linger.
    pub linger: Duration,
    /// How long a sender that must wait (ring full or pool empty) waits for a consumer that
    /// has not attached yet, counted from creation (or from the death of the previous
    /// consumer), before its call fails with [`SendError::NoConsumer`](crate::SendError::NoConsumer)
    /// (default 30 s). This also covers a consumer that dies before it attaches: the producer
    /// cannot tell it from one that has not started. `Duration::MAX` waits without bound.
    pub attach_timeout: Duration,
    /// Where a *named* channel's socket lives and who may open it (see [`Rendezvous`]; the
    /// consumer must look in the same directory: [`Receiver::open_in`](super::Receiver::open_in)).
    /// Ignored by anonymous channels.
    pub rendezvous: Rendezvous,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            slots: 1024,
            slot_size: 64,
            blocks: 16,
            block_size: 1 << 20,
            large_pool: 0,
            transfer: Transfer::default(),
            wait: WaitConfig::default(),
            linger: Duration::from_secs(10),
            attach_timeout: Duration::from_secs(30),
            rendezvous: Rendezvous::default(),
        }
    }
}
