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

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::dtype::Element;
use crate::error::{Error, corrupt};
use crate::message::{
    self, ArraySrc, FieldSrc, MessageBuilder, MessageView, Place, PoolRef, RecordView,
};
use crate::pool::{ArrayLoanUninit, LoanToken, PoolGeom, PoolHome};
use crate::ring::{self, RingHeader, RingShape, Storage};
use crate::segment::Segment;
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::sys::{self, PeerProcess};
use crate::transfer::Transfer;

/// `kind` of a channel segment.
pub(crate) const KIND_CHANNEL: u32 = 1;
const CHANNEL_HEADER_AT: usize = 128;
const DESC_RING_AT: usize = 256;
const RECORD_HEADER: usize = 16;
const REC_PAD: u32 = 1;
const REC_INLINE: u32 = 2;
const REC_BLOCK: u32 = 3;

/// How a blocked call waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitConfig {
    /// How long to spin (re-checking) before going to sleep on a futex. Spinning answers in
    /// well under a microsecond; a futex wake-up between processes costs tens of microseconds
    /// on a VM. Zero never spins.
    pub spin: Duration,
    /// How often a sleeper wakes up to check that its peer process is still alive.
    pub liveness_check: Duration,
}

impl Default for WaitConfig {
    fn default() -> Self {
        WaitConfig {
            spin: Duration::from_micros(50),
            liveness_check: Duration::from_millis(50),
        }
    }
}

/// Configuration of a channel, fixed at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelConfig {
    /// Descriptor ring capacity in slots: a power of two, 2 to 2^20 (default 1024).
    pub slots: u32,
    /// Bytes per slot: a multiple of 64 from 64 to 65536 (default 64). Small messages travel
    /// inline in one or more slots.
    pub slot_size: u32,
    /// Number of pool blocks (default 16; 0 disables zero-copy).
    pub blocks: u32,
    /// Bytes per pool block (default 1 MiB); one zero-copy array, or one large message body,
    /// per block.
    pub block_size: usize,
    /// Per-array transfer policy.
    pub transfer: Transfer,
    /// Waiting behaviour of blocked calls (per process; not stored in the segment).
    pub wait: WaitConfig,
    /// How long a dropped [`Sender`] of a *named* channel keeps its name while no consumer
    /// has attached yet (default 10 s; zero disables). The drop waits, up to this long, for a
    /// consumer to attach, so a producer that sends and exits before its consumer starts
    /// still delivers every message (the consumer opens with [`Receiver::open_timeout`]).
    /// Once a consumer has attached the name is no longer needed (the consumer holds the
    /// mapping, and reads everything sent before it sees the close): the drop does not wait.
    /// Anonymous channels never linger.
    pub linger: Duration,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            slots: 1024,
            slot_size: 64,
            blocks: 16,
            block_size: 1 << 20,
            transfer: Transfer::default(),
            wait: WaitConfig::default(),
            linger: Duration::from_secs(10),
        }
    }
}

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

/// Counters of a sender.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Messages sent.
    pub messages: u64,
    /// Arrays that went zero-copy (own pool block).
    pub zero_copy_arrays: u64,
    /// Arrays copied into the message body.
    pub copied_arrays: u64,
    /// Array bytes sent.
    pub array_bytes: u64,
}

/// The producer end of a channel. It creates and owns the segment. Dropping it closes the
/// channel (the consumer receives everything sent, then [`Error::Disconnected`]) and unlinks
/// the name; if no consumer has attached yet, the drop first waits up to
/// [`ChannelConfig::linger`] for one, so a consumer that starts later still finds the channel.
/// `Send`, not `Sync`.
///
/// # Examples
/// ```
/// use shm_ring::{ChannelConfig, MessageBuilder, Receiver, Sender};
/// let name = format!("doc-chan-{}", std::process::id());
/// let mut tx = Sender::create(&name, &ChannelConfig::default())?;
/// let mut rx = Receiver::open(&name)?; // usually in another process
/// let loan = tx.loan::<f32>(&[4])?.write_with(|i| i as f32);
/// tx.send(MessageBuilder::new().array_loan("x", loan))?;
/// let msg = rx.recv()?;
/// assert_eq!(msg.record(0)?.array::<f32>("x")?.sum(), 6.0);
/// # Ok::<(), shm_ring::Error>(())
/// ```
#[derive(Debug)]
pub struct Sender {
    seg: Arc<Segment>,
    home: Arc<PoolHome>,
    desc: ring::Producer<ShmRing>,
    comp: ring::Consumer<ShmRing>,
    cfg: ChannelConfig,
    /// Free blocks (process-local: only the producer allocates).
    free: Vec<u32>,
    /// `in_flight[b]`: block `b` went out with a message and has not come back.
    in_flight: Vec<bool>,
    consumer: Option<PeerProcess>,
    max_inline: usize,
    /// Slots written but not yet committed (batched sends).
    pending: u32,
    stats: SenderStats,
}

