//! A connection between one producer process and one consumer process: a segment holding a
//! descriptor ring (producer -> consumer), a completion ring (consumer -> producer) and the
//! producer's payload pool.
//!
//! ```text
//! 0      SegmentHeader (64 B)
//! 128    ChannelHeader: geometry, closed flags, consumer pid
//! 256    RingHeader of the descriptor ring (512 B)
//! 768    descriptor slots: slots x slot_size
//! ...    RingHeader of the completion ring, then its slots (8 B each: a block index)
//! ...    pool: blocks x block_size, 4096-aligned
//! ```
//!
//! A message is one *record* in the descriptor ring: 1..n consecutive slots that never wrap
//! (a pad record fills the end of the ring when needed). The record header says whether the
//! message body follows inline or lives in a pool block. Arrays placed zero-copy live in pool
//! blocks of their own; the consumer returns every block index through the completion ring
//! when the message is dropped.

mod config;
mod owned;
mod receiver;
mod sender;

use std::sync::Arc;
use std::time::Instant;

use crate::error::Error;
use crate::pool::PoolGeom;
use crate::ring::{RingHeader, RingShape, Storage};
use crate::segment::Segment;
use crate::sync::{AtomicU32, AtomicU64};
use crate::sys;

pub use config::{ChannelConfig, WaitConfig};
pub use owned::Message;
pub use receiver::Receiver;
pub use sender::{Sender, SenderStats};

/// `kind` of a channel segment.
pub(crate) const KIND_CHANNEL: u32 = 1;
const CHANNEL_HEADER_AT: usize = 128;
const DESC_RING_AT: usize = 256;
const RECORD_HEADER: usize = 16;
const REC_PAD: u32 = 1;
const REC_INLINE: u32 = 2;
const REC_BLOCK: u32 = 3;

/// The shared part of a channel, after the segment header.
#[repr(C)]
#[derive(Debug)]
struct ChannelHeader {
    slots: u32,
    slot_size: u32,
    blocks: u32,
    comp_slots: u32,
    block_size: u64,
    /// Set (SeqCst) by the producer when it closes; the consumer drains, then disconnects.
    producer_closed: AtomicU32,
    /// Set (SeqCst) by the consumer when it closes.
    consumer_closed: AtomicU32,
    /// Pid of the attached consumer, 0 if none. Claimed with a CAS by `Receiver::open`.
    consumer_pid: AtomicU32,
    _pad: u32,
    /// Start time of the attached consumer (written before `consumer_pid` is claimed... see open).
    consumer_start: AtomicU64,
}

/// Offsets of every region, computed from the geometry alone (so both sides agree, and the
/// consumer can check the segment against it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    desc: RingShape,
    comp: RingShape,
    desc_slots: usize,
    comp_ring: usize,
    comp_slots: usize,
    pool: PoolGeom,
    total: usize,
}

const fn align_up(x: usize, a: usize) -> usize {
    (x + a - 1) & !(a - 1)
}

impl Layout {
    fn new(slots: u32, slot_size: u32, blocks: u32, block_size: usize) -> Result<Layout, Error> {
        let bad = |why: String| Err(Error::InvalidArgument(why));
        if !slots.is_power_of_two() || !(2..=1 << 20).contains(&slots) {
            return bad(format!(
                "slots = {slots}: use a power of two from 2 to 2^20"
            ));
        }
        if !slot_size.is_multiple_of(64) || !(64..=65536).contains(&slot_size) {
            return bad(format!(
                "slot_size = {slot_size}: use a multiple of 64 from 64 to 65536"
            ));
        }
        if blocks > 1 << 20 {
            return bad(format!("blocks = {blocks}: at most 2^20"));
        }
        if blocks > 0 && !(64..=1 << 40).contains(&block_size) {
            return bad(format!("block_size = {block_size}: from 64 bytes to 1 TiB"));
        }
        let block_size = align_up(block_size.max(64), 64);
        let desc = RingShape {
            capacity: slots,
            slot_size,
        };
        let comp = RingShape {
            capacity: blocks.max(1).next_power_of_two(),
            slot_size: 8,
        };
        let desc_slots = DESC_RING_AT + std::mem::size_of::<RingHeader>();
        let comp_ring = align_up(desc_slots + desc.bytes(), 128);
        let comp_slots = comp_ring + std::mem::size_of::<RingHeader>();
        let pool_off = align_up(comp_slots + comp.bytes(), 4096);
        let total = (blocks as usize)
            .checked_mul(block_size)
            .and_then(|p| p.checked_add(pool_off))
            .ok_or_else(|| Error::InvalidArgument("pool size overflows".into()))?;
        Ok(Layout {
            desc,
            comp,
            desc_slots,
            comp_ring,
            comp_slots,
            pool: PoolGeom {
                off: pool_off,
                block_size,
                blocks,
            },
            total,
        })
    }
}

