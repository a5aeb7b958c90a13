//! Opening the consumer end: by name (the descriptor comes from the name's server, now or
//! once a producer that starts later serves it) or from a memfd; the segment's geometry and
//! schema are read once, validated, and checked against what the opener expects before the
//! consumer claim.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Receiver, RxShared};
use crate::channel::errors::OpenError;
use crate::channel::payload::Payload;
use crate::channel::{DESC_RING_AT, KIND_CHANNEL, Layout, ShmRing, WaitConfig, channel_header};
use crate::error::{Error, corrupt};
use crate::link::claim::{self, Claimed};
use crate::link::segment::{Reached, Segment};
use crate::rendezvous::{self, Rendezvous, Served};
use crate::schema::{SchemaError, ValueType, wire};
use crate::sync::Ordering;
use crate::sys::{self, PeerProcess};

/// What an opener accepts: the check runs on the private copy of the schema, before the
/// consumer claim (a refused opener leaves the channel untouched).
#[derive(Debug)]
pub(in crate::channel) enum Expect<'a> {
    /// Self-describing messages (no schema region).
    Messages,
    /// A typed channel of exactly this value type.
    Value(&'a ValueType),
}

impl<'a> Expect<'a> {
    /// What a receiver of a payload whose value type is `v` (`None`: messages) accepts.
    pub(in crate::channel) fn of(v: Option<&'a ValueType>) -> Expect<'a> {
        v.map_or(Expect::Messages, Expect::Value)
    }

    fn check(&self, found: Option<&ValueType>, slot_size: u32) -> Result<(), Error> {
        let ok = match (self, found) {
            (Expect::Messages, None) => true,
            (Expect::Value(v), Some(w)) if v.matches(w) => {
                if (slot_size as usize) < v.size() {
                    return Err(corrupt(format!(
                        "typed channel of {v} in slots of {slot_size} bytes"
                    )));
                }
                true
            }
            _ => false,
        };
        if ok {
            return Ok(());
        }
        Err(Error::Schema(SchemaError::Mismatch {
            channel: found.map_or_else(
                || "self-describing messages (no schema)".to_string(),
                |v| format!("a typed channel of {v}"),
            ),
            expected: match self {
                Expect::Messages => "self-describing messages (a Receiver)".to_string(),
                Expect::Value(v) => format!("a typed channel of {v}"),
            },
        }))
    }
}

impl<P: Payload> Receiver<P> {
    /// Opens the consumer end of the channel `name`, created by a [`Sender<P>`](crate::Sender)
    /// of the same payload in any process of the same user (and looked for in the default
    /// socket directory: see [`Rendezvous`]). One consumer at a time; the claim of a consumer
    /// that died is taken over: this receiver reads on from the first message the dead one did
    /// not take, and the blocks the dead one held go back to the producer.
    ///
    /// # Errors
    /// [`OpenError::NotFound`] (no live sender serves the name; a stale socket of a dead one
    /// is removed); [`OpenError::Untrusted`] (a socket directory, entry or server we do not
    /// trust); [`OpenError::NotASegment`] (a malformed answer or descriptor),
    /// [`OpenError::VersionMismatch`], [`OpenError::Corrupt`] (inconsistent geometry),
    /// [`OpenError::Schema`] (a channel of another payload: open it with the type its sender
    /// was created with), [`OpenError::Busy`] (another consumer is attached and alive, or
    /// cannot be judged; pid 0: the claim names none), [`OpenError::ConsumerClosed`] (the
    /// consumer closed: the stream ended), [`OpenError::Timeout`] (the server accepted but did
    /// not answer within 5 s).
    pub fn open(name: &str) -> Result<Receiver<P>, OpenError> {
        Self::open_in(&Rendezvous::default(), name, None)
    }

    /// [`Receiver::open`], waiting up to `timeout` for a producer that has not created the
    /// channel yet (retrying every few milliseconds). With a producer that may start before
    /// or after this call, this is the one to use: a dropped [`Sender`](crate::Sender) keeps
    /// serving the name for [`ChannelConfig::linger`](crate::ChannelConfig::linger) until a
    /// consumer attached, so either start order delivers every message.
    ///
    /// # Errors
    /// [`OpenError::NotFound`] if no channel of that name appeared within `timeout`;
    /// otherwise as [`Receiver::open`] (not retried).
    ///
    /// # Examples
    /// ```
    /// use shm_ring::{ChannelConfig, Message, Receiver, Sender};
    /// use std::time::Duration;
    /// let name = format!("doc-open-timeout-{}", std::process::id());
    /// let producer = std::thread::spawn({
    ///     let name = name.clone();
    ///     move || {
    ///         std::thread::sleep(Duration::from_millis(50)); // starts later
    ///         Sender::<Message>::create(&name, &ChannelConfig::default())
    ///     }
    /// });
    /// let rx = Receiver::<Message>::open_timeout(&name, Duration::from_secs(10))?;
    /// assert_eq!(rx.name(), name);
    /// # drop(producer.join().unwrap()?);
    /// # Ok::<(), shm_ring::Error>(())
    /// ```
    pub fn open_timeout(name: &str, timeout: Duration) -> Result<Receiver<P>, OpenError> {
        Self::open_in(&Rendezvous::default(), name, Some(timeout))
    }