/// The consumer end of a channel, opened by name. `Send`, not `Sync`.
#[derive(Debug)]
pub struct Receiver {
    shared: Arc<RxShared>,
    desc: ring::Consumer<ShmRing>,
    producer: PeerProcess,
    wait: WaitConfig,
    name: String,
}

#[derive(Debug)]
struct RxShared {
    seg: Arc<Segment>,
    comp: Mutex<ring::Producer<ShmRing>>,
    pool: PoolGeom,
}

impl RxShared {
    fn pool(&self) -> PoolRef<'_> {
        PoolRef {
            base: self.seg.as_ptr().wrapping_add(self.pool.off),
            block_size: self.pool.block_size,
            blocks: self.pool.blocks,
            _life: std::marker::PhantomData,
        }
    }

    /// Hands blocks back to the producer. The completion ring holds every block index at
    /// once, so this never waits; a full ring means corrupt indices, and the blocks are dropped.
    fn release(&self, blocks: &[u32]) {
        if blocks.is_empty() {
            return;
        }
        let Ok(mut comp) = self.comp.lock() else {
            return;
        };
        let mut n = 0;
        for &b in blocks {
            if comp.free(n + 1).unwrap_or(0) <= n {
                break;
            }
            // SAFETY: slot n past our write position is free (checked above) and 8 bytes long.
            unsafe { comp.slot(n).cast::<u64>().write(b as u64) };
            n += 1;
        }
        // SYNC POINT (commit): we are done reading these blocks; the producer may reuse them
        // after its Acquire load of the completion ring's tail.
        comp.commit(n);
    }
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

/// The descriptor of the channel's segment: for an anonymous channel, the sealed memfd to hand
/// to the consumer process (`try_clone_to_owned`, then [`Receiver::from_fd`] there).
impl std::os::fd::AsFd for Sender {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.seg.file().as_fd()
    }
}

impl Sender {
    /// Creates the channel segment `/dev/shm/shmpipe-<name>` and returns its producer end.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name or configuration, [`Error::AlreadyExists`],
    /// [`Error::NoSpace`] when `/dev/shm` cannot hold the segment, [`Error::Os`].
    pub fn create(name: &str, cfg: &ChannelConfig) -> Result<Sender, Error> {
        let layout = Layout::new(cfg.slots, cfg.slot_size, cfg.blocks, cfg.block_size)?;
        let seg = Segment::create(name, layout.total)?;
        Self::init(seg, layout, cfg)
    }

    /// Creates an anonymous channel (memfd): hand [`Sender::segment`]'s file to a child process
    /// and open it there with [`Receiver::from_file`].
    ///
    /// # Errors
    /// As [`Sender::create`].
    pub fn anonymous(cfg: &ChannelConfig) -> Result<Sender, Error> {
        let layout = Layout::new(cfg.slots, cfg.slot_size, cfg.blocks, cfg.block_size)?;
        let seg = Segment::anonymous(layout.total)?;
        Self::init(seg, layout, cfg)
    }

    fn init(seg: Segment, layout: Layout, cfg: &ChannelConfig) -> Result<Sender, Error> {
        let header = ChannelHeader {
            slots: layout.desc.capacity,
            slot_size: layout.desc.slot_size,
            blocks: layout.pool.blocks,
            comp_slots: layout.comp.capacity,
            block_size: layout.pool.block_size as u64,
            producer_closed: AtomicU32::new(0),
            consumer_closed: AtomicU32::new(0),
            consumer_pid: AtomicU32::new(0),
            _pad: 0,
            consumer_start: AtomicU64::new(0),
        };
        // SAFETY: the segment is fresh (zero-filled), unpublished, and large enough (layout).
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
        let home = Arc::new(PoolHome {
            seg: seg.clone(),
            geom: layout.pool,
            orphans: Mutex::new(Vec::new()),
        });
        Ok(Sender {
            seg,
            home,
            desc,
            comp,
            cfg: *cfg,
            free: (0..layout.pool.blocks).rev().collect(),
            in_flight: vec![false; layout.pool.blocks as usize],
            consumer: None,
            max_inline: layout.desc.bytes() / 4,
            pending: 0,
            stats: SenderStats::default(),
        })
    }

    /// The channel's name (without the `shmpipe-` prefix); `None` if anonymous.
    pub fn name(&self) -> Option<&str> {
        self.seg.name()
    }

    /// The segment (e.g. to pass an anonymous channel's file to a child).
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// The configuration.
    pub fn config(&self) -> &ChannelConfig {
        &self.cfg
    }

    /// Counters since creation.
    pub fn stats(&self) -> SenderStats {
        self.stats
    }

    /// Number of pool blocks free right now (after taking back what the consumer returned).
    pub fn free_blocks(&mut self) -> Result<usize, Error> {
        self.collect_returns()?;
        Ok(self.free.len())
    }

