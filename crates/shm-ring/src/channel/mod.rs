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
pub(crate) mod errors;
mod into_error;
mod owned;
mod payload;
mod receiver;
mod sender;
mod values;

#[cfg(feature = "unstable-internals")]
use crate::error::Error;
#[cfg(feature = "unstable-internals")]
use crate::link::layout::CHANNEL_HEADER_AT;
use crate::link::layout::{
    ChannelHeader, DESC_RING_AT, DROPPED_MARK, KIND_CHANNEL, Layout, REC_BLOCK, REC_INLINE,
    REC_PAD, RECORD_HEADER, ShmRing, channel_header,
};
use crate::link::segment::Segment;
pub use crate::pool::large::LARGE_IN_FLIGHT;
use crate::pool::large::LARGE_OUT;
#[cfg(feature = "unstable-internals")]
use crate::ring::RingHeader;
#[cfg(feature = "unstable-internals")]
use crate::schema::{ValueType, wire};

pub use config::{ChannelConfig, LARGE_KEEP, MAX_LARGE_POOL, WaitConfig, machine_large_pool};
pub use errors::{
    CreateError, LoanError, OpenError, RecvError, RecvTimeoutError, SendError, SendTimeoutError,
    TryRecvError, TrySendError,
};
pub use owned::Message;
pub use payload::Payload;
pub use receiver::Receiver;
pub use sender::{Sender, SenderStats};
pub use values::ValueLoan;

#[cfg(feature = "unstable-internals")]
/// Where everything lives in a channel segment of a given configuration: for tests and tools
/// that poke at a live channel (corruption and hostile-peer tests). Not a stable API.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelLayout {
    /// Offset of the channel header.
    pub channel_header: usize,
    /// Offsets of the geometry fields (u32 slots, u32 slot_size, u32 blocks, u32 comp_slots,
    /// u64 block_size), in that order from here.
    pub geometry: usize,
    /// Offset of the consumer claim word (u64).
    pub consumer: usize,
    /// Offset of the descriptor ring's header; its `tail` (u32) is here.
    pub desc_ring: usize,
    /// Offset of the descriptor ring's `head` (u32).
    pub desc_head: usize,
    /// Offset of descriptor slot 0.
    pub desc_slots: usize,
    /// Bytes per descriptor slot.
    pub slot_size: usize,
    /// Descriptor slots.
    pub slots: usize,
    /// Offset of the completion ring's header (`tail` here).
    pub comp_ring: usize,
    /// Offset of the completion ring's `head` (u32).
    pub comp_head: usize,
    /// Offset of completion slot 0 (8 bytes per slot).
    pub comp_slots: usize,
    /// Offset of pool block 0.
    pub pool: usize,
    /// Bytes per pool block.
    pub block_size: usize,
    /// Offset of the large size class's area (at the end of the segment; 0 bytes long without
    /// a large pool). Extent `page` of it is block index `blocks + page`.
    pub large: usize,
    /// Bytes of the large size class's area.
    pub large_len: usize,
    /// Segment size.
    pub total: usize,
    /// Bytes of a record header in the descriptor ring (n_slots, kind, body_len, block: u32).
    pub record_header: usize,
    /// Bytes of a message body header, of a record header in the body, of a field header.
    pub body_header: usize,
    /// See `body_header`.
    pub body_record_header: usize,
    /// See `body_header`.
    pub field_header: usize,
    /// Offset of the schema region (0 bytes long for a channel without a schema).
    pub schema: usize,
    /// Bytes of the schema region.
    pub schema_len: usize,
    /// Offset of the channel header's `schema_len` word (u32).
    pub schema_len_word: usize,
    /// Offsets inside the schema region.
    pub schema_wire: SchemaWire,
    /// Offsets of the segment header's fields (from the segment's start) and the layout
    /// version.
    pub segment_wire: crate::link::segment::SegmentWire,
    /// Offsets of every word of the channel header (from the segment's start).
    pub channel_wire: ChannelWire,
    /// Offsets inside a record header of the descriptor ring, and its kinds.
    pub record_wire: RecordWire,
    /// Offsets inside a message body (body header, record header, field header).
    pub body_wire: crate::message::BodyWire,
}

