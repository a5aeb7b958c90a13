//! Opening the consumer end: by name (now, or waiting for a producer that starts later) or
//! from a memfd; the segment's geometry and schema are read once, validated, and checked
//! against what the opener expects before the consumer claim.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Receiver, RxShared};
use crate::channel::{DESC_RING_AT, KIND_CHANNEL, Layout, ShmRing, WaitConfig, channel_header};
use crate::error::{Error, corrupt};
use crate::ring;
use crate::schema::{ChannelSchema, SchemaError, ValueType, wire};
use crate::segment::Segment;
use crate::sync::Ordering;
use crate::sys::{self, PeerProcess};

/// What an opener accepts: the check runs on the private copy of the schema, before the
/// consumer claim (a refused opener leaves the channel untouched).
#[derive(Debug)]
pub(in crate::channel) enum Expect<'a> {
    /// Self-describing messages, with or without a field schema.
    Messages,
    /// A typed channel of exactly this value type.
    Value(&'a ValueType),
}

impl Expect<'_> {
    fn check(&self, found: Option<&ChannelSchema>, slot_size: u32) -> Result<(), Error> {
        let ok = match (self, found) {
            (Expect::Messages, None | Some(ChannelSchema::Fields(_))) => true,
            (Expect::Value(v), Some(ChannelSchema::Value(w))) if v.matches(w) => {
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
                |s| s.to_string(),
            ),
            expected: match self {
                Expect::Messages => "self-describing messages (a Receiver)".to_string(),
                Expect::Value(v) => format!("a typed channel of {v}"),
            },
        }))
    }
}

impl Receiver {
    /// Opens the consumer end of the channel `name`, created by a [`Sender`](crate::Sender) in any process of
    /// the same user. One consumer at a time.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Untrusted`] (not a regular file of ours with mode 0600),
    /// [`Error::NotASegment`], [`Error::VersionMismatch`],
    /// [`Error::Corrupt`] (inconsistent geometry), [`Error::Busy`] (another consumer attached),
    /// [`Error::PeerDied`] (the creator is gone).
    pub fn open(name: &str) -> Result<Receiver, Error> {
        Self::open_as(name, None, Expect::Messages)
    }

