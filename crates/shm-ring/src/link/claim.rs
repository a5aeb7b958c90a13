//! The consumer claim: the one word of the channel header that names the attached consumer,
//! how either end judges the process it names, and who releases the claim of a consumer that
//! died.
//!
//! The word packs the consumer's pid (high 32 bits) and the low 32 bits of its start time, so
//! nobody pairs one process's pid with another's start time. It goes from 0 to an opener's
//! word with one CAS (one winner among racing openers; a refused opener writes nothing). A
//! dead consumer's claim is released by whichever end notices first, and one CAS on the dead
//! consumer's word decides which:
//! - the **producer**, in a call that has to wait (for room or a block): it swaps the word for
//!   [`RECLAIMING`], takes back every block in flight, empties the ring, and sets the word to
//!   0 (`Sender::reclaim_dead_consumer`); an opener that sees [`RECLAIMING`] waits for the 0;
//! - a **new consumer** that opens the channel ([`claim`]): it swaps the word for its own,
//!   continues at the first record the dead consumer did not take, and reports every record
//!   before that one as dropped (a note in the completion ring), so the producer takes back
//!   the blocks the dead consumer still held the next time it collects returns
//!   (`BlockPool::collect_returns`). The producer sees a new consumer, not `PeerDied`.
//!
//! A consumer is judged dead only on definite evidence, by the rules of [`sys::liveness`]:
//! its pid names another process (another start time), its pidfd says its whole thread
//! group ended (a leader in `Z` with live threads is alive), or, where `/proc` does not show
//! it (`hidepid`), the kernel answers `ESRCH`. "Cannot tell" is alive. The word is read once
//! (the CAS's failure value) and only that copy is judged; it is replaced only if it still
//! holds that exact value.

use std::time::{Duration, Instant};

use crate::error::{Error, corrupt};
use crate::link::layout::{ChannelHeader, ShmRing, channel_header};
use crate::link::segment::Segment;
use crate::ring;
use crate::sync::Ordering;
use crate::sys::{self, PeerProcess};

/// The claim while the producer takes back a dead consumer's blocks (no consumer writes it:
/// its pid is 0). Openers wait for it to become 0.
pub(crate) const RECLAIMING: u64 = 0xffff_ffff;

/// How long an opener waits while the producer reclaims (it takes microseconds; a producer
/// that died meanwhile leaves the word so).
const RECLAIM_WAIT: Duration = Duration::from_secs(2);

/// Records before the takeover point whose blocks a new consumer hands back: every position
/// of the last 2^31 - 1 (the most a "dropped" note spans). A dead consumer's block that went
/// out 2^31 or more records before it died stays out (leaked, never reused).
pub(crate) const TAKEOVER_SPAN: u32 = (1 << 31) - 1;

/// Packs a consumer claim (see [`ChannelHeader::consumer`]).
pub(crate) fn consumer_word(pid: u32, start: u64) -> u64 {
    (u64::from(pid) << 32) | (start & 0xffff_ffff)
}

