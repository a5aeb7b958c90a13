//! The consumer end of a channel.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::{
    ChannelHeader, DESC_RING_AT, KIND_CHANNEL, Layout, Message, ShmRing, WaitConfig, channel_header,
};
use crate::error::{Error, corrupt};
use crate::message::{self, DataRef, MessageView};
use crate::ring::{self, Storage};
use crate::schema::{ChannelSchema, SchemaError, ValueType, wire};
use crate::segment::Segment;
use crate::sync::Ordering;
use crate::sys::{self, PeerProcess};

/// The consumer end of a channel, opened by name. `Send`, not `Sync`.
#[derive(Debug)]
pub struct Receiver {
    shared: Arc<RxShared>,
    pub(super) desc: ring::Consumer<ShmRing>,
    producer: PeerProcess,
    pub(super) wait: WaitConfig,
    name: String,
    /// Private copy of the message being read in place (reused).
    scratch: Vec<u64>,
    /// The segment's (device, inode), registered in `OWN_RECEIVERS` while we live.
    ident: (u64, u64),
    /// The channel's schema (a private copy, validated at open).
    schema: Option<Arc<ChannelSchema>>,
    /// Slots read (skipped) but not yet handed back to the producer; see `release_read`.
    unreleased: u32,
    /// Hand read slots back once this many wait: a quarter of the ring.
    release_every: u32,
}

mod records;
mod returns;