    /// [`Receiver::open`] (with `timeout`: [`Receiver::open_timeout`]) in the socket directory
    /// and with the peers `rdv` says (the producer's [`ChannelConfig::rendezvous`](crate::ChannelConfig::rendezvous)).
    ///
    /// # Errors
    /// As [`Receiver::open_timeout`].
    pub fn open_in(
        rdv: &Rendezvous,
        name: &str,
        timeout: Option<Duration>,
    ) -> Result<Receiver<P>, OpenError> {
        let v = P::value_type();
        Self::open_as(rdv, name, timeout, Expect::of(v.as_ref())).map_err(OpenError::from_internal)
    }

    /// Opens the consumer end of an anonymous channel from a descriptor of its memfd (see
    /// [`Sender::anonymous`](crate::Sender::anonymous), and [`Sender`](crate::Sender)'s `AsFd`
    /// to get the producer's descriptor). The memfd must be sealed against shrinking and
    /// growing (as [`Sender::anonymous`](crate::Sender::anonymous) leaves it) and have the size
    /// its header states: a peer holding the descriptor then cannot truncate the memory under
    /// us.
    ///
    /// # Errors
    /// [`OpenError::NotASegment`] (not a sealed memfd, wrong size, bad magic), as
    /// [`Receiver::open`].
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> Result<Receiver<P>, OpenError> {
        let v = P::value_type();
        Self::from_fd_as(fd, Expect::of(v.as_ref())).map_err(OpenError::from_internal)
    }
}

impl<P> Receiver<P> {
    /// Opens `name` (waiting up to `timeout` for a sender to serve it, if given) as `expect`.
    fn open_as(
        rdv: &Rendezvous,
        name: &str,
        timeout: Option<Duration>,
        expect: Expect<'_>,
    ) -> Result<Receiver<P>, Error> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut pause = Duration::from_micros(500);
        loop {
            match Self::open_once(rdv, name, &expect) {
                Err(Error::NotFound(_)) if deadline.is_some_and(|d| Instant::now() < d) => {}
                r => return r,
            }
            let now = Instant::now();
            let Some(deadline) = deadline.filter(|&d| now < d) else {
                return Err(Error::NotFound(name.to_string()));
            };
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// One attempt: the descriptor from the name's server, checked as a received descriptor,
    /// and served by the process its header names as creator.
    fn open_once(rdv: &Rendezvous, name: &str, expect: &Expect<'_>) -> Result<Receiver<P>, Error> {
        let got = rendezvous::fetch(rdv, name, Instant::now() + rendezvous::ANSWER_TIMEOUT)?;
        let how = Reached::Name {
            name,
            pid: got.server_pid,
        };
        let seg = Segment::from_fd_reached(got.fd, KIND_CHANNEL, how)?;
        let creator = seg.header().creator_pid;
        if creator != got.server_pid {
            return Err(Error::NotASegment(format!(
                "channel '{name}' is served by pid {}, but its header names pid {creator} as \
                 its creator: only a channel's own creator serves its name",
                got.server_pid
            )));
        }
        Self::attach(seg, name.to_string(), expect, Some(got.served))
    }

    /// Opens an anonymous channel's memfd as `expect`.
    fn from_fd_as(fd: std::os::fd::OwnedFd, expect: Expect<'_>) -> Result<Receiver<P>, Error> {
        let seg = Segment::from_fd(fd, KIND_CHANNEL)?;
        Self::attach(seg, "(anonymous)".into(), &expect, None)
    }

    fn attach(
        seg: Segment,
        name: String,
        expect: &Expect<'_>,
        served: Option<Served>,
    ) -> Result<Receiver<P>, Error> {
        let wait = WaitConfig::default();
        let (layout, slot_size) = read_layout(&seg)?;
        let schema = read_schema(&seg, &layout)?;
        expect.check(schema.as_ref(), slot_size)?;
        let header = seg.header();
        let producer = PeerProcess::watch(header.creator_pid, header.creator_start);
        let (ident, claimed) = claim_consumer(&seg)?;
        let seg = Arc::new(seg);
        // Reads on from the ring's head, as the consumer before us left it (see `consumer`).
        // The rings lie in the segment (`read_layout` checked the layout against its size), so
        // these checks do not fail once the claim is ours.
        let desc = ShmRing::consumer(&seg, DESC_RING_AT, layout.desc_slots, layout.desc)?;
        let comp = ShmRing::producer(&seg, layout.comp_ring, layout.comp_slots, layout.comp)?;
        let shared = Arc::new(RxShared {
            owner: crate::fork::Owner::current(),
            seg,
            comp: Mutex::new(comp),
            pool: layout.pool,
            broken: Mutex::new(None),
            is_broken: std::sync::atomic::AtomicBool::new(false),
        });
        if claimed == Claimed::TakenOver {
            // Every record before our read position was the dead consumer's: the blocks it
            // still held come back to the producer (see `claim.rs`).
            let from = desc.position().wrapping_sub(claim::TAKEOVER_SPAN);
            shared.dropped(from, claim::TAKEOVER_SPAN);
        }
        let desc_capacity = desc.shape().capacity;
        let owner_copy = shared.owner;
        Ok(Receiver {
            shared,
            desc,
            producer,
            wait,
            name,
            scratch: Vec::new(),
            ident,
            unreleased: 0,
            served,
            stale_removed: std::sync::atomic::AtomicBool::new(false),
            release_every: (desc_capacity / 4).max(1),
            owner_copy,
            _payload: std::marker::PhantomData,
        })
    }
}

/// Reads the channel's geometry from its header once (the producer may change it any time),
/// computes the layout from those copies and checks it against the segment: the layout and the
/// descriptor ring's slot size.
fn read_layout(seg: &Segment) -> Result<(Layout, u32), Error> {
    if seg.len() < DESC_RING_AT {
        return Err(corrupt(format!("channel segment of {} bytes", seg.len())));
    }
    let h = channel_header(seg);
    // Read each geometry field once (the producer may change them any time), then check
    // the whole layout, computed from these locals, against the segment.
    let slots = h.slots.load(Ordering::Relaxed);
    let slot_size = h.slot_size.load(Ordering::Relaxed);
    let blocks = h.blocks.load(Ordering::Relaxed);
    let comp_slots = h.comp_slots.load(Ordering::Relaxed);
    let block_size = h.block_size.load(Ordering::Relaxed);
    let schema_len = h.schema_len.load(Ordering::Relaxed);
    let large_pool = h.large_pool.load(Ordering::Relaxed);
    let geometry = || {
        format!(
            "channel geometry ({slots} slots x {slot_size} B, {blocks} blocks x {block_size} B, \
             {comp_slots} completion slots, {schema_len} B of schema, large pool of \
             {large_pool} B) does not match a segment of {} bytes",
            seg.len()
        )
    };
    let block_size = usize::try_from(block_size).map_err(|_| corrupt(geometry()))?;
    let large_pool = usize::try_from(large_pool).map_err(|_| corrupt(geometry()))?;
    let layout = Layout::new(slots, slot_size, blocks, block_size, schema_len, large_pool)
        .map_err(|e| corrupt(format!("{}: {e}", geometry())))?;
    if layout.total != seg.len()
        || layout.comp.capacity != comp_slots
        || layout.pool.block_size != block_size
    {
        return Err(corrupt(geometry()));
    }
    Ok((layout, slot_size))
}

/// A private copy of the channel's schema region (`None`: no schema), decoded.
fn read_schema(seg: &Segment, layout: &Layout) -> Result<Option<ValueType>, Error> {
    let schema = if layout.schema_len == 0 {
        None
    } else {
        // The layout, checked against the segment's size above, places the region inside
        // the mapping (the view checks it again). The producer may write the region
        // meanwhile: we only get other bytes, which are validated as private data (read
        // once, then never again).
        let region = seg
            .bytes()
            .sub(layout.schema, layout.schema_len)
            .ok_or_else(|| corrupt("the schema region lies outside the segment"))?;
        let mut copy = vec![0u8; layout.schema_len];
        region.copy_to(0, &mut copy);
        Some(wire::decode(&copy)?)
    };
    Ok(schema)
}

/// Registers this process's receiver of `seg` (before the claim, so a producer in this process
/// that sees the claim also finds us) and claims the consumer slot: the channel's identity and
/// how the slot was taken. Unregisters again if the claim fails.
fn claim_consumer(seg: &Segment) -> Result<((u64, u64), Claimed), Error> {
    let h = channel_header(seg);
    let me = sys::pid();
    let start = sys::process_start_time(me).ok_or_else(|| {
        Error::Os(std::io::Error::other(
            "cannot read our own start time from /proc/self/stat",
        ))
    })?;
    // Registered before the claim, so a producer in this process that sees the claim
    // also finds us.
    let ident = crate::channel::file_ident(seg);
    crate::channel::own_receiver(ident, Some(true));
    let claimed = match claim::claim(h, claim::consumer_word(me, start), ident) {
        Ok(c) => c,
        Err(e) => {
            crate::channel::own_receiver(ident, Some(false));
            return Err(e);
        }
    };
    Ok((ident, claimed))
}
