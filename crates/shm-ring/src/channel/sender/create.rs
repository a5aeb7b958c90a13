//! Creating the producer end: the name (bound first, served only once the channel is built),
//! the segment (always a sealed memfd), the channel header, the schema region (written once,
//! before the segment is published), the rings and the pool.

use std::sync::Arc;
use std::time::Instant;

use super::{Sender, SenderStats};
use crate::channel::errors::CreateError;
use crate::channel::payload::Payload;
use crate::channel::{ChannelConfig, DESC_RING_AT, KIND_CHANNEL, Layout, ShmRing};
use crate::error::Error;
use crate::link::layout::channel_header;
use crate::link::segment::Segment;
use crate::pool::PoolHome;
use crate::pool::alloc::BlockPool;
use crate::rendezvous::{NameServer, SocketDir};
use crate::schema::{ValueType, wire};
use crate::sync::Ordering;

impl<P: Payload> Sender<P> {
    /// Creates the channel `name` of payload `P` and returns its producer end: a sealed memfd
    /// like an anonymous channel's, served to openers by a socket `name` in the socket
    /// directory (see [`Rendezvous`](crate::Rendezvous); nothing is created in `/dev/shm`). A
    /// stale socket of a dead creator of that name is taken over. A channel of values
    /// (`P: Pod`) has slots sized for `P` (`size_of::<P>()` rounded up to 64 bytes, at most
    /// 64 KiB) and no pool (`cfg.blocks` is ignored).
    ///
    /// # Errors
    /// [`CreateError::InvalidArgument`] for a bad name or configuration;
    /// [`CreateError::AlreadyExists`] while a live sender serves the name;
    /// [`CreateError::Untrusted`] for a socket directory we do not trust, or something other
    /// than a socket at the name; [`CreateError::NoSpace`] when memory cannot hold the headers
    /// and rings; [`CreateError::TooLarge`] for a value type over 64 KiB; [`CreateError::Os`].
    pub fn create(name: &str, cfg: &ChannelConfig) -> Result<Sender<P>, CreateError> {
        Self::make(Some(name), cfg)
    }

    /// Creates an anonymous channel of payload `P` (a sealed memfd: hand the descriptor of
    /// [`AsFd::as_fd`](std::os::fd::AsFd::as_fd) to the consumer process and open it there with
    /// [`Receiver::from_fd`](crate::Receiver::from_fd)).
    ///
    /// # Errors
    /// As [`Sender::create`].
    pub fn anonymous(cfg: &ChannelConfig) -> Result<Sender<P>, CreateError> {
        Self::make(None, cfg)
    }

    fn make(name: Option<&str>, cfg: &ChannelConfig) -> Result<Sender<P>, CreateError> {
        let cfg = P::channel_config(cfg).map_err(CreateError::from_internal)?;
        Self::create_with(name, &cfg, P::value_type().as_ref()).map_err(CreateError::from_internal)
    }
}

impl<P> Sender<P> {
    /// Creates a channel (named, or anonymous for `None`) whose segment carries `schema`.
    fn create_with(
        name: Option<&str>,
        cfg: &ChannelConfig,
        schema: Option<&ValueType>,
    ) -> Result<Sender<P>, Error> {
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
        let mut seg =
            Segment::anonymous_reserving(name.unwrap_or("anon"), layout.total, layout.pool.off)?;
        if let Some(bytes) = &schema {
            // The segment is fresh and unpublished (no opener reads it before `publish` in
            // `init`); the layout placed `schema_len` bytes at `layout.schema` inside it.
            seg.init_bytes().write_from(layout.schema, bytes);
        }
        let mut tx = Self::init(seg, layout, cfg)?;
        if let Some(mut server) = server {
            server.serve(tx.seg.file().try_clone()?.into())?;
            tx.server = Some(server);
        }
        Ok(tx)
    }

    fn init(seg: Segment, layout: Layout, cfg: &ChannelConfig) -> Result<Sender<P>, Error> {
        // The segment is fresh (zero-filled) and unpublished: no opener reads past the segment
        // header before `publish` below, whose Release store publishes these Relaxed ones.
        let h = channel_header(&seg);
        h.slots.store(layout.desc.capacity, Ordering::Relaxed);
        h.slot_size.store(layout.desc.slot_size, Ordering::Relaxed);
        h.blocks.store(layout.pool.blocks, Ordering::Relaxed);
        h.comp_slots.store(layout.comp.capacity, Ordering::Relaxed);
        h.block_size
            .store(layout.pool.block_size as u64, Ordering::Relaxed);
        h.schema_len
            .store(layout.schema_len as u32, Ordering::Relaxed);
        h.large_pool
            .store(layout.pool.large_len as u64, Ordering::Relaxed);
        // The closed flags, the consumer claim and the reserved word start at 0 (zero-filled).
        // Ring headers are all-zero atomics: the zero-filled segment is already their initial state.
        let seg = Arc::new(seg);
        seg.publish(KIND_CHANNEL);
        let desc = ShmRing::producer(&seg, DESC_RING_AT, layout.desc_slots, layout.desc)?;
        let comp = ShmRing::consumer(&seg, layout.comp_ring, layout.comp_slots, layout.comp)?;
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
            _payload: std::marker::PhantomData,
        })
    }
}
