//! How much of a measured window the workers did not have their CPUs: time a worker was
//! runnable but waited for its CPU (another process ran there: on this shared VM, other
//! builds) plus time the hypervisor took the vCPUs away (steal). A two-process transport that
//! spins needs both CPUs at once; when either worker waits, its peer spins for nothing and the
//! rate drops several-fold while a one-thread memcpy barely notices. Every cell records this
//! figure, so that results can be split into rounds with the CPUs to ourselves and the rest.
//!
//! Sources: `/proc/<pid>/schedstat` (second field: nanoseconds spent waiting on a run queue)
//! for this worker and its peer, and the `steal` column of the two CPUs in `/proc/stat`.

use std::sync::OnceLock;
use std::time::Instant;

/// Above this share of a window lost to waiting or steal, a cell counts as contended.
pub const CONTENDED: f64 = 0.02;

static PEER_PID: OnceLock<u32> = OnceLock::new();
static CORES: OnceLock<(usize, usize)> = OnceLock::new();

/// Tells the sampler the peer process (the producer, seen from the consumer) and the CPUs of
/// the measurement. Called once by a worker before it measures.
pub fn set_context(peer_pid: Option<u32>, cores: (usize, usize)) {
    if let Some(p) = peer_pid {
        let _ = PEER_PID.set(p);
    }
    let _ = CORES.set(cores);
}

/// Nanoseconds `task` (`thread-self` or a pid) has waited on a run queue, if readable.
fn run_delay_ns(task: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{task}/schedstat")).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// Steal time of CPUs `cores` in nanoseconds (from clock ticks of `/proc/stat`), if readable.
fn steal_ns(cores: (usize, usize)) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let mut total = 0u64;
    let wanted: &[usize] = if cores.0 == cores.1 {
        &[cores.0][..]
    } else {
        &[cores.0, cores.1][..]
    };
    for &c in wanted {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&format!("cpu{c}")))?;
        let ticks: u64 = line.split_whitespace().nth(8)?.parse().ok()?;
        total += ticks;
    }
    // USER_HZ is 100 on Linux x86-64: one tick is 10 ms.
    Some(total * 10_000_000)
}

/// One reading of the counters.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    at: Instant,
    waited_ns: u64,
}

impl Snapshot {
    /// Reads the counters now (our thread, the peer if known, steal of both CPUs).
    pub fn take() -> Snapshot {
        let mut waited = run_delay_ns("thread-self").unwrap_or(0);
        if let Some(p) = PEER_PID.get() {
            waited += run_delay_ns(&p.to_string()).unwrap_or(0);
        }
        if let Some(&c) = CORES.get() {
            waited += steal_ns(c).unwrap_or(0);
        }
        Snapshot {
            at: Instant::now(),
            waited_ns: waited,
        }
    }

    /// Share of the time since `self` that was lost to waiting or steal (0 = the CPUs were
    /// ours; can exceed 1 when both workers waited at once).
    pub fn share_since(&self) -> f64 {
        let now = Snapshot::take();
        let span = (now.at - self.at).as_nanos() as f64;
        if span <= 0.0 {
            return 0.0;
        }
        now.waited_ns.saturating_sub(self.waited_ns) as f64 / span
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_thread_has_a_run_delay_and_a_share_is_finite() {
        assert!(run_delay_ns("thread-self").is_some(), "no schedstat");
        let s = Snapshot::take();
        let mut x = 0u64;
        for i in 0..100_000u64 {
            x = x.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        let share = s.share_since();
        assert!(share.is_finite() && share >= 0.0, "{share}");
    }

    #[test]
    fn steal_of_cpu0_is_readable() {
        assert!(steal_ns((0, 0)).is_some());
    }
}
