//! Every OS call of the harness that `std` does not wrap: CPU pinning and parent-death signals.

use std::io;

/// Pins the calling thread to CPU `core`.
///
/// # Errors
/// The OS error, e.g. when `core` is not in the process's allowed set.
pub fn pin_to_core(core: usize) -> io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(core);
    rustix::thread::sched_setaffinity(None, &set).map_err(io::Error::from)
}

/// CPUs this process may run on, in increasing order (at least one entry).
pub fn allowed_cores() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => {
            let cores: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
                .filter(|&c| set.is_set(c))
                .collect();
            if cores.is_empty() { vec![0] } else { cores }
        }
        Err(_) => vec![0],
    }
}

/// The two CPUs a producer and a consumer are pinned to: the first two allowed ones (the same
/// one twice on a single-CPU machine).
pub fn core_pair() -> (usize, usize) {
    let cores = allowed_cores();
    (cores[0], cores[1 % cores.len()])
}

/// The 1-minute load average from `/proc/loadavg` (NaN if unreadable): other work on the
/// machine shows up here and in the ping-pong probe.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// CPU the calling thread runs on now.
pub fn current_core() -> usize {
    rustix::thread::sched_getcpu()
}

/// Asks the kernel to SIGKILL this process when its parent exits, so a worker never outlives
/// an interrupted harness.
///
/// # Errors
/// The OS error from `prctl`.
pub fn die_with_parent() -> io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_moves_the_thread() {
        let (a, b) = core_pair();
        std::thread::spawn(move || {
            for core in [a, b] {
                pin_to_core(core).unwrap();
                assert_eq!(current_core(), core);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn load_average_is_read() {
        let l = load_average();
        assert!(l.is_finite() && l >= 0.0, "{l}");
    }

    #[test]
    fn pinning_to_a_missing_core_fails() {
        let missing = rustix::thread::CpuSet::MAX_CPU - 1;
        assert!(!allowed_cores().contains(&missing));
        std::thread::spawn(move || assert!(pin_to_core(missing).is_err()))
            .join()
            .unwrap();
    }
}
