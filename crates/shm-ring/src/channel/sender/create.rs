//! Creating the producer end: the name (bound first, served only once the channel is built),
//! the segment (always a sealed memfd), the channel header, the schema region (written once,
//! before the segment is published), the rings and the pool.

use std::sync::Arc;
use std::time::Instant;

use super::{Sender, SenderStats};
use crate::channel::alloc::BlockPool;
use crate::channel::{
    CHANNEL_HEADER_AT, ChannelConfig, ChannelHeader, DESC_RING_AT, KIND_CHANNEL, Layout, ShmRing,
};
use crate::error::Error;
use crate::pool::PoolHome;
use crate::rendezvous::{NameServer, SocketDir};
use crate::ring;
use crate::schema::{ValueType, wire};
use crate::segment::Segment;
use crate::sync::{AtomicU32, AtomicU64};

impl Sender {
    /// Creates the channel `name` and returns its producer end: a sealed memfd like an
    /// anonymous channel's, served to openers by a socket `name` in the socket directory (see
    /// [`Rendezvous`](crate::Rendezvous); nothing is created in `/dev/shm`). A stale socket of a
    /// dead creator of that name is taken over.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name or configuration; [`Error::AlreadyExists`]
    /// while a live sender serves the name; [`Error::Untrusted`] for a socket directory we do
    /// not trust, or something other than a socket at the name; [`Error::NoSpace`] when memory
    /// cannot hold the headers and rings; [`Error::Os`].
    pub fn create(name: &str, cfg: &ChannelConfig) -> Result<Sender, Error> {
        Self::create_with(Some(name), cfg, None)
    }

    /// Creates a channel (named, or anonymous for `None`) whose segment carries `schema`.
    pub(in crate::channel) fn create_with(
        name: Option<&str>,
        cfg: &ChannelConfig,
        schema: Option<&ValueType>,
    ) -> Result<Sender, Error> {
        let schema = schema.map(wire::encode);
        let schema_len = schema.as_ref().map_or(0, |s| s.len());
        let schema_len = u32::try_from(schema_len).unwrap_or(u32::MAX);
        let layout = Layout::new(
            cfg.slots,
            cfg.slot_size,
            cfg.blocks,
            cfg.block_size,
            schema_len,
            cfg.large_pool,
        )?;
        // The name first: a taken name fails before anything is built, and connections queue
        // until the channel is ready.
        let server = match name {
            Some(name) => {
                let dir = SocketDir::open(&cfg.rendezvous, true)?
                    .ok_or_else(|| Error::NotFound(name.to_string()))?;
                Some(NameServer::bind(dir, name)?)
            }
            None => None,
        };
        // Headers, rings and schema now; each pool block when first loaned
        // (`BlockPool::try_alloc`).
        let seg =
            Segment::anonymous_reserving(name.unwrap_or("anon"), layout.total, layout.pool.off)?;
        if let Some(bytes) = &schema {
            // SAFETY: the segment is fresh and unpublished (no opener reads it before
            // `publish` in `init`); the layout placed `schema_len` bytes at `layout.schema`
            // inside it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    seg.as_ptr().add(layout.schema),
                    bytes.len(),
                )
            };
        }
        let mut tx = Self::init(seg, layout, cfg)?;
        if let Some(mut server) = server {
            server.serve(tx.seg.file().try_clone()?.into())?;
            tx.server = Some(server);
        }
        Ok(tx)
    }

    /// Creates an anonymous channel (memfd): hand [`Sender::segment`]'s file to a child process
    /// and open it there with [`Receiver::from_file`](crate::Receiver::from_file).
    ///
    /// # Errors
    /// As [`Sender::create`].
    pub fn anonymous(cfg: &ChannelConfig) -> Result<Sender, Error> {
        Self::create_with(None, cfg, None)
    }

    fn init(seg: Segment, layout: Layout, cfg: &ChannelConfig) -> Result<Sender, Error> {
        let header = ChannelHeader {
            slots: AtomicU32::new(layout.desc.capacity),
            slot_size: AtomicU32::new(layout.desc.slot_size),
            blocks: AtomicU32::new(layout.pool.blocks),
            comp_slots: AtomicU32::new(layout.comp.capacity),
            block_size: AtomicU64::new(layout.pool.block_size as u64),
            producer_closed: AtomicU32::new(0),
            consumer_closed: AtomicU32::new(0),
            consumer: AtomicU64::new(0),
            schema_len: AtomicU32::new(layout.schema_len as u32),
            _reserved: AtomicU32::new(0),
            large_pool: AtomicU64::new(layout.pool.large_len as u64),
        };
        // SAFETY: the segment is fresh (zero-filled), unpublished (no opener reads past the
        // segment header before `publish`), large enough (layout) and 128-aligned here.
        unsafe {
            seg.as_ptr()
                .add(CHANNEL_HEADER_AT)
                .cast::<ChannelHeader>()
                .write(header)
        };
        // Ring headers are all-zero atomics: the zero-filled segment is already their initial state.
        let seg = Arc::new(seg);
        seg.publish(KIND_CHANNEL);
        let desc = ring::Producer::attach(
            ShmRing {
                seg: seg.clone(),
                header: DESC_RING_AT,
                slots: layout.desc_slots,
            },
            layout.desc,
        );
        let comp = ring::Consumer::attach(
            ShmRing {
                seg: seg.clone(),
                header: layout.comp_ring,
                slots: layout.comp_slots,
            },
            layout.comp,
        );
        let owner = crate::fork::Owner::current();
        let home = Arc::new(PoolHome::new(owner, seg.clone(), layout.pool));
        let ident = crate::channel::file_ident(&seg);
        Ok(Sender {
            seg,
            desc,
            pool: BlockPool::new(home, comp),
            cfg: *cfg,
            ident,
            consumer: None,
            unattached_since: Some(Instant::now()),
            max_inline: layout.desc.bytes() / 4,
            owner,
            gate: owner.gate(),
            server: None,
            stats: SenderStats::default(),
        })
    }
}
