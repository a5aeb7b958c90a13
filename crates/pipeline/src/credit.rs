//! Ordered mode: how far each emitter may run ahead of the consumer. Credit bounds the
//! reorder buffer both against a slow emitter (the others wait instead of filling the
//! consumer's memory) and against a hostile worker (an output of a record no emitter was
//! allowed to issue yet is refused as a corrupt worker's).
//!
//! The consumer grants each emitter its records `0..granted` (issue 16, review findings 1
//! and 5): an emitter waits before issuing a record it has no credit for, after flushing
//! what it holds (so every record before it can reach the consumer). The grant is what the
//! consumer itself decided, kept in its own memory, and it travels to an emitter process on
//! that emitter's control socket (`CREDIT`), which no other process can write to and which
//! cannot be reopened through `/proc/<pid>/fd` (the counters in a memfd that this replaces
//! could be: a worker of the same user rewrote them). In enqueue mode the parent's input
//! thread is emitter 0 and its [`Gate`] is raised in-process.
//!
//! The grant follows the consumer's release cursor: for emitter `e`, `released(e) + window`
//! records while the reorder buffer holds less than [`REORDER_BYTES`], else only
//! `released(e) + 1`, the next record the cursor may need from it. The window is the
//! builder's `reorder_window` capped so that `window` groups of every emitter fit in
//! [`REORDER_BYTES`] at the buffered groups' mean size. So the buffer holds at most about
//! `REORDER_BYTES` plus the outputs of the records granted before it filled up.
//!
//! Why it never deadlocks: the record the cursor waits for, `(k, e)`, is always granted (the
//! grant after every release covers `released(e) + 1`); every record of `e` before it was
//! delivered, so `e` sends it (its earlier records in its rings have been read); every node
//! between the emitters and the consumer reads all its inputs in rotation and the consumer
//! drains every input without holding back, so nothing downstream of `e` waits on anything but
//! the consumer, which takes everything. Tested with windows of 1 to 4 records, several
//! emitters (one slow), workers and stages: `ordered_bound::ordered_runs_under_back_pressure_do_not_deadlock`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use crate::handover::Kind;
use crate::supervisor::Shared;

/// Default of `PipelineBuilder::reorder_window`: records each emitter may run ahead of the
/// consumer's release cursor, at most.
pub const DEFAULT_REORDER_WINDOW: u64 = 4096;

/// Above this many bytes of buffered outputs the consumer grants emitters only the next
/// record its cursor may need.
pub const REORDER_BYTES: usize = 16 << 20;

/// Records an emitter may issue before its first grant (both sides know it from the plan).
pub(crate) fn initial(window: u64) -> u64 {
    window.clamp(1, 64)
}

/// An issuer's credit: it may issue its records `0..granted`. Raised by the grantor (an
/// emitter's watchdog thread, or the consumer for the parent's own input thread), waited on
/// by the one thread that issues.
#[derive(Debug)]
pub(crate) struct Gate {
    granted: AtomicU64,
    /// The issuing thread, once it has waited (woken by [`Gate::raise`]).
    waiter: OnceLock<Thread>,
}

impl Gate {
    pub(crate) fn new(granted: u64) -> Gate {
        Gate {
            granted: AtomicU64::new(granted),
            waiter: OnceLock::new(),
        }
    }

    /// The issuer may now issue its records `0..n` (a grant never shrinks).
    pub(crate) fn raise(&self, n: u64) {
        // SYNC POINT: nothing is published with the grant but the number itself; Relaxed
        // would do, Release/Acquire keeps the reasoning simple.
        self.granted.fetch_max(n, Ordering::Release);
        if let Some(t) = self.waiter.get() {
            t.unpark();
        }
    }

    /// Whether record `k` may be issued.
    pub(crate) fn allows(&self, k: u64) -> bool {
        // SYNC POINT: pairs with the Release of `raise`.
        k < self.granted.load(Ordering::Acquire)
    }