/// A ring inside a channel segment.
#[derive(Debug)]
struct ShmRing {
    seg: Arc<Segment>,
    header: usize,
    slots: usize,
}

// SAFETY: `Layout::new` places the header (512 B, 128-aligned) and the slots (8-aligned,
// capacity * slot_size bytes) inside the segment, whose size was checked against the layout;
// the Arc keeps the mapping alive as long as this storage exists.
unsafe impl Storage for ShmRing {
    fn header(&self) -> &RingHeader {
        // SAFETY: see the impl: in bounds, aligned, and RingHeader is atomics only (any bits valid).
        unsafe { &*self.seg.as_ptr().add(self.header).cast::<RingHeader>() }
    }
    fn slots(&self) -> *mut u8 {
        self.seg.as_ptr().wrapping_add(self.slots)
    }
}

fn channel_header(seg: &Segment) -> &ChannelHeader {
    // SAFETY: every channel segment is larger than CHANNEL_HEADER_AT + size_of::<ChannelHeader>()
    // (checked at open), the offset is 128-aligned, and the header is plain integers and atomics.
    unsafe { &*seg.as_ptr().add(CHANNEL_HEADER_AT).cast::<ChannelHeader>() }
}

/// Waits for `attempt` to return `Some`, spinning first, then sleeping on a futex word in
/// slices of at most `wait.liveness_check`, checking `alive` after every slice. With
/// `recheck_on_death` (the consumer side), a dead peer's last messages and clean close are
/// still delivered: `attempt` runs once more after `alive` fails.
fn block_on<T>(
    recheck_on_death: bool,
    wait: &WaitConfig,
    deadline: Option<Instant>,
    mut attempt: impl FnMut() -> Result<Option<T>, Error>,
    mut sleep_on: impl FnMut() -> (*const AtomicU32, u32),
    mut end_sleep: impl FnMut(),
    mut alive: impl FnMut() -> Result<(), Error>,
) -> Result<T, Error> {
    if let Some(v) = attempt()? {
        return Ok(v);
    }
    if deadline.is_some_and(|d| Instant::now() >= d) {
        // A non-blocking call (or an expired deadline): no spinning, no sleeping.
        return Err(Error::Timeout);
    }
    if !wait.spin.is_zero() {
        let mut spin_until = Instant::now() + wait.spin;
        if let Some(d) = deadline {
            spin_until = spin_until.min(d);
        }
        let mut i = 0u32;
        loop {
            for _ in 0..64 {
                crate::sync::spin_hint();
            }
            if let Some(v) = attempt()? {
                return Ok(v);
            }
            i += 1;
            if i.is_multiple_of(16) && Instant::now() > spin_until {
                break;
            }
        }
    }
    loop {
        let now = Instant::now();
        let mut slice = wait.liveness_check;
        if let Some(d) = deadline {
            if now >= d {
                return Err(Error::Timeout);
            }
            slice = slice.min(d - now);
        }
        let (word, expected) = sleep_on();
        let got = attempt();
        if !matches!(got, Ok(None)) {
            end_sleep();
            return got.map(|v| v.expect("checked"));
        }
        // SAFETY: `word` points at a futex word inside a ring header of a segment that the
        // caller keeps mapped for the whole call.
        sys::futex_wait(unsafe { &*word }, expected, slice);
        end_sleep();
        if let Some(v) = attempt()? {
            return Ok(v);
        }
        if let Err(dead) = alive() {
            if !recheck_on_death {
                return Err(dead);
            }
            // The peer may have finished its work (last commit, clean close) and exited
            // between our attempt and the liveness check: look once more before blaming it.
            return match attempt()? {
                Some(v) => Ok(v),
                None => Err(dead),
            };
        }
    }
}
