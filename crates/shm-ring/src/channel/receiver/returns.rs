//! The consumer's end of the completion ring: handing pool blocks back to the producer, and
//! notes about records dropped unread (their blocks come back too). Shared by the
//! [`Receiver`](super::Receiver) and every owned [`Message`](crate::Message) it handed out.

use std::sync::{Arc, Mutex};

use crate::channel::{DROPPED_MARK, ShmRing};
use crate::error::{Error, corrupt};
use crate::link::segment::Segment;
use crate::message::PoolRef;
use crate::pool::PoolGeom;
use crate::ring;

#[derive(Debug)]
pub(in crate::channel) struct RxShared {
    /// The process of the receiver: in any other (a forked child) drops hand nothing back
    /// and receives are refused.
    pub(in crate::channel) owner: crate::fork::Owner,
    pub(in crate::channel) seg: Arc<Segment>,
    pub(in crate::channel) comp: Mutex<ring::Producer<ShmRing>>,
    pub(in crate::channel) pool: PoolGeom,
    /// Why the completion ring cannot take our returns any more (a corrupt index written by
    /// the producer, or more notes than it holds); every later receive reports it.
    pub(in crate::channel) broken: Mutex<Option<String>>,
    pub(in crate::channel) is_broken: std::sync::atomic::AtomicBool,
}

impl RxShared {
    pub(in crate::channel) fn pool(&self) -> PoolRef<'_> {
        PoolRef::new(&self.seg, self.pool)
    }

    /// Hands blocks back to the producer. The completion ring holds every block index at
    /// once, so this never waits.
    pub(in crate::channel) fn release(&self, blocks: &[u32]) {
        if !blocks.is_empty() {
            self.push(blocks.iter().map(|&b| b as u64));
        }
    }

    /// Tells the producer that the records at descriptor positions `[from, from + n)` were
    /// dropped unread, so it takes back the blocks that went out with them.
    pub(in crate::channel) fn dropped(&self, from: u32, n: u32) {
        if n > 0 {
            self.push(std::iter::once(
                DROPPED_MARK | (n as u64) << 32 | from as u64,
            ));
        }
    }

    fn push(&self, entries: impl Iterator<Item = u64>) {
        if !self.owner.is_current() {
            return; // a forked child's copy: the parent still holds these blocks
        }
        let Ok(mut comp) = self.comp.lock() else {
            return;
        };
        let mut lost = None;
        // The completion ring holds every block index and as many notes: it is full only if
        // the producer stopped reading it (or lies about its index).
        let cap = comp.shape().capacity;
        match comp.write_chunk_uninit(cap) {
            Err(e) => lost = Some(format!("completion ring: {e}")),
            Ok(mut chunk) => {
                let mut n = 0;
                for e in entries {
                    if n == chunk.len() {
                        lost = Some(
                            "the completion ring is full (the producer stopped reading it)".into(),
                        );
                        break;
                    }
                    // A volatile store into a free slot: a hostile producer writing it
                    // meanwhile only changes what it reads back; we never read this memory.
                    chunk.write_pod(n, 0, e);
                    n += 1;
                }
                // SYNC POINT (commit): we are done reading these blocks; the producer may
                // reuse them after its Acquire load of the completion ring's tail.
                chunk.commit(n);
            }
        }
        if let Some(why) = lost {
            if let Ok(mut b) = self.broken.lock() {
                b.get_or_insert(why);
            }
            self.is_broken
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// `Err(Corrupt)` once the completion ring broke; `Err(Forked)` in a forked child.
    #[inline]
    pub(in crate::channel) fn check(&self) -> Result<(), Error> {
        if !self.is_broken.load(std::sync::atomic::Ordering::Relaxed) && self.owner.is_current() {
            return Ok(());
        }
        self.owner.check()?;
        self.broken_error()
    }

    #[cold]
    fn broken_error(&self) -> Result<(), Error> {
        let why = self.broken.lock().ok().and_then(|b| b.clone());
        Err(corrupt(format!(
            "{}: pool blocks can no longer be handed back",
            why.unwrap_or_default()
        )))
    }
}