#[cfg(feature = "unstable-internals")]
/// Offsets of the channel header's words, from the segment's start (each read once by its
/// user; see `ChannelHeader`).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelWire {
    /// u32: descriptor ring capacity.
    pub slots: usize,
    /// u32: bytes per descriptor slot.
    pub slot_size: usize,
    /// u32: pool blocks.
    pub blocks: usize,
    /// u32: completion ring capacity.
    pub comp_slots: usize,
    /// u64: bytes per pool block.
    pub block_size: usize,
    /// u32: set when the producer closes.
    pub producer_closed: usize,
    /// u32: set when the consumer closes.
    pub consumer_closed: usize,
    /// u64: the consumer claim (pid in the high 32 bits, start time's low 32 bits below).
    pub consumer: usize,
    /// u32: bytes of the schema region.
    pub schema_len: usize,
    /// u64: bytes of the large size class's area.
    pub large_pool: usize,
}

#[cfg(feature = "unstable-internals")]
/// A record header in the descriptor ring: offsets of its u32 words from the record's first
/// slot, and the values of `kind`.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordWire {
    /// Slots the record takes.
    pub n_slots: usize,
    /// `kind_pad`, `kind_inline` or `kind_block`.
    pub kind: usize,
    /// Bytes of the message body.
    pub body_len: usize,
    /// Pool block holding the body (`kind_block` only).
    pub block: usize,
    /// Kind of a record that only fills the ring's end.
    pub kind_pad: u32,
    /// Kind of a record whose body follows its header in the ring.
    pub kind_inline: u32,
    /// Kind of a record whose body lives in pool block `block`.
    pub kind_block: u32,
}

#[cfg(feature = "unstable-internals")]
/// A record header's u32 words, in the order the sender writes (`write_pod` in
/// `Sender::send_inner`) and the receiver reads (`read_pod` in `receiver/records.rs`) them as
/// one `[n_slots, kind, body_len, block]`: byte offsets from the record's first slot.
const RECORD_WIRE: RecordWire = RecordWire {
    n_slots: 0,
    kind: 4,
    body_len: 8,
    block: 12,
    kind_pad: REC_PAD,
    kind_inline: REC_INLINE,
    kind_block: REC_BLOCK,
};
#[cfg(feature = "unstable-internals")]
const _: () = assert!(RECORD_WIRE.block + 4 == RECORD_HEADER);

#[cfg(feature = "unstable-internals")]
/// Offsets of the schema region's encoding (see `schema/wire.rs`): the header's words from
/// the region's start, the value entry's fields from the entry's start.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct SchemaWire {
    pub magic: usize,
    pub kind: usize,
    pub len: usize,
    pub count: usize,
    pub entries: usize,
    pub value_size: usize,
    pub value_align: usize,
    pub value_dtype: usize,
    pub value_rank: usize,
    pub value_name_len: usize,
    pub value_dims: usize,
}

#[cfg(feature = "unstable-internals")]
/// The layout of a channel created with `cfg` (see [`ChannelLayout`]).
///
/// # Errors
/// [`Error::InvalidArgument`] for a configuration [`Sender::create`] refuses.
#[doc(hidden)]
pub fn channel_layout(cfg: &ChannelConfig) -> Result<ChannelLayout, Error> {
    layout_of(cfg, None)
}

#[cfg(feature = "unstable-internals")]
/// The layout of a channel created with [`Sender::<T>::create`]`(_, cfg)`.
///
/// # Errors
/// As [`channel_layout`].
#[doc(hidden)]
pub fn typed_channel_layout<T: bytemuck::Pod>(cfg: &ChannelConfig) -> Result<ChannelLayout, Error> {
    let cfg = payload::value_config::<T>(cfg)?;
    layout_of(&cfg, Some(&ValueType::of::<T>()))
}