    /// Number of descriptor slots in use (messages sent and not yet consumed): queue occupancy.
    pub fn queued_slots(&mut self) -> Result<u32, Error> {
        let cap = self.desc.shape().capacity;
        Ok(cap - self.desc.free(cap)?)
    }

    fn header(&self) -> &ChannelHeader {
        channel_header(&self.seg)
    }

    /// Takes back blocks from the completion ring and from dropped loans.
    fn collect_returns(&mut self) -> Result<(), Error> {
        let n = self.comp.available(1)?;
        for i in 0..n {
            // SAFETY: slot i is published by the consumer (available) and 8 bytes long.
            let b = unsafe { self.comp.slot(i).cast::<u64>().read() };
            let ok = b < self.in_flight.len() as u64 && self.in_flight[b as usize];
            if !ok {
                self.comp.release(i + 1);
                return Err(corrupt(format!(
                    "consumer returned block {b}, which is not in flight"
                )));
            }
            self.in_flight[b as usize] = false;
            self.free.push(b as u32);
        }
        if n > 0 {
            self.comp.release(n);
        }
        if let Ok(mut o) = self.home.orphans.try_lock() {
            self.free.append(&mut o);
        }
        Ok(())
    }

    fn consumer_gone(&mut self) -> Result<(), Error> {
        let h = self.header();
        if h.consumer_closed.load(Ordering::SeqCst) != 0 {
            return Err(Error::Disconnected);
        }
        let pid = h.consumer_pid.load(Ordering::Acquire);
        if pid == 0 {
            return Ok(());
        }
        if self.consumer.as_ref().map(|c| c.pid()) != Some(pid) {
            let start = h.consumer_start.load(Ordering::Acquire);
            self.consumer = Some(PeerProcess::watch(pid, start));
        }
        if self.consumer.as_ref().is_some_and(|c| c.is_dead()) {
            return Err(self.reclaim_dead_consumer(pid));
        }
        Ok(())
    }

    /// The consumer died: everything in flight comes back, the ring is emptied, and a new
    /// consumer may attach.
    fn reclaim_dead_consumer(&mut self, pid: u32) -> Error {
        let _ = self.collect_returns();
        let mut reclaimed = 0;
        for (b, f) in self.in_flight.iter_mut().enumerate() {
            if *f {
                *f = false;
                self.free.push(b as u32);
                reclaimed += 1;
            }
        }
        self.flush();
        self.desc.reset_consumer();
        // Anything the dead consumer pushed but we did not read: skip it.
        if let Ok(n) = self.comp.available(1) {
            self.comp.release(n);
        }
        self.consumer = None;
        let h = self.header();
        h.consumer_start.store(0, Ordering::Relaxed);
        h.consumer_pid.store(0, Ordering::SeqCst);
        Error::PeerDied { pid, reclaimed }
    }

    /// Pid of the attached consumer, if one is attached.
    pub fn consumer_pid(&self) -> Option<u32> {
        match self.header().consumer_pid.load(Ordering::Acquire) {
            0 => None,
            pid => Some(pid),
        }
    }

