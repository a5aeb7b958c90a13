//! Cache-line ping-pong between two pinned threads: the core-to-core round trip that every
//! cross-process handoff pays at least once. On a VM it jumps when the hypervisor moves a vCPU
//! (see docs/bench.md for the figures measured here), so every run records it and labels its
//! results.

use std::hint::spin_loop;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::stats::Summary;
use crate::sys;

/// Round trips below this are "near" (both vCPUs close), above it "far".
pub const NEAR_LIMIT_NS: f64 = 150.0;

/// Where the two cores were when a probe ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// All probes below [`NEAR_LIMIT_NS`].
    Near,
    /// All probes at or above [`NEAR_LIMIT_NS`].
    Far,
    /// Some probes of each kind.
    Mixed,
}

impl Placement {
    /// Classifies a set of probe results (ns per round trip).
    pub fn classify(probes_ns: &[f64]) -> Placement {
        let near = probes_ns.iter().filter(|&&ns| ns < NEAR_LIMIT_NS).count();
        if near == probes_ns.len() {
            Placement::Near
        } else if near == 0 {
            Placement::Far
        } else {
            Placement::Mixed
        }
    }

    /// Lower-case label used in tables and CSV.
    pub fn label(self) -> &'static str {
        match self {
            Placement::Near => "near",
            Placement::Far => "far",
            Placement::Mixed => "mixed",
        }
    }
}

/// Measures the median nanoseconds per round trip of one cache line bounced between threads
/// pinned to `cores`, over `batches` batches of `trips` round trips.
///
/// # Panics
/// If a probe thread panics (pinning failures are ignored: the probe then measures wherever
/// the scheduler put the threads).
pub fn probe(cores: (usize, usize), batches: usize, trips: u64) -> Summary {
    // On a single CPU the peer only runs when we give the CPU up: yield instead of spinning.
    let same = cores.0 == cores.1;
    let pause = move || {
        if same {
            std::thread::yield_now();
        } else {
            spin_loop();
        }
    };
    let line = Arc::new(CachePadded::new(AtomicU64::new(0)));
    let echo = {
        let line = Arc::clone(&line);
        std::thread::spawn(move || {
            let _ = sys::pin_to_core(cores.1);
            let total = batches as u64 * trips;
            for i in 0..total {
                // Wait for the odd value 2i+1 from the prober, answer with 2i+2.
                while line.load(Ordering::Acquire) != 2 * i + 1 {
                    pause();
                }
                line.store(2 * i + 2, Ordering::Release);
            }
        })
    };
    let mut samples = Vec::with_capacity(batches);
    let prober = {
        let line = Arc::clone(&line);
        std::thread::spawn(move || {
            let _ = sys::pin_to_core(cores.0);
            let mut i = 0u64;
            for _ in 0..batches {
                let start = Instant::now();
                for _ in 0..trips {
                    line.store(2 * i + 1, Ordering::Release);
                    while line.load(Ordering::Acquire) != 2 * i + 2 {
                        pause();
                    }
                    i += 1;
                }
                samples.push(start.elapsed().as_nanos() as f64 / trips as f64);
            }
            samples
        })
    };
    let samples = prober.join().expect("ping-pong prober panicked");
    echo.join().expect("ping-pong echo panicked");
    Summary::of(&samples).expect("at least one batch")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_probes() {
        assert_eq!(Placement::classify(&[50.0, 60.0]), Placement::Near);
        assert_eq!(Placement::classify(&[450.0, 400.0]), Placement::Far);
        assert_eq!(Placement::classify(&[50.0, 450.0]), Placement::Mixed);
        assert_eq!(Placement::Mixed.label(), "mixed");
    }

    #[test]
    fn probe_on_a_single_core_finishes() {
        let (a, _) = sys::core_pair();
        let s = probe((a, a), 2, 200);
        assert_eq!(s.n, 2);
        assert!(s.min > 1.0, "{s:?}");
    }

    #[test]
    fn probe_measures_a_positive_round_trip() {
        let s = probe(sys::core_pair(), 3, 200);
        assert_eq!(s.n, 3);
        assert!(s.min <= s.median && s.median <= s.max);
        // A round trip is two cache-line transfers between threads: never below a nanosecond.
        // (No upper bound: other tests may share the two cores.)
        assert!(s.min > 1.0, "{s:?}");
    }
}