#[cfg(feature = "unstable-internals")]
fn layout_of(cfg: &ChannelConfig, schema: Option<&ValueType>) -> Result<ChannelLayout, Error> {
    let schema_len = schema.map_or(0, |s| wire::encode(s).len() as u32);
    let l = Layout::new(
        cfg.slots,
        cfg.slot_size,
        cfg.blocks,
        cfg.block_size,
        schema_len,
        cfg.large_pool,
    )?;
    let ring_head = std::mem::offset_of!(RingHeader, head);
    Ok(ChannelLayout {
        channel_header: CHANNEL_HEADER_AT,
        geometry: CHANNEL_HEADER_AT + std::mem::offset_of!(ChannelHeader, slots),
        consumer: CHANNEL_HEADER_AT + std::mem::offset_of!(ChannelHeader, consumer),
        desc_ring: DESC_RING_AT,
        desc_head: DESC_RING_AT + ring_head,
        desc_slots: l.desc_slots,
        slot_size: l.desc.slot_size as usize,
        slots: l.desc.capacity as usize,
        comp_ring: l.comp_ring,
        comp_head: l.comp_ring + ring_head,
        comp_slots: l.comp_slots,
        pool: l.pool.off,
        block_size: l.pool.block_size,
        large: l.pool.large_off,
        large_len: l.pool.large_len,
        total: l.total,
        record_header: RECORD_HEADER,
        body_header: crate::message::BODY_HEADER,
        body_record_header: crate::message::RECORD_HEADER,
        field_header: crate::message::FIELD_HEADER,
        schema: l.schema,
        schema_len: l.schema_len,
        schema_len_word: CHANNEL_HEADER_AT + std::mem::offset_of!(ChannelHeader, schema_len),
        schema_wire: SchemaWire {
            magic: wire::MAGIC_AT,
            kind: wire::KIND_AT,
            len: wire::LEN_AT,
            count: wire::COUNT_AT,
            entries: wire::ENTRIES_AT,
            value_size: wire::VALUE_SIZE_AT,
            value_align: wire::VALUE_ALIGN_AT,
            value_dtype: wire::VALUE_DTYPE_AT,
            value_rank: wire::VALUE_RANK_AT,
            value_name_len: wire::VALUE_NAME_LEN_AT,
            value_dims: wire::VALUE_DIMS_AT,
        },
        segment_wire: crate::link::segment::SEGMENT_WIRE,
        channel_wire: ChannelWire {
            slots: CHANNEL_HEADER_AT + std::mem::offset_of!(ChannelHeader, slots),
            slot_size: CHANNEL_HEADER_AT + std::mem::offset_of!(ChannelHeader, slot_size),
            blocks: CHANNEL_HEADER_AT + std::mem::offset_of!(ChannelHeader, blocks),
            comp_slots: CHANNEL_HEADER_AT + std::mem::offset_of!(ChannelHeader, comp_slots),
            block_size: CHANNEL_HEADER_AT + std::mem::offset_of!(ChannelHeader, block_size),
            producer_closed: CHANNEL_HEADER_AT
                + std::mem::offset_of!(ChannelHeader, producer_closed),
            consumer_closed: CHANNEL_HEADER_AT
                + std::mem::offset_of!(ChannelHeader, consumer_closed),
            consumer: CHANNEL_HEADER_AT + std::mem::offset_of!(ChannelHeader, consumer),
            schema_len: CHANNEL_HEADER_AT + std::mem::offset_of!(ChannelHeader, schema_len),
            large_pool: CHANNEL_HEADER_AT + std::mem::offset_of!(ChannelHeader, large_pool),
        },
        record_wire: RECORD_WIRE,
        body_wire: crate::message::BODY_WIRE,
    })
}

/// Identity (device, inode) of a segment's file: the same channel seen from two handles.
fn file_ident(seg: &Segment) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    seg.file().metadata().map_or((0, 0), |m| (m.dev(), m.ino()))
}

/// Whether the channel `ident` (its [`file_ident`]) has a live [`Receiver`] in this process
/// (first adding it with `Some(true)`, removing it with `Some(false)`): a consumer claim naming
/// our own pid is believed only for these. The registry lives in `fork.rs` (a fork must not
/// copy its lock held).
fn own_receiver(ident: (u64, u64), add: Option<bool>) -> bool {
    crate::fork::own_receiver(ident, add)
}