    /// Waits until a consumer has attached (polling every millisecond) and returns its pid.
    ///
    /// # Errors
    /// [`Error::Timeout`].
    pub fn wait_for_consumer(&self, timeout: Duration) -> Result<u32, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pid) = self.consumer_pid() {
                return Ok(pid);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Checks the consumer: `Err(PeerDied)` (after reclaiming its blocks) if it died,
    /// `Err(Disconnected)` if it closed.
    ///
    /// # Errors
    /// As described.
    pub fn check_consumer(&mut self) -> Result<(), Error> {
        self.consumer_gone()
    }

    fn alloc_block(&mut self, deadline: Option<Instant>) -> Result<u32, Error> {
        if let Some(b) = self.free.pop() {
            return Ok(b);
        }
        if self.cfg.blocks == 0 {
            return Err(Error::TooLarge {
                what: "a zero-copy array (the pool has no blocks)",
                needed: 1,
                limit: 0,
                setting: "ChannelConfig::blocks",
            });
        }
        // Publish what we batched before we wait: the consumer may need it to free blocks.
        self.flush();
        let wait = self.cfg.wait;
        let this = std::cell::RefCell::new(self);
        block_on(
            false,
            &wait,
            deadline,
            || {
                let mut s = this.borrow_mut();
                s.collect_returns()?;
                Ok(s.free.pop())
            },
            || {
                let s = this.borrow();
                let (w, v) = s.comp.begin_wait();
                (w as *const AtomicU32, v)
            },
            || this.borrow().comp.end_wait(),
            || this.borrow_mut().consumer_gone(),
        )
    }

    /// Loans an uninitialised array of `shape` from the pool, to fill in place and send with
    /// [`MessageBuilder::array_loan`] (zero-copy). Waits while the pool is empty.
    ///
    /// # Errors
    /// [`Error::TooLarge`] if the array exceeds a block; [`Error::PeerDied`] /
    /// [`Error::Disconnected`] while waiting; [`Error::Corrupt`].
    pub fn loan<T: Element>(&mut self, shape: &[usize]) -> Result<ArrayLoanUninit<T>, Error> {
        self.loan_deadline(shape, None)
    }

    /// [`Sender::loan`] with a timeout ([`Error::Timeout`]).
    ///
    /// # Errors
    /// As [`Sender::loan`], and [`Error::Timeout`].
    pub fn loan_timeout<T: Element>(
        &mut self,
        shape: &[usize],
        timeout: Duration,
    ) -> Result<ArrayLoanUninit<T>, Error> {
        self.loan_deadline(shape, Some(Instant::now() + timeout))
    }

    fn loan_deadline<T: Element>(
        &mut self,
        shape: &[usize],
        deadline: Option<Instant>,
    ) -> Result<ArrayLoanUninit<T>, Error> {
        let len = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows")))?;
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        if self.cfg.blocks == 0 {
            return Err(Error::TooLarge {
                what: "a loaned array (the pool has no blocks)",
                needed: 1,
                limit: 0,
                setting: "ChannelConfig::blocks",
            });
        }
        if bytes > self.home.geom.block_size {
            return Err(Error::TooLarge {
                what: "loaned array",
                needed: bytes,
                limit: self.home.geom.block_size,
                setting: "ChannelConfig::block_size",
            });
        }
        let block = self.alloc_block(deadline)?;
        Ok(ArrayLoanUninit::new(LoanToken {
            home: self.home.clone(),
            block,
            dtype: T::DTYPE,
            shape: shape.to_vec(),
            len,
            live: true,
        }))
    }

    /// Sends a message, waiting while the ring is full or the pool is empty.
    ///
    /// # Errors
    /// [`Error::Disconnected`] if the consumer closed; [`Error::PeerDied`] if it died (its
    /// blocks are reclaimed); [`Error::TooLarge`]; [`Error::InvalidArgument`] for a loan from
    /// another sender or a field over the encoding limits. On error, loans in the message go
    /// back to the pool.
    pub fn send(&mut self, msg: MessageBuilder<'_>) -> Result<(), Error> {
        self.send_inner(msg, None)?;
        self.flush();
        Ok(())
    }

    /// [`Sender::send`] with a timeout ([`Error::Timeout`]).
    ///
    /// # Errors
    /// As [`Sender::send`], and [`Error::Timeout`].
    pub fn send_timeout(
        &mut self,
        msg: MessageBuilder<'_>,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.send_inner(msg, Some(Instant::now() + timeout))?;
        self.flush();
        Ok(())
    }

    /// Sends without waiting: [`Error::Full`] if the ring or pool has no room right now.
    ///
    /// # Errors
    /// As [`Sender::send`], and [`Error::Full`].
    pub fn try_send(&mut self, msg: MessageBuilder<'_>) -> Result<(), Error> {
        match self.send_inner(msg, Some(Instant::now())) {
            Err(Error::Timeout) => Err(Error::Full),
            r => {
                self.flush();
                r
            }
        }
    }

    /// Sends several messages, publishing them together (one index store for the whole batch,
    /// unless the ring fills up on the way).
    ///
    /// # Errors
    /// As [`Sender::send`]; messages before the failing one were sent.
    pub fn send_batch<'m>(
        &mut self,
        msgs: impl IntoIterator<Item = MessageBuilder<'m>>,
    ) -> Result<usize, Error> {
        let mut n = 0;
        for m in msgs {
            if let Err(e) = self.send_inner(m, None) {
                self.flush();
                return Err(e);
            }
            n += 1;
        }
        self.flush();
        Ok(n)
    }

    fn flush(&mut self) {
        if self.pending > 0 {
            self.desc.commit(self.pending);
            self.pending = 0;
        }
    }

    /// Waits for `n` contiguous free slots after the pending ones; returns how many pad slots
    /// must come first.
    fn reserve_slots(&mut self, n: u32, deadline: Option<Instant>) -> Result<u32, Error> {
        let cap = self.desc.shape().capacity;
        let pending = self.pending;
        let contiguous = self.desc.contiguous(pending);
        let pad = if contiguous < n { contiguous } else { 0 };
        let need = pending + pad + n;
        if pad + n > cap {
            return Err(Error::TooLarge {
                what: "message record",
                needed: n as usize * self.desc.shape().slot_size as usize,
                limit: self.max_inline,
                setting: "ChannelConfig::slots (or slot_size)",
            });
        }
        if self.desc.free(need)? >= need {
            return Ok(pad);
        }
        // Publish what we batched before we wait, or the consumer never sees it.
        self.flush();
        let need = pad + n;
        let wait = self.cfg.wait;
        let this = std::cell::RefCell::new(self);
        block_on(
            false,
            &wait,
            deadline,
            || {
                let mut s = this.borrow_mut();
                if s.header().consumer_closed.load(Ordering::Relaxed) != 0 {
                    return Err(Error::Disconnected);
                }
                let free = s.desc.free(need)?;
                Ok((free >= need).then_some(pad))
            },
            || {
                let s = this.borrow();
                let (w, v) = s.desc.begin_wait();
                (w as *const AtomicU32, v)
            },
            || this.borrow().desc.end_wait(),
            || this.borrow_mut().consumer_gone(),
        )
    }

    fn send_inner(
        &mut self,
        mut msg: MessageBuilder<'_>,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        if self.header().consumer_closed.load(Ordering::Relaxed) != 0 {
            return Err(Error::Disconnected);
        }
        message::check_limits(&msg)?;
        // 1. Where does each array go?
        let mut places: SmallVec<[Place; 8]> = SmallVec::with_capacity(msg.fields.len());
        let mut new_blocks = 0usize;
        for f in &msg.fields {
            places.push(match &f.src {
                FieldSrc::Meta(_) => Place::None,
                FieldSrc::Array {
                    data: ArraySrc::Loan(t),
                    ..
                } => {
                    if !Arc::ptr_eq(&t.home, &self.home) {
                        return Err(Error::InvalidArgument(format!(
                            "array '{}' was loaned from another sender",
                            f.name
                        )));
                    }
                    Place::Block(t.block)
                }
                FieldSrc::Array { data, .. } => {
                    let len = data.len();
                    if self.cfg.blocks > 0 && self.cfg.transfer.zero_copy(len) {
                        if len > self.home.geom.block_size {
                            return Err(Error::TooLarge {
                                what: "zero-copy array",
                                needed: len,
                                limit: self.home.geom.block_size,
                                setting: "ChannelConfig::block_size",
                            });
                        }
                        new_blocks += 1;
                        Place::Block(u32::MAX)
                    } else {
                        Place::Inline
                    }
                }
            });
        }
        let body_len = message::body_len(&msg, &places);
        let inline = RECORD_HEADER + body_len <= self.max_inline;
        if !inline {
            if self.cfg.blocks == 0 {
                return Err(Error::TooLarge {
                    what: "message body (too large to travel inline)",
                    needed: RECORD_HEADER + body_len,
                    limit: self.max_inline,
                    setting: "ChannelConfig::slots (or slot_size)",
                });
            }
            if body_len > self.home.geom.block_size {
                return Err(Error::TooLarge {
                    what: "message body",
                    needed: body_len,
                    limit: self.home.geom.block_size,
                    setting: "ChannelConfig::block_size",
                });
            }
            new_blocks += 1;
        }
        if new_blocks > self.cfg.blocks as usize {
            return Err(Error::TooLarge {
                what: "message (pool blocks)",
                needed: new_blocks,
                limit: self.cfg.blocks as usize,
                setting: "ChannelConfig::blocks",
            });
        }
        // 2. Blocks for arrays copied zero-copy, and their data.
        let mut taken: SmallVec<[u32; 4]> = SmallVec::new();
        let result = (|| {
            for (i, f) in msg.fields.iter().enumerate() {
                if places[i] == Place::Block(u32::MAX) {
                    let b = self.alloc_block(deadline)?;
                    taken.push(b);
                    places[i] = Place::Block(b);
                    if let FieldSrc::Array { data, .. } = &f.src {
                        let src = data.bytes();
                        // SAFETY: block b is free (ours alone) and block_size >= src.len() (checked).
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                src.as_ptr(),
                                self.home.block_ptr(b),
                                src.len(),
                            )
                        };
                    }
                }
            }
            let body_block = if inline {
                None
            } else {
                let b = self.alloc_block(deadline)?;
                taken.push(b);
                Some(b)
            };
            let n_slots = if inline {
                (RECORD_HEADER + body_len).div_ceil(self.desc.shape().slot_size as usize) as u32
            } else {
                1
            };
            let pad = self.reserve_slots(n_slots, deadline)?;
            Ok((body_block, n_slots, pad))
        })();
        let (body_block, n_slots, pad) = match result {
            Ok(v) => v,
            Err(e) => {
                self.free.extend_from_slice(&taken);
                return Err(e);
            }
        };
        // 3. Write the record (and the body) and hand the blocks over.
        let slot_size = self.desc.shape().slot_size as usize;
        if pad > 0 {
            let p = self.desc.slot(self.pending);
            // SAFETY: the pad slots are free (reserved above) and at least 16 bytes long.
            unsafe { write_record_header(p, pad, REC_PAD, 0, 0) };
            self.pending += pad;
        }
        let rec = self.desc.slot(self.pending);
        match body_block {
            None => {
                // SAFETY: n_slots contiguous free slots start at `rec` (reserve_slots), holding
                // RECORD_HEADER + body_len bytes; slot memory is 8-aligned.
                let dst = unsafe {
                    write_record_header(rec, n_slots, REC_INLINE, body_len as u32, 0);
                    std::slice::from_raw_parts_mut(
                        rec.add(RECORD_HEADER),
                        n_slots as usize * slot_size - RECORD_HEADER,
                    )
                };
                message::encode(&msg, &places, &mut dst[..body_len]);
            }
            Some(b) => {
                // SAFETY: block b is free, block_size >= body_len (checked), 64-aligned.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(self.home.block_ptr(b), body_len) };
                message::encode(&msg, &places, dst);
                // SAFETY: one free slot at `rec`, at least 16 bytes.
                unsafe { write_record_header(rec, 1, REC_BLOCK, body_len as u32, b) };
            }
        }
        for b in taken {
            self.in_flight[b as usize] = true;
        }
        for (f, p) in msg.fields.iter_mut().zip(&places) {
            if let FieldSrc::Array { data, .. } = &mut f.src {
                self.stats.array_bytes += data.len() as u64;
                if let ArraySrc::Loan(t) = std::mem::replace(data, ArraySrc::Borrowed(&[])) {
                    let b = (*t).take();
                    self.in_flight[b as usize] = true;
                }
                match p {
                    Place::Block(_) => self.stats.zero_copy_arrays += 1,
                    _ => self.stats.copied_arrays += 1,
                }
            }
        }
        self.stats.messages += 1;
        self.pending += n_slots;
        Ok(())
    }

    /// Closes the channel: the consumer receives everything sent so far, then
    /// [`Error::Disconnected`]. Same as dropping the sender.
    pub fn close(self) {}
}

