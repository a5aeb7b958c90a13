//! The producer's view of its consumer: who holds the claim, whether it is alive, what
//! happens when it dies, and how long a dropped sender keeps its name for one.

use std::time::{Duration, Instant};

use super::Sender;
use crate::channel::errors::SendError;
use crate::error::Error;
use crate::link::claim::{self, DeadConsumer, Watch, consumer_claim};
use crate::sync::Ordering;

impl<P> Sender<P> {
    pub(super) fn consumer_gone(&mut self) -> Result<(), Error> {
        let h = self.header();
        if h.consumer_closed.load(Ordering::SeqCst) != 0 {
            return Err(Error::Disconnected);
        }
        // SYNC POINT (Acquire): pairs with the consumer's claiming CAS; pid and start time
        // arrive together in one word.
        let word = h.consumer.load(Ordering::Acquire);
        if word == 0 {
            let since = *self.unattached_since.get_or_insert_with(Instant::now);
            let waited = since.elapsed();
            if waited >= self.cfg.attach_timeout {
                return Err(Error::NoConsumer { waited });
            }
            return Ok(());
        }
        self.unattached_since = None;
        if self.consumer.as_ref().map(|c| c.0) != Some(word) {
            let watch = self.judge_claim(word)?;
            self.consumer = Some((word, watch));
        }
        let dead = match &self.consumer {
            Some((_, Watch::Peer(p))) => p.is_dead(),
            Some((_, Watch::Dead)) => true,
            Some((_, Watch::Unknown)) => {
                self.consumer = None;
                false
            }
            _ => false,
        };
        if dead && let Some(e) = self.reclaim_dead_consumer(word) {
            return Err(e);
        }
        Ok(())
    }

    /// Validates a consumer claim read from shared memory (see `claim::judge`).
    fn judge_claim(&self, word: u64) -> Result<Watch, Error> {
        claim::judge(word, self.ident)
    }

    /// The consumer died: everything in flight comes back, the ring is emptied, and a new
    /// consumer may attach. `None` if a new consumer took the dead one's claim over first (it
    /// reads on from where the dead one stopped and hands its blocks back: `claim.rs`).
    fn reclaim_dead_consumer(&mut self, word: u64) -> Option<Error> {
        self.consumer = None;
        // Holding `gone`, no consumer reads the blocks or the ring, and none attaches.
        let gone = DeadConsumer::take(&self.seg, word, self.ident)?;
        let reclaimed = self.pool.reclaim_all(&gone);
        // Publishes our staged records first, then drops them.
        gone.reset_ring(&mut self.desc);
        self.unattached_since = Some(Instant::now());
        let pid = gone.pid();
        // Releases the claim: a new consumer may attach at the emptied ring.
        drop(gone);
        Some(Error::PeerDied { pid, reclaimed })
    }

    /// Pid of the attached consumer, if one is attached.
    pub fn consumer_pid(&self) -> Option<u32> {
        match consumer_claim(self.header().consumer.load(Ordering::Acquire)).0 {
            0 => None,
            pid => Some(pid),
        }
    }

    /// Waits until a consumer has attached (polling every millisecond) and returns its pid;
    /// `None` if none attached within `timeout`.
    pub fn wait_for_consumer(&self, timeout: Duration) -> Option<u32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pid) = self.consumer_pid() {
                return Some(pid);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Checks the consumer: `Err(PeerDied)` (after reclaiming its blocks) if it died,
    /// `Err(Disconnected)` if it closed.
    ///
    /// # Errors
    /// As described.
    pub fn check_consumer(&mut self) -> Result<(), SendError> {
        self.owner
            .check()
            .and_then(|()| self.consumer_gone())
            .map_err(SendError::from_internal)
    }

    /// Keeps a named channel's name (this sender holds the segment) until a consumer has
    /// attached or closed, or [`ChannelConfig::linger`] has passed.
    pub(super) fn linger(&self) {
        if self.name().is_none() || self.cfg.linger.is_zero() {
            return;
        }
        let deadline = Instant::now() + self.cfg.linger;
        let mut pause = Duration::from_micros(200);
        loop {
            let h = self.header();
            if h.consumer.load(Ordering::Acquire) != 0
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