    /// Sleeps until a grant arrives or 10 ms pass (the caller checks [`Gate::allows`] and
    /// whatever else it must watch, then calls again).
    pub(crate) fn park(&self) {
        let _ = self.waiter.set(std::thread::current());
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

/// Where the consumer's grants go.
#[derive(Debug)]
pub(crate) enum Grantee {
    /// Enqueue mode: the parent's own input thread is emitter 0.
    Local(Arc<Gate>),
    /// Emitter processes, through their control sockets (emitter `e` is child `e`).
    Emitters(Arc<Shared>),
}

/// The consumer's side: what it has granted each emitter, and the sending of new grants.
#[derive(Debug)]
pub(crate) struct Credit {
    /// The builder's `reorder_window` (at least 1).
    window: u64,
    /// Records each emitter may issue; what it holds is never more than this.
    granted: Vec<u64>,
    to: Grantee,
}

impl Credit {
    pub(crate) fn new(emitters: usize, window: u64, to: Grantee) -> Credit {
        let window = window.max(1);
        Credit {
            window,
            granted: vec![initial(window); emitters],
            to,
        }
    }

    /// Records emitter `e` may have issued so far (0 for an emitter that does not exist).
    pub(crate) fn granted(&self, e: usize) -> u64 {
        self.granted.get(e).copied().unwrap_or(0)
    }

    /// After a release: emitter `e` has had `released(e)` records delivered, the buffer holds
    /// `bytes` bytes in `groups` groups, and released groups took `mean_group` bytes on
    /// average (0: none released yet). Grants what the rule of the module says.
    pub(crate) fn update(
        &mut self,
        released: impl Fn(usize) -> u64,
        groups: usize,
        bytes: usize,
        mean_group: usize,
    ) {
        let emitters = self.granted.len().max(1);
        // The larger of the two estimates of a group's size: those held, those released.
        let per_group = (bytes.checked_div(groups).unwrap_or(0)).max(mean_group) as u64;
        let window = if bytes >= REORDER_BYTES {
            1
        } else {
            match (REORDER_BYTES as u64 / emitters as u64).checked_div(per_group) {
                Some(fit) => fit.clamp(1, self.window),
                // Nothing known of the groups' size yet: what the emitters started with.
                None => initial(self.window),
            }
        };
        // Grant in steps of a quarter window: one message per many records.
        let step = (window / 4).max(1);
        for e in 0..self.granted.len() {
            let floor = released(e) + 1;
            let target = released(e) + window;
            let have = self.granted[e];
            if have < floor || target >= have + step {
                self.grant(e, target.max(floor));
            }
        }
    }

    /// Sets what each emitter was granted (tests of the reorder buffer).
    #[cfg(test)]
    pub(crate) fn set_granted(&mut self, granted: &[u64]) {
        self.granted = granted.to_vec();
    }

    /// Grants emitter `e` its records `0..n` (never less than it has).
    fn grant(&mut self, e: usize, n: u64) {
        if n <= self.granted[e] {
            return;
        }
        let sent = match &self.to {
            Grantee::Local(gate) => {
                gate.raise(n);
                true
            }
            Grantee::Emitters(shared) => {
                let kids = shared.children.lock().unwrap_or_else(|e| e.into_inner());
                // An emitter that has ended (or died: the supervisor reports it) takes no
                // more; a full socket (an emitter that does not read it) is tried again at
                // the next release. Either way its grant stays what it really holds.
                kids.get(e).is_some_and(|c| {
                    c.status.is_none() && c.ctrl.send_value(Kind::Credit, n).is_ok()
                })
            }
        };
        if sent {
            self.granted[e] = n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_wakes_its_waiter_and_never_shrinks() {
        let gate = Arc::new(Gate::new(2));
        assert!(gate.allows(1) && !gate.allows(2));
        let g = Arc::clone(&gate);
        let waiter = std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            while !g.allows(5) {
                g.park();
            }
            t0.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        gate.raise(6);
        gate.raise(3);
        assert!(waiter.join().unwrap() < Duration::from_secs(5));
        assert!(gate.allows(5) && !gate.allows(6));
    }

    /// The grant follows the cursor by a window, shrinks to the next record when the buffer
    /// is full, and the window shrinks with large groups.
    #[test]
    fn grants_follow_the_cursor_within_the_byte_bound() {
        let gate = Arc::new(Gate::new(initial(100)));
        let mut c = Credit::new(1, 100, Grantee::Local(Arc::clone(&gate)));
        assert_eq!(c.granted(0), 64);
        // Nothing known of the groups' size: no more than the initial window ahead.
        c.update(|_| 1, 0, 0, 0);
        assert_eq!(c.granted(0), 64);
        c.update(|_| 10, 0, 0, 300);
        assert_eq!((c.granted(0), gate.allows(109)), (110, true));
        // Within a step: no new grant.
        c.update(|_| 20, 0, 0, 300);
        assert_eq!(c.granted(0), 110);
        c.update(|_| 40, 0, 0, 300);
        assert_eq!(c.granted(0), 140);
        // A full buffer: only the next record, once the cursor has reached the grant.
        c.update(|_| 200, 5, REORDER_BYTES, 300);
        assert_eq!(c.granted(0), 201);
        c.update(|_| 202, 5, REORDER_BYTES, 300);
        assert_eq!(c.granted(0), 203);
        // Groups of 1 MiB (held, or released): 16 fit in the bound, so the window is 16.
        c.update(|_| 300, 2, 2 << 20, 300);
        assert_eq!(c.granted(0), 316);
        c.update(|_| 400, 0, 0, 1 << 20);
        assert_eq!(c.granted(0), 416);
        assert_eq!(c.granted(7), 0, "no such emitter");
    }
}