/// Writes a 16-byte record header: n_slots u32, kind u32, body_len u32, block u32.
///
/// # Safety
/// `p` must be valid for 16 bytes of writes and 4-aligned.
unsafe fn write_record_header(p: *mut u8, n_slots: u32, kind: u32, body_len: u32, block: u32) {
    let h = [n_slots, kind, body_len, block];
    // SAFETY: delegated to the caller.
    unsafe { p.cast::<[u32; 4]>().write(h) };
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.flush();
        let h = self.header();
        h.producer_closed.store(1, Ordering::SeqCst);
        // Wake a consumer asleep on the descriptor ring: it will see the flag.
        sys::futex_wake_all(&self.desc.storage().header().tail.0);
        self.linger();
    }
}

impl Sender {
    /// Keeps a named channel's name (this sender holds the segment) until a consumer has
    /// attached or closed, or [`ChannelConfig::linger`] has passed.
    fn linger(&self) {
        if self.seg.name().is_none() || self.cfg.linger.is_zero() {
            return;
        }
        let deadline = Instant::now() + self.cfg.linger;
        let mut pause = Duration::from_micros(200);
        loop {
            let h = self.header();
            if h.consumer_pid.load(Ordering::Acquire) != 0
                || h.consumer_closed.load(Ordering::Acquire) != 0
            {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }
}

/// A received record header, validated.
enum Rec {
    Pad(u32),
    Inline { n_slots: u32, body_len: usize },
    Block { block: u32, body_len: usize },
}

impl Receiver {
    /// Opens the consumer end of the channel `name`, created by a [`Sender`] in any process of
    /// the same user. One consumer at a time.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::NotASegment`], [`Error::VersionMismatch`],
    /// [`Error::Corrupt`] (inconsistent geometry), [`Error::Busy`] (another consumer attached),
    /// [`Error::PeerDied`] (the creator is gone).
    pub fn open(name: &str) -> Result<Receiver, Error> {
        let seg = Segment::open(name, KIND_CHANNEL)?;
        Self::attach(seg, name.to_string(), WaitConfig::default())
    }

    /// [`Receiver::open`], waiting up to `timeout` for a producer that has not created the
    /// channel yet (retrying every few milliseconds). With a producer that may start before
    /// or after this call, this is the one to use: a dropped [`Sender`] keeps the name for
    /// [`ChannelConfig::linger`] until a consumer attached, so either start order delivers
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
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(500);
        loop {
            match Segment::open(name, KIND_CHANNEL) {
                Ok(seg) => return Self::attach(seg, name.to_string(), WaitConfig::default()),
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

    /// Opens the consumer end of an anonymous channel from its file (see [`Sender::anonymous`]).
    ///
    /// # Errors
    /// As [`Receiver::open`].
    pub fn from_file(file: std::fs::File) -> Result<Receiver, Error> {
        Self::from_fd(file.into())
    }

    /// Opens the consumer end of an anonymous channel from a descriptor of its memfd (see
    /// [`Sender::anonymous`], and [`Sender`]'s `AsFd` to get the producer's descriptor).
    /// The memfd must be sealed against shrinking and growing (as [`Sender::anonymous`] leaves
    /// it) and have the size its header states: a peer holding the descriptor then cannot
    /// truncate the memory under us.
    ///
    /// # Errors
    /// [`Error::NotASegment`] (not a sealed memfd, wrong size, bad magic), as [`Receiver::open`].
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> Result<Receiver, Error> {
        let seg = Segment::from_fd(fd, KIND_CHANNEL)?;
        Self::attach(seg, "(anonymous)".into(), WaitConfig::default())
    }

    /// Sets how blocked calls wait.
    pub fn set_wait(&mut self, wait: WaitConfig) {
        self.wait = wait;
    }

    fn attach(seg: Segment, name: String, wait: WaitConfig) -> Result<Receiver, Error> {
        if seg.len() < DESC_RING_AT {
            return Err(corrupt(format!("channel segment of {} bytes", seg.len())));
        }
        let h = channel_header(&seg);
        // Read each geometry field once, then check the whole layout against the segment.
        let (slots, slot_size, blocks, comp_slots, block_size) =
            (h.slots, h.slot_size, h.blocks, h.comp_slots, h.block_size);
        let block_size = usize::try_from(block_size).map_err(|_| corrupt("block size"))?;
        let layout = Layout::new(slots, slot_size, blocks, block_size)
            .map_err(|e| corrupt(format!("channel geometry: {e}")))?;
        if layout.total != seg.len()
            || layout.comp.capacity != comp_slots
            || layout.pool.block_size != block_size
        {
            return Err(corrupt(format!(
                "channel geometry ({slots} slots x {slot_size} B, {blocks} blocks x {block_size} B) \
                 does not match a segment of {} bytes",
                seg.len()
            )));
        }
        let header = seg.header();
        let producer = PeerProcess::watch(header.creator_pid, header.creator_start);
        let me = sys::pid();
        h.consumer_start
            .store(sys::process_start_time(me).unwrap_or(0), Ordering::Release);
        if let Err(other) =
            h.consumer_pid
                .compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
        {
            return Err(Error::Busy(other));
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
            }),
            desc,
            producer,
            wait,
            name,
        })
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

    fn header(&self) -> &ChannelHeader {
        channel_header(&self.shared.seg)
    }

    /// Reads and validates the record header at our read position, if a record is there.
    fn peek(&mut self) -> Result<Option<Rec>, Error> {
        let avail = self.desc.available(1)?;
        if avail == 0 {
            return Ok(None);
        }
        let p = self.desc.slot(0);
        // SAFETY: slot 0 is published (avail >= 1) and at least 64 bytes; 4-aligned.
        let [n_slots, kind, body_len, block] = unsafe { p.cast::<[u32; 4]>().read() };
        let slot_size = self.desc.shape().slot_size as usize;
        if n_slots == 0 || n_slots > avail || n_slots > self.desc.contiguous(0) {
            return Err(self.skip_corrupt(format!(
                "record of {n_slots} slots ({avail} published, {} before the wrap)",
                self.desc.contiguous(0)
            )));
        }
        match kind {
            REC_PAD => Ok(Some(Rec::Pad(n_slots))),
            REC_INLINE if (body_len as usize) <= n_slots as usize * slot_size - RECORD_HEADER => {
                Ok(Some(Rec::Inline {
                    n_slots,
                    body_len: body_len as usize,
                }))
            }
            REC_BLOCK
                if n_slots == 1
                    && block < self.shared.pool.blocks
                    && body_len as usize <= self.shared.pool.block_size =>
            {
                Ok(Some(Rec::Block {
                    block,
                    body_len: body_len as usize,
                }))
            }
            _ => Err(self.skip_corrupt(format!(
                "record kind {kind}, {n_slots} slots, body {body_len} bytes, block {block}"
            ))),
        }
    }

    /// A corrupt record: skip everything published (we cannot find the next record boundary).
    fn skip_corrupt(&mut self, why: String) -> Error {
        if let Ok(n) = self.desc.available(1) {
            self.desc.release(n);
        }
        corrupt(why)
    }

    /// Waits for the next record (skipping pads); `Ok(None)` only on timeout via `block_on`.
    fn next_rec(&mut self, deadline: Option<Instant>) -> Result<Rec, Error> {
        let wait = self.wait;
        let this = std::cell::RefCell::new(self);
        block_on(
            true,
            &wait,
            deadline,
            || {
                let mut s = this.borrow_mut();
                loop {
                    match s.peek()? {
                        Some(Rec::Pad(n)) => {
                            s.desc.release(n);
                        }
                        Some(r) => return Ok(Some(r)),
                        None => {
                            if s.header().producer_closed.load(Ordering::SeqCst) != 0 {
                                // The final commit happened before the flag: look once more.
                                return match s.peek()? {
                                    None => Err(Error::Disconnected),
                                    Some(Rec::Pad(n)) => {
                                        s.desc.release(n);
                                        continue;
                                    }
                                    Some(r) => Ok(Some(r)),
                                };
                            }
                            return Ok(None);
                        }
                    }
                }
            },
            || {
                let s = this.borrow();
                let (w, v) = s.desc.begin_wait();
                (w as *const AtomicU32, v)
            },
            || this.borrow().desc.end_wait(),
            || {
                let s = this.borrow();
                if s.producer.is_dead() {
                    Err(Error::PeerDied {
                        pid: s.producer.pid(),
                        reclaimed: 0,
                    })
                } else {
                    Ok(())
                }
            },
        )
    }

    /// Body bytes of a record at our read position.
    fn body(&self, rec: &Rec) -> &[u8] {
        match *rec {
            Rec::Inline { body_len, .. } => {
                // SAFETY: validated in `peek`: the record's slots are published, contiguous,
                // and hold RECORD_HEADER + body_len bytes.
                unsafe {
                    std::slice::from_raw_parts(self.desc.slot(0).add(RECORD_HEADER), body_len)
                }
            }
            Rec::Block { block, body_len } => {
                // SAFETY: validated in `peek`: block < blocks and body_len <= block_size.
                unsafe {
                    std::slice::from_raw_parts(
                        self.shared.seg.as_ptr().add(
                            self.shared.pool.off + block as usize * self.shared.pool.block_size,
                        ),
                        body_len,
                    )
                }
            }
            Rec::Pad(_) => &[],
        }
    }

    fn finish(&mut self, rec: &Rec) {
        match *rec {
            Rec::Inline { n_slots, .. } => {
                self.desc.release(n_slots);
            }
            Rec::Block { block, .. } => {
                self.desc.release(1);
                self.shared.release(&[block]);
            }
            Rec::Pad(n) => {
                self.desc.release(n);
            }
        }
    }

    fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Message, Error> {
        let rec = self.next_rec(deadline)?;
        // Copy the body out of shared memory: validation then works on private bytes that no
        // other process can change, and the slots (or body block) go back at once.
        let src = self.body(&rec);
        let mut body = vec![0u64; src.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut body)[..src.len()].copy_from_slice(src);
        let body_len = src.len();
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
    /// # Errors
    /// As [`Receiver::recv_timeout`]; a corrupt message ends the batch with [`Error::Corrupt`]
    /// after the messages before it were handed to `f`.
    pub fn recv_batch(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        mut f: impl FnMut(MessageView<'_>),
    ) -> Result<usize, Error> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut rec = self.next_rec(deadline)?;
        let mut done = 0usize;
        let mut blocks: SmallVec<[u32; 16]> = SmallVec::new();
        let result = loop {
            let (n, block) = match rec {
                Rec::Inline { n_slots, .. } => (n_slots, None),
                Rec::Block { block, .. } => (1, Some(block)),
                Rec::Pad(n) => (n, None),
            };
            if !matches!(rec, Rec::Pad(_)) {
                let body = self.body(&rec);
                let pool = self.shared.pool();
                let view = MessageView::parse(body, pool);
                let mut ok = view.and_then(|v| v.for_each_block(|b| blocks.push(b)).map(|_| v));
                if let Ok(v) = ok.as_mut() {
                    f(*v);
                    done += 1;
                }
                if let Some(b) = block {
                    blocks.push(b);
                }
                if let Err(e) = ok {
                    self.desc.skip(n);
                    break Err(e);
                }
            }
            // Move past this record without publishing (one store at the end).
            self.desc.skip(n);
            if done >= max {
                break Ok(done);
            }
            match self.peek() {
                Ok(Some(r)) => rec = r,
                Ok(None) => break Ok(done),
                Err(e) => break Err(e),
            }
        };
        self.desc.release(0);
        blocks.sort_unstable();
        blocks.dedup();
        self.shared.release(&blocks);
        result
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let h = self.header();
        h.consumer_closed.store(1, Ordering::SeqCst);
        // Wake a producer asleep on a full ring or an empty pool.
        sys::futex_wake_all(&self.desc.storage().header().head.0);
        if let Ok(comp) = self.shared.comp.lock() {
            sys::futex_wake_all(&comp.storage().header().tail.0);
        }
    }
}

/// A received message, owned: its body was copied out of the ring, and the pool blocks of its
/// zero-copy arrays stay leased to it until it is dropped. `Send`.
#[derive(Debug)]
pub struct Message {
    body: Vec<u64>,
    body_len: usize,
    blocks: SmallVec<[u32; 4]>,
    shared: Arc<RxShared>,
}

impl Message {
    /// The message, read in place.
    pub fn view(&self) -> MessageView<'_> {
        let bytes = &bytemuck::cast_slice::<u64, u8>(&self.body)[..self.body_len];
        MessageView::parse(bytes, self.shared.pool()).expect("validated when received")
    }

    /// The tag.
    pub fn tag(&self) -> u32 {
        self.view().tag()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.view().len()
    }

    /// Whether the message has no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Record `i`.
    ///
    /// # Errors
    /// [`Error::NoSuchField`] past the end, [`Error::Corrupt`].
    pub fn record(&self, i: usize) -> Result<RecordView<'_>, Error> {
        self.view().record(i)
    }

    /// Pool blocks this message holds (zero-copy arrays).
    pub fn leased_blocks(&self) -> usize {
        self.blocks.len()
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        self.shared.release(&self.blocks);
    }
}
