//! The generic wait loop of blocked calls: spin, then sleep on a futex word in slices, checking
//! the peer's liveness and the caller's deadline between slices.

use std::time::Instant;

use super::WaitConfig;
use crate::error::Error;
use crate::sync::AtomicU32;
use crate::sys;

/// Waits for `attempt` to return `Some`, spinning first, then sleeping on a futex word in
/// slices of at most `wait.liveness_check`, checking `alive` after every slice. With
/// `recheck_on_death` (the consumer side), a dead peer's last messages and clean close are
/// still delivered: `attempt` runs once more after `alive` fails.
pub(super) fn block_on<T>(
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