/// Unpacks a consumer claim: (pid, low 32 bits of the start time).
pub(crate) fn consumer_claim(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

/// What a consumer claim names.
#[derive(Debug)]
pub(crate) enum Watch {
    /// A receiver in this process.
    Own,
    /// Another live process.
    Peer(PeerProcess),
    /// A process that does not exist (any more), or a claim that names none.
    Dead,
    /// Cannot tell right now (e.g. `/proc` unreadable): not dead; asked again next time.
    Unknown,
}

impl Watch {
    /// Whether the claimant is dead now (definite evidence only).
    pub(crate) fn is_dead(&self) -> bool {
        match self {
            Watch::Peer(p) => p.is_dead(),
            Watch::Dead => true,
            Watch::Own | Watch::Unknown => false,
        }
    }
}

/// Judges a consumer claim `word` (a private copy) of the channel `ident` (its file's
/// device and inode).
///
/// # Errors
/// [`Error::Corrupt`] for a claim that names no pid, or names this process while no receiver
/// of this process has the channel open.
pub(crate) fn judge(word: u64, ident: (u64, u64)) -> Result<Watch, Error> {
    let (pid, start_lo) = consumer_claim(word);
    if pid == 0 {
        return Err(corrupt(format!("consumer claim {word:#x} names no pid")));
    }
    if pid == sys::pid() {
        // A consumer in this very process: believe it only if one has this channel open.
        return if crate::fork::own_receiver(ident, None) {
            Ok(Watch::Own)
        } else {
            Err(corrupt(format!(
                "consumer claim names this process ({pid}), which has no receiver on the channel"
            )))
        };
    }
    Ok(match sys::process_start_time(pid) {
        // The pid and the start time must name one live process: a recycled pid or a garbage
        // start time is a consumer that is gone.
        Some(start) if start as u32 == start_lo => Watch::Peer(PeerProcess::watch(pid, start)),
        Some(_) => Watch::Dead,
        // `/proc` does not show it (hidepid hides other users' processes, or out of
        // descriptors): only the kernel's definite "no such process" counts as dead. One that
        // exists is watched through its pidfd (its start time cannot be checked: a recycled
        // pid is then taken for alive, never the reverse).
        None => match sys::liveness(pid, 0) {
            sys::Liveness::Dead => Watch::Dead,
            sys::Liveness::Alive => Watch::Peer(PeerProcess::watch(pid, 0)),
            sys::Liveness::Unknown => Watch::Unknown,
        },
    })
}

/// How an opener got the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// From 0: nobody had it, or the producer had released a dead consumer's.
    Free,
    /// From a dead consumer: the opener must report the records before its read position as
    /// dropped (see the module doc).
    TakenOver,
}

