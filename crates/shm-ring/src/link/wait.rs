//! The generic wait loop of blocked calls: spin while watching the peer's index word, then
//! sleep on that word with a futex in slices, checking the peer's liveness and the caller's
//! deadline between slices.
//!
//! # Why it is shaped like this
//! - **Spin phase.** A futex wake-up between two processes costs tens of microseconds on a VM;
//!   a spinning waiter answers in well under one. The spinner loads the peer's index word (one
//!   cache line it shares with nobody else) on *every* iteration, after one `PAUSE`, and runs
//!   the full `attempt` only when the word moved: the answer comes one cache-line transfer
//!   after the peer's store. (The first version ran `attempt` every 64 `PAUSE`s, ~1.6 us here,
//!   which dominated a ping-pong round trip.) The clock, and an `attempt` that also notices
//!   what does not move the word (a close flag, a returned loan), run every
//!   [`SPINS_PER_CHECK`] iterations only.
//! - **Sleep phase.** The waiter raises its flag, re-reads the word (the Dekker handshake in
//!   `ring.rs`), tries once more, then sleeps on the word for at most
//!   `WaitConfig::liveness_check`, so a dead peer is noticed within one slice. An idle waiter
//!   costs one wake-up per slice (~0.3% of a core at 50 ms).

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::sync::{AtomicU32, Ordering};
use crate::sys;

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

/// Spin iterations (one `PAUSE` and one load each, ~25-40 ns here) between two looks at the
/// clock and two unconditional attempts.
pub(crate) const SPINS_PER_CHECK: u32 = 128;

/// Waits for `attempt` to return `Some`: spins while watching the peer's index word (the
/// one `peer_word` returns: any change runs `attempt` at once), then sleeps on that word
/// (after `begin_wait` raised our waiting flag and read the value to sleep on) in slices of at
/// most `wait.liveness_check`, checking `alive` after every slice. With `recheck_on_death`
/// (the consumer side), a dead peer's last messages and clean close are still delivered:
/// `attempt` runs once more after `alive` fails.
///
/// Callers try their fast path first and come here only when it found nothing; this function
/// tries once more before spinning.
///
/// Every step is a function of the caller's `state` (its channel end), borrowed only for
/// that step: `attempt` and `alive` mutably, the others shared. The word is a reference
/// derived from `state`, so it is valid while it is used, by construction; it is taken again
/// after every attempt.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
pub(crate) fn block_on<S, T>(
    state: &mut S,
    recheck_on_death: bool,
    wait: &WaitConfig,
    deadline: Option<Instant>,
    mut attempt: impl FnMut(&mut S) -> Result<Option<T>, Error>,
    peer_word: impl for<'s> Fn(&'s S) -> &'s AtomicU32,
    begin_wait: impl Fn(&S) -> u32,
    end_wait: impl Fn(&S),
    alive: impl FnMut(&mut S) -> Result<(), Error>,
) -> Result<T, Error> {
    // The peer's word is read *before* the attempt: a store that lands after this load is
    // seen by the spinner below as movement. (Read after the attempt, a store landing between
    // the two was missed, and the answer waited for the next unconditional attempt,
    // SPINS_PER_CHECK spins later: ~3 us, the tail of a near-placement ping-pong.)
    // Relaxed: this only notices movement; `attempt` loads the index again with Acquire
    // before it reads anything the index publishes.
    let seen = peer_word(state).load(Ordering::Relaxed);
    if let Some(v) = attempt(state)? {
        return Ok(v);
    }
    if deadline.is_some_and(|d| Instant::now() >= d) {
        // A non-blocking call (or an expired deadline): no spinning, no sleeping.
        return Err(Error::Timeout);
    }
    if !wait.spin.is_zero() {
        let spin_until = spin_deadline(wait, deadline);
        if let Some(v) = spin_phase(state, seen, spin_until, &mut attempt, &peer_word)? {
            return Ok(v);
        }
    }
    sleep_phase(
        state,
        recheck_on_death,
        wait,
        deadline,
        attempt,
        peer_word,
        begin_wait,
        end_wait,
        alive,
    )
}

/// When the spin phase ends: `wait.spin` from now, or the caller's deadline if sooner.
#[inline(always)]
fn spin_deadline(wait: &WaitConfig, deadline: Option<Instant>) -> Instant {
    let mut spin_until = Instant::now() + wait.spin;
    if let Some(d) = deadline {
        spin_until = spin_until.min(d);
    }
    spin_until
}