use records::{Rec, n_of};
pub(super) use returns::RxShared;

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
    /// Opens the consumer end of the channel `name`, created by a [`Sender`](super::Sender) in any process of
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
    /// or after this call, this is the one to use: a dropped [`Sender`](super::Sender) keeps the name for
    /// [`ChannelConfig::linger`](super::ChannelConfig::linger) until a consumer attached, so either start order delivers
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

    /// Opens the consumer end of an anonymous channel from its file (see [`Sender::anonymous`](super::Sender::anonymous)).
    ///
    /// # Errors
    /// As [`Receiver::open`].
    pub fn from_file(file: std::fs::File) -> Result<Receiver, Error> {
        Self::from_fd(file.into())
    }

    /// Opens the consumer end of an anonymous channel from a descriptor of its memfd (see
    /// [`Sender::anonymous`](super::Sender::anonymous), and [`Sender`](super::Sender)'s `AsFd` to get the producer's descriptor).
    /// The memfd must be sealed against shrinking and growing (as [`Sender::anonymous`](super::Sender::anonymous) leaves
    /// it) and have the size its header states: a peer holding the descriptor then cannot
    /// truncate the memory under us.
    ///
    /// # Errors
    /// [`Error::NotASegment`] (not a sealed memfd, wrong size, bad magic), as [`Receiver::open`].
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> Result<Receiver, Error> {
        Self::from_fd_as(fd, Expect::Messages)
    }

    /// Sets how blocked calls wait.
    pub fn set_wait(&mut self, wait: WaitConfig) {
        self.wait = wait;
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
        let geometry = || {
            format!(
                "channel geometry ({slots} slots x {slot_size} B, {blocks} blocks x {block_size} B, \
                 {comp_slots} completion slots, {schema_len} B of schema) does not match a \
                 segment of {} bytes",
                seg.len()
            )
        };
        let block_size = usize::try_from(block_size).map_err(|_| corrupt(geometry()))?;
        let layout = Layout::new(slots, slot_size, blocks, block_size, schema_len)
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
        let ident = super::file_ident(&seg);
        super::own_receiver(ident, Some(true));
        // SYNC POINT (AcqRel CAS): pid and start time are claimed together in one word; a
        // rejected opener writes nothing.
        if let Err(other) = h.consumer.compare_exchange(
            0,
            super::consumer_word(me, start),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            super::own_receiver(ident, Some(false));
            return Err(Error::Busy(super::consumer_claim(other).0));
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
            release_every: (layout.desc.capacity / 4).max(1),
        })
    }

    /// The channel's field schema, if its sender gave it one ([`Sender::with_schema`](super::Sender::with_schema)).
    pub fn schema(&self) -> Option<&crate::schema::Schema> {
        match self.schema.as_deref() {
            Some(ChannelSchema::Fields(s)) => Some(s),
            _ => None,
        }
    }

    /// The channel name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Pid of the producer process.
    pub fn producer_pid(&self) -> u32 {
        self.producer.pid()
    }

    /// Number of descriptor slots waiting to be read (queue occupancy).
    pub fn queued_slots(&mut self) -> Result<u32, Error> {
        let cap = self.desc.shape().capacity;
        Ok(self.desc.available(cap)?)
    }

    pub(super) fn header(&self) -> &ChannelHeader {
        channel_header(&self.shared.seg)
    }

    /// `Err(PeerDied)` once the producer process is gone.
    pub(super) fn producer_alive(&self) -> Result<(), Error> {
        if self.producer.is_dead() {
            Err(Error::PeerDied {
                pid: self.producer.pid(),
                reclaimed: 0,
            })
        } else {
            Ok(())
        }
    }

    fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Message, Error> {
        self.shared.check()?;
        let rec = self.next_rec(deadline)?;
        let pos = self.desc.position();
        let n_slots = match rec {
            Rec::Inline { n_slots, .. } => n_slots,
            _ => 1,
        };
        // Copy the body out of shared memory: validation then works on private bytes that no
        // other process can change, and the slots (or body block) go back at once.
        let (src, body_len) = self.body_src(&rec);
        let mut body = vec![0u64; body_len.div_ceil(8)];
        // SAFETY: `body_src` bounds (validated in `peek`) lie inside the mapping, which
        // `self.shared.seg` keeps alive; the destination is ours and large enough. The source
        // may change under the copy (a hostile producer): we only get different bytes, which
        // are then validated as private data.
        unsafe { std::ptr::copy_nonoverlapping(src, body.as_mut_ptr().cast::<u8>(), body_len) };
        self.finish(&rec);
        let mut blocks: SmallVec<[u32; 4]> = SmallVec::new();
        let parsed = {
            let bytes = &bytemuck::cast_slice::<u64, u8>(&body)[..body_len];
            MessageView::parse(bytes, self.shared.pool()).and_then(|v| {
                // An owned message is validated whole, once, on private bytes.
                v.validate_all(|b| {
                    if !blocks.contains(&b) {
                        blocks.push(b)
                    }
                })
                .map(|_| (v.tag(), v.len()))
            })
        };
        match parsed {
            Ok(_) => Ok(Message {
                body,
                body_len,
                blocks,
                shared: self.shared.clone(),
            }),
            Err(e) => {
                self.shared.release(&blocks);
                // Blocks named after the failing field go back too.
                self.shared.dropped(pos, n_slots);
                Err(e)
            }
        }
    }

    /// Receives the next message, waiting as long as it takes.
    ///
    /// # Errors
    /// [`Error::Disconnected`] once the producer closed and everything was received;
    /// [`Error::PeerDied`] if the producer process died (seen within
    /// [`WaitConfig::liveness_check`]); [`Error::Corrupt`] if the message fails validation
    /// (it is skipped).
    pub fn recv(&mut self) -> Result<Message, Error> {
        self.recv_deadline(None)
    }

    /// [`Receiver::recv`] with a timeout ([`Error::Timeout`]).
    ///
    /// # Errors
    /// As [`Receiver::recv`], and [`Error::Timeout`].
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Message, Error> {
        self.recv_deadline(Some(Instant::now() + timeout))
    }

    /// Receives a message if one is there.
    ///
    /// # Errors
    /// As [`Receiver::recv`].
    pub fn try_recv(&mut self) -> Result<Option<Message>, Error> {
        match self.recv_deadline(Some(Instant::now())) {
            Ok(m) => Ok(Some(m)),
            Err(Error::Timeout) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Receives the next message and lets `f` read it in place, without copying; the slots
    /// and blocks are released when `f` returns.
    ///
    /// # Errors
    /// As [`Receiver::recv_timeout`] (with `None`: no timeout).
    pub fn recv_with<R>(
        &mut self,
        timeout: Option<Duration>,
        f: impl FnOnce(MessageView<'_>) -> R,
    ) -> Result<R, Error> {
        let mut f = Some(f);
        let mut out = None;
        self.recv_batch(1, timeout, |m| {
            if let Some(f) = f.take() {
                out = Some(f(m));
            }
        })?;
        out.ok_or(Error::Timeout)
    }

    /// Waits for at least one message, then lets `f` read up to `max` messages in place, all
    /// released together at the end (one index store). Returns how many were read.
    ///
    /// Names, metadata and shapes are read from a private copy of each message; array data is
    /// read where it lies in shared memory (zero-copy), so a hostile producer can change array
    /// values during `f`, never their bounds.
    ///
    /// # Errors
    /// As [`Receiver::recv_timeout`]; a corrupt message ends the batch with [`Error::Corrupt`]
    /// after the messages before it were handed to `f`.
    pub fn recv_batch(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        mut f: impl FnMut(MessageView<'_>),
    ) -> Result<usize, Error> {
        self.shared.check()?;
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut rec = self.next_rec(deadline)?;
        let mut done = 0usize;
        let mut blocks: SmallVec<[u32; 16]> = SmallVec::new();
        let mut dropped = None;
        let result = loop {
            let (n, block) = match rec {
                Rec::Inline { n_slots, .. } => (n_slots, None),
                Rec::Block { block, .. } => (1, Some(block)),
                Rec::Pad(n) => (n, None),
            };
            if !matches!(rec, Rec::Pad(_)) {
                let (src, len) = self.body_src(&rec);
                if self.scratch.len() < len.div_ceil(8) {
                    self.scratch.resize(len.div_ceil(8), 0);
                }
                let body = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.scratch)[..len];
                // SAFETY: `body_src` bounds (validated in `peek`) lie inside the mapping, kept
                // alive by `self.shared`; `body` is private and `len` bytes long. A producer
                // writing the source meanwhile only changes the bytes we copy, which are then
                // validated as private data.
                unsafe { message::copy_for_parse(src, len, body) };
                let body: &[u8] = body;
                // SAFETY: the `len` body bytes at `src` stay mapped while `self` is borrowed.
                let data = unsafe { DataRef::shared(src) };
                let view = MessageView::parse_with(body, data, self.shared.pool());
                let mut ok = view.and_then(|v| v.for_each_block(|b| blocks.push(b)).map(|_| v));
                if let Ok(v) = ok.as_mut() {
                    f(*v);
                    done += 1;
                }
                if let Some(b) = block {
                    blocks.push(b);
                }
                if let Err(e) = ok {
                    dropped = Some(self.desc.position());
                    self.skip(n);
                    break Err(e);
                }
            }
            // Move past this record without publishing (one store at the end).
            self.skip(n);
            if done >= max {
                break Ok(done);
            }
            match self.peek() {
                Ok(Some(r)) => rec = r,
                Ok(None) => break Ok(done),
                Err(e) => break Err(e),
            }
        };
        self.release_read(false);
        blocks.sort_unstable();
        blocks.dedup();
        self.shared.release(&blocks);
        if let Some(from) = dropped {
            // A message that failed validation: every block it named comes back, also those
            // after the failing field (after the returns above, so none is returned twice).
            self.shared.dropped(
                from,
                if matches!(rec, Rec::Inline { .. }) {
                    n_of(&rec)
                } else {
                    1
                },
            );
        }
        result
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.release_read(true);
        super::own_receiver(self.ident, Some(false));
        let h = self.header();
        h.consumer_closed.store(1, Ordering::SeqCst);
        // Wake a producer asleep on a full ring or an empty pool.
        sys::futex_wake_all(&self.desc.storage().header().head.0);
        if let Ok(comp) = self.shared.comp.lock() {
            sys::futex_wake_all(&comp.storage().header().tail.0);
        }
    }
}