/// Claims the consumer end for `mine` (our [`consumer_word`]) on the channel `ident`: from 0,
/// or from a consumer that is dead.
///
/// # Errors
/// [`Error::ConsumerClosed`] naming the claimant when the consumer closed (the stream ended);
/// [`Error::Busy`] naming the claimant while a live consumer (or one that cannot be judged)
/// holds the claim, or, with pid 0, while the producer's reclaim does not
/// end within [`RECLAIM_WAIT`].
pub(crate) fn claim(h: &ChannelHeader, mine: u64, ident: (u64, u64)) -> Result<Claimed, Error> {
    let deadline = Instant::now() + RECLAIM_WAIT;
    loop {
        // SYNC POINT (AcqRel CAS): pid and start time are claimed together in one word; the
        // producer's Acquire load of it learns who the consumer is. A refused CAS writes
        // nothing; its Acquire pairs with the producer's store of 0 after a reclaim.
        let other = match h
            .consumer
            .compare_exchange(0, mine, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Ok(Claimed::Free),
            Err(other) => other,
        };
        let pid = consumer_claim(other).0;
        if other != RECLAIMING {
            // A consumer that closed ended the stream (the producer got or gets Disconnected);
            // a live, unknown or unjudgeable one keeps its claim.
            if h.consumer_closed.load(Ordering::Acquire) != 0 {
                return Err(Error::ConsumerClosed(pid));
            }
            if !judge(other, ident).is_ok_and(|w| w.is_dead()) {
                return Err(Error::Busy(pid));
            }
            // SYNC POINT (AcqRel CAS from the dead consumer's exact word): one winner among
            // racing openers and the producer's reclaim (which swaps the same word for
            // RECLAIMING first). The dead process made no store after its death, which the
            // kernel reported; the attach then loads the ring's head with Acquire.
            if h.consumer
                .compare_exchange(other, mine, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok(Claimed::TakenOver);
            }
        }
        // The producer is reclaiming, or the word changed under us: look again, briefly.
        if Instant::now() >= deadline {
            return Err(Error::Busy(pid));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Proof that the consumer a claim word named is dead and that no consumer can attach while
/// this lives: the producer's licence to take back everything that consumer held (every
/// block in flight: `BlockPool::reclaim_all`; the unread records: [`DeadConsumer::reset_ring`]).
///
/// Made only by [`DeadConsumer::take`], which judges the word dead itself (definite evidence,
/// as [`judge`]) and swaps it for [`RECLAIMING`], which only the holder of this value
/// replaces: openers wait while they see it. Dropping it releases the claim (the word becomes
/// 0), so a new consumer may attach.
#[derive(Debug)]
pub(crate) struct DeadConsumer<'a> {
    seg: &'a Segment,
    pid: u32,
}

impl<'a> DeadConsumer<'a> {
    /// Takes the claim `word` (a private copy of the channel's claim) of the channel in `seg`
    /// (whose file is `ident`) from its consumer if that one is dead: `None` if it is not
    /// (or cannot be judged), or if the word changed meanwhile (a new consumer took the dead
    /// one's claim over first: it reads on from where the dead one stopped).
    pub(crate) fn take(seg: &'a Segment, word: u64, ident: (u64, u64)) -> Option<Self> {
        if word == RECLAIMING || !judge(word, ident).is_ok_and(|w| w.is_dead()) {
            return None;
        }
        // SYNC POINT (SeqCst CAS from the dead consumer's exact word): one winner between this
        // reclaim and openers taking the claim over (`claim`). While the word is RECLAIMING
        // no opener attaches.
        channel_header(seg)
            .consumer
            .compare_exchange(word, RECLAIMING, Ordering::SeqCst, Ordering::Relaxed)
            .ok()?;
        Some(DeadConsumer {
            seg,
            pid: consumer_claim(word).0,
        })
    }

    /// The dead consumer's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether this is the claim of the channel in `seg`.
    pub(crate) fn is_of(&self, seg: &Segment) -> bool {
        std::ptr::eq(self.seg, seg)
    }

    /// Empties the descriptor ring `desc` of this channel: publishes the producer's staged
    /// records, then discards everything not yet consumed (the dead consumer's `head` jumps
    /// to our `tail`).
    ///
    /// # Panics
    /// If `desc` is not a ring of this channel.
    pub(crate) fn reset_ring(&self, desc: &mut ring::Producer<ShmRing>) {
        assert!(
            self.is_of(desc.storage().segment()),
            "a dead consumer's claim resets its own channel's ring"
        );
        // SAFETY: the consumer of this channel is dead (judged on definite evidence in
        // `take`) and no new one attaches before `self` is dropped (the word is RECLAIMING,
        // which only we replace): nobody reads the ring any more. A hostile process that
        // still maps the segment may write the ring's words, which the ring validates.
        unsafe { desc.reset_consumer() };
    }
}

impl Drop for DeadConsumer<'_> {
    fn drop(&mut self) {
        // SYNC POINT (SeqCst): publishes the emptied ring (head = tail) and the reclaimed
        // pool before an opener's claiming CAS from 0 (Acquire) attaches at that head.
        let _ = channel_header(self.seg).consumer.compare_exchange(
            RECLAIMING,
            0,
            Ordering::SeqCst,
            Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment with room for a channel header (all zero: no consumer).
    fn segment() -> Segment {
        Segment::anonymous(4096).expect("anonymous segment")
    }

    #[test]
    fn only_a_dead_consumers_claim_is_taken_and_dropping_it_frees_the_claim() {
        let seg = segment();
        let h = channel_header(&seg);
        // A live process (our parent, with its start time): not taken, the word unchanged.
        let parent = std::os::unix::process::parent_id();
        let start = sys::process_start_time(parent).expect("our parent is visible");
        let live = consumer_word(parent, start);
        h.consumer.store(live, Ordering::SeqCst);
        assert!(DeadConsumer::take(&seg, live, (0, 0)).is_none());
        assert_eq!(h.consumer.load(Ordering::SeqCst), live);
        // A process that exited (a reaped child): taken, the word is RECLAIMING until dropped.
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        child.wait().expect("wait");
        let dead = consumer_word(pid, 0);
        h.consumer.store(dead, Ordering::SeqCst);
        let gone = DeadConsumer::take(&seg, dead, (0, 0)).expect("a dead consumer");
        assert_eq!(gone.pid(), pid);
        assert!(gone.is_of(&seg) && !gone.is_of(&segment()));
        assert_eq!(h.consumer.load(Ordering::SeqCst), RECLAIMING);
        // Nobody else takes it meanwhile (RECLAIMING is never judged dead).
        assert!(DeadConsumer::take(&seg, RECLAIMING, (0, 0)).is_none());
        drop(gone);
        assert_eq!(h.consumer.load(Ordering::SeqCst), 0);
        // A word that changed meanwhile (a new consumer took over first): not taken.
        h.consumer.store(live, Ordering::SeqCst);
        assert!(DeadConsumer::take(&seg, dead, (0, 0)).is_none());
        assert_eq!(h.consumer.load(Ordering::SeqCst), live);
    }
}