/// The spin phase of [`block_on`]: watches the peer's word (last seen as `seen`), runs
/// `attempt` whenever it moved and unconditionally every [`SPINS_PER_CHECK`] spins, until
/// `spin_until`. `None`: nothing came, go to sleep.
#[inline(always)]
fn spin_phase<S, T>(
    state: &mut S,
    mut seen: u32,
    spin_until: Instant,
    attempt: &mut impl FnMut(&mut S) -> Result<Option<T>, Error>,
    peer_word: &impl for<'s> Fn(&'s S) -> &'s AtomicU32,
) -> Result<Option<T>, Error> {
    loop {
        for _ in 0..SPINS_PER_CHECK {
            crate::sync::spin_hint();
            // Relaxed: as in `block_on`, movement only.
            let now = peer_word(state).load(Ordering::Relaxed);
            if now != seen {
                seen = now;
                if let Some(v) = attempt(state)? {
                    return Ok(Some(v));
                }
            }
        }
        if let Some(v) = attempt(state)? {
            return Ok(Some(v));
        }
        if Instant::now() > spin_until {
            return Ok(None);
        }
    }
}

/// The sleep phase of [`block_on`] (the arguments are its own): raises our waiting flag,
/// tries once more, sleeps on the peer's word for one slice, tries again, then checks the
/// peer's liveness; until `attempt` answers, the deadline passes or the peer is dead.
///
/// Out of line and cold: it runs only after the spin phase found nothing, and each of its
/// rounds costs a futex call, far more than the call into it.
#[allow(clippy::too_many_arguments)]
#[cold]
#[inline(never)]
fn sleep_phase<S, T>(
    state: &mut S,
    recheck_on_death: bool,
    wait: &WaitConfig,
    deadline: Option<Instant>,
    mut attempt: impl FnMut(&mut S) -> Result<Option<T>, Error>,
    peer_word: impl for<'s> Fn(&'s S) -> &'s AtomicU32,
    begin_wait: impl Fn(&S) -> u32,
    end_wait: impl Fn(&S),
    mut alive: impl FnMut(&mut S) -> Result<(), Error>,
) -> Result<T, Error> {
    loop {
        let slice = next_slice(wait, deadline)?;
        let expected = begin_wait(state);
        let got = attempt(state);
        if !matches!(got, Ok(None)) {
            end_wait(state);
            return got.map(|v| v.expect("checked"));
        }
        sys::futex_wait(peer_word(state), expected, slice);
        end_wait(state);
        if let Some(v) = attempt(state)? {
            return Ok(v);
        }
        if let Err(dead) = alive(state) {
            return after_death(state, recheck_on_death, dead, &mut attempt);
        }
    }
}

/// How long the next sleep may last: one liveness-check slice, cut short by the deadline;
/// [`Error::Timeout`] once the deadline has passed.
fn next_slice(wait: &WaitConfig, deadline: Option<Instant>) -> Result<Duration, Error> {
    let now = Instant::now();
    let mut slice = wait.liveness_check;
    if let Some(d) = deadline {
        if now >= d {
            return Err(Error::Timeout);
        }
        slice = slice.min(d - now);
    }
    Ok(slice)
}

/// What a waiter whose peer is `dead` answers: that error, or (with `recheck_on_death`, the
/// consumer side) what one last `attempt` finds.
#[cold]
fn after_death<S, T>(
    state: &mut S,
    recheck_on_death: bool,
    dead: Error,
    attempt: &mut impl FnMut(&mut S) -> Result<Option<T>, Error>,
) -> Result<T, Error> {
    if !recheck_on_death {
        return Err(dead);
    }
    // The peer may have finished its work (last commit, clean close) and exited
    // between our attempt and the liveness check: look once more before blaming it.
    match attempt(state)? {
        Some(v) => Ok(v),
        None => Err(dead),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use super::*;

    /// What the test's closures see: the peer's word and two counters.
    struct Probe {
        word: AtomicU32,
        calls: u32,
        sleeps: Cell<u32>,
    }

    /// The peer stores to its word just after our first attempt looked (simulated by the
    /// attempt itself): the spinner must see that store as movement and look again while it
    /// spins. It used to read the word only after the attempt, took the new value as "seen",
    /// missed the store, and (with a spin budget this short) went to sleep for it.
    #[test]
    fn a_store_racing_the_first_attempt_is_seen_while_spinning() {
        let mut probe = Probe {
            word: AtomicU32::new(7),
            calls: 0,
            sleeps: Cell::new(0),
        };
        let wait = WaitConfig {
            spin: Duration::from_nanos(1),
            liveness_check: Duration::from_millis(20),
        };
        let got = block_on(
            &mut probe,
            true,
            &wait,
            None,
            |p| {
                p.calls += 1;
                match p.calls {
                    1 => {
                        p.word.store(8, Ordering::Relaxed); // the peer's publish
                        Ok(None)
                    }
                    // The look the movement triggers finds nothing new yet (e.g. the value
                    // is still being checked); the next unconditional one finds it.
                    2 => Ok(None),
                    n => Ok(Some(n)),
                }
            },
            |p| &p.word,
            |p| {
                p.sleeps.set(p.sleeps.get() + 1);
                p.word.load(Ordering::Relaxed)
            },
            |_| {},
            |_| Ok(()),
        );
        assert_eq!(got.unwrap(), 3);
        assert_eq!(
            probe.sleeps.get(),
            0,
            "the store was missed: the waiter went to sleep"
        );
    }
}
