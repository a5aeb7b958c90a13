//! The producer's view of its consumer: who holds the claim, whether it is alive, what
//! happens when it dies, and how long a dropped sender keeps its name for one.

use std::time::{Duration, Instant};

use super::Sender;
use crate::channel::{consumer_claim, own_receiver};
use crate::error::{Error, corrupt};
use crate::sync::Ordering;
use crate::sys::{self, PeerProcess};

/// What a consumer claim names.
#[derive(Debug)]
pub(super) enum Watch {
    /// A receiver in this process.
    Own,
    /// Another live process.
    Peer(PeerProcess),
    /// A process that does not exist (any more), or a claim that names none.
    Dead,
    /// Cannot tell right now (e.g. `/proc` unreadable): not dead; asked again next time.
    Unknown,
}

impl Sender {
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
        if dead {
            return Err(self.reclaim_dead_consumer(word));
        }
        Ok(())
    }

    /// Validates a consumer claim read from shared memory (see `ChannelHeader::consumer`).
    fn judge_claim(&self, word: u64) -> Result<Watch, Error> {
        let (pid, start_lo) = consumer_claim(word);
        if pid == 0 {
            return Err(corrupt(format!("consumer claim {word:#x} names no pid")));
        }
        if pid == sys::pid() {
            // A consumer in this very process: believe it only if one has this channel open.
            return if own_receiver(self.ident, None) {
                Ok(Watch::Own)
            } else {
                Err(corrupt(format!(
                    "consumer claim names this process ({pid}), which has no receiver on the channel"
                )))
            };
        }
        Ok(match sys::process_start_time(pid) {
            // The pid and the start time must name one live process: a recycled pid or a
            // garbage start time is a consumer that is gone.
            Some(start) if start as u32 == start_lo => Watch::Peer(PeerProcess::watch(pid, start)),
            Some(_) => Watch::Dead,
            // `/proc` does not show it (hidepid hides other users' processes, or out of
            // descriptors): only the kernel's definite "no such process" counts as dead. One
            // that exists is watched through its pidfd (its start time cannot be checked: a
            // recycled pid is then taken for alive, never the reverse).
            None => match sys::liveness(pid, 0) {
                sys::Liveness::Dead => Watch::Dead,
                sys::Liveness::Alive => Watch::Peer(PeerProcess::watch(pid, 0)),
                sys::Liveness::Unknown => Watch::Unknown,
            },
        })
    }

    /// The consumer died: everything in flight comes back, the ring is emptied, and a new
    /// consumer may attach.
    fn reclaim_dead_consumer(&mut self, word: u64) -> Error {
        let pid = consumer_claim(word).0;
        // SAFETY: the consumer named by `word` is dead (judged from pid and start time, or a
        // definite "no such process"), and a new one cannot be served before we release the
        // claim below: nobody reads the blocks or the ring any more.
        let reclaimed = unsafe { self.pool.reclaim_all() };
        // SAFETY: as above; `reset_consumer` publishes our staged records first, then drops them.
        unsafe { self.desc.reset_consumer() };
        self.consumer = None;
        self.unattached_since = Some(Instant::now());
        // Free the claim for a new consumer, unless one has already replaced it.
        let _ =
            self.header()
                .consumer
                .compare_exchange(word, 0, Ordering::SeqCst, Ordering::Relaxed);
        Error::PeerDied { pid, reclaimed }
    }

    /// Pid of the attached consumer, if one is attached.
    pub fn consumer_pid(&self) -> Option<u32> {
        match consumer_claim(self.header().consumer.load(Ordering::Acquire)).0 {
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
        self.owner.check()?;
        self.consumer_gone()
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