    /// Opens `name` (waiting up to `timeout` for it to appear, if given) as `expect`.
    pub(in crate::channel) fn open_as(
        name: &str,
        timeout: Option<Duration>,
        expect: Expect<'_>,
    ) -> Result<Receiver, Error> {
        let Some(timeout) = timeout else {
            let seg = Segment::open(name, KIND_CHANNEL)?;
            return Self::attach(seg, name.to_string(), &expect);
        };
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(500);
        loop {
            match Segment::open(name, KIND_CHANNEL) {
                Ok(seg) => return Self::attach(seg, name.to_string(), &expect),
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::NotFound(name.to_string()));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Opens an anonymous channel's memfd as `expect`.
    pub(in crate::channel) fn from_fd_as(
        fd: std::os::fd::OwnedFd,
        expect: Expect<'_>,
    ) -> Result<Receiver, Error> {
        let seg = Segment::from_fd(fd, KIND_CHANNEL)?;
        Self::attach(seg, "(anonymous)".into(), &expect)
    }

    /// [`Receiver::open`], waiting up to `timeout` for a producer that has not created the
    /// channel yet (retrying every few milliseconds). With a producer that may start before
    /// or after this call, this is the one to use: a dropped [`Sender`](crate::Sender) keeps the name for
    /// [`ChannelConfig::linger`](crate::ChannelConfig::linger) until a consumer attached, so either start order delivers
    /// every message.
    ///
    /// # Errors
    /// [`Error::NotFound`] if no channel of that name appeared within `timeout`; otherwise as
    /// [`Receiver::open`] (not retried).
    ///
    /// # Examples
    /// ```
    /// use shm_ring::{ChannelConfig, Receiver, Sender};
    /// use std::time::Duration;
    /// let name = format!("doc-open-timeout-{}", std::process::id());
    /// let producer = std::thread::spawn({
    ///     let name = name.clone();
    ///     move || {
    ///         std::thread::sleep(Duration::from_millis(50)); // starts later
    ///         Sender::create(&name, &ChannelConfig::default())
    ///     }
    /// });
    /// let rx = Receiver::open_timeout(&name, Duration::from_secs(10))?;
    /// assert_eq!(rx.name(), name);
    /// # drop(producer.join().unwrap()?);
    /// # Ok::<(), shm_ring::Error>(())
    /// ```
    pub fn open_timeout(name: &str, timeout: Duration) -> Result<Receiver, Error> {
        Self::open_as(name, Some(timeout), Expect::Messages)
    }

    /// Opens the consumer end of an anonymous channel from its file (see [`Sender::anonymous`](crate::Sender::anonymous)).
    ///
    /// # Errors
    /// As [`Receiver::open`].
    pub fn from_file(file: std::fs::File) -> Result<Receiver, Error> {
        Self::from_fd(file.into())
    }

    /// Opens the consumer end of an anonymous channel from a descriptor of its memfd (see
    /// [`Sender::anonymous`](crate::Sender::anonymous), and [`Sender`](crate::Sender)'s `AsFd` to get the producer's descriptor).
    /// The memfd must be sealed against shrinking and growing (as [`Sender::anonymous`](crate::Sender::anonymous) leaves
    /// it) and have the size its header states: a peer holding the descriptor then cannot
    /// truncate the memory under us.
    ///
    /// # Errors
    /// [`Error::NotASegment`] (not a sealed memfd, wrong size, bad magic), as [`Receiver::open`].
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> Result<Receiver, Error> {
        Self::from_fd_as(fd, Expect::Messages)
    }

    fn attach(seg: Segment, name: String, expect: &Expect<'_>) -> Result<Receiver, Error> {
        let wait = WaitConfig::default();
        if seg.len() < DESC_RING_AT {
            return Err(corrupt(format!("channel segment of {} bytes", seg.len())));
        }
        let h = channel_header(&seg);
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
        let schema = if layout.schema_len == 0 {
            None
        } else {
            let mut copy = vec![0u8; layout.schema_len];
            // SAFETY: the layout, checked against the segment's size above, places
            // `schema_len` bytes at `layout.schema` inside the mapping; the destination is
            // private. The producer may write the region meanwhile: we only get other bytes,
            // which are validated as private data (read once, then never again).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    seg.as_ptr().add(layout.schema),
                    copy.as_mut_ptr(),
                    copy.len(),
                )
            };
            Some(Arc::new(wire::decode(&copy)?))
        };
        expect.check(schema.as_deref(), slot_size)?;
        let header = seg.header();
        let producer = PeerProcess::watch(header.creator_pid, header.creator_start);
        let me = sys::pid();
        let start = sys::process_start_time(me).ok_or_else(|| {
            Error::Os(std::io::Error::other(
                "cannot read our own start time from /proc/self/stat",
            ))
        })?;
        // Registered before the claim, so a producer in this process that sees the claim
        // also finds us.
        let ident = crate::channel::file_ident(&seg);
        crate::channel::own_receiver(ident, Some(true));
        // SYNC POINT (AcqRel CAS): pid and start time are claimed together in one word; a
        // rejected opener writes nothing.
        if let Err(other) = h.consumer.compare_exchange(
            0,
            crate::channel::consumer_word(me, start),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            crate::channel::own_receiver(ident, Some(false));
            return Err(Error::Busy(crate::channel::consumer_claim(other).0));
        }
        let seg = Arc::new(seg);
        let desc = ring::Consumer::attach(
            ShmRing {
                seg: seg.clone(),
                header: DESC_RING_AT,
                slots: layout.desc_slots,
            },
            layout.desc,
        );
        let comp = ring::Producer::attach(
            ShmRing {
                seg: seg.clone(),
                header: layout.comp_ring,
                slots: layout.comp_slots,
            },
            layout.comp,
        );
        Ok(Receiver {
            shared: Arc::new(RxShared {
                seg,
                comp: Mutex::new(comp),
                pool: layout.pool,
                broken: Mutex::new(None),
                is_broken: std::sync::atomic::AtomicBool::new(false),
            }),
            desc,
            producer,
            wait,
            name,
            scratch: Vec::new(),
            ident,
            schema,
            unreleased: 0,
        })
    }
}
