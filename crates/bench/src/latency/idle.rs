//! What a blocked shm-ring receiver costs while nothing arrives: the receiving thread waits
//! in `Receiver::recv` (default `WaitConfig`: a short spin, then the futex, waking every
//! `liveness_check` to look at its producer) for a given time, then one message wakes it.
//! Its CPU time over that wait is read from the kernel: `/proc/thread-self/schedstat` (ns, the
//! waiting thread alone) and `/proc/self/stat` (utime + stime in clock ticks, the whole
//! process: coarse, 10 ms a tick).

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, Sender};

use crate::BoxError;

/// CPU time of an idle waiter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct IdleCpu {
    /// Wall-clock time the receiver was blocked, in seconds.
    pub wall_s: f64,
    /// CPU time of the waiting thread over that time, in ns (`schedstat`).
    pub cpu_ns: u64,
    /// utime + stime of the process over that time, in clock ticks (`stat`).
    pub ticks: u64,
}

impl IdleCpu {
    /// CPU time of the waiting thread as a percentage of one core.
    pub fn percent(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.cpu_ns as f64 / (self.wall_s * 1e9) * 100.0
        } else {
            f64::NAN
        }
    }
}

/// CPU time of the calling thread in ns (first field of `/proc/thread-self/schedstat`).
///
/// # Errors
/// The file cannot be read or parsed.
pub fn thread_cpu_ns() -> Result<u64, BoxError> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    Ok(s.split_whitespace()
        .next()
        .ok_or("empty schedstat")?
        .parse()?)
}

/// utime + stime of this process in clock ticks (fields 14 and 15 of `/proc/self/stat`).
///
/// # Errors
/// The file cannot be read or parsed.
pub fn process_ticks() -> Result<u64, BoxError> {
    let s = std::fs::read_to_string("/proc/self/stat")?;
    stat_ticks(&s)
}

/// utime + stime from the text of a `/proc/<pid>/stat` file.
///
/// # Errors
/// Text that is not a stat line.
pub fn stat_ticks(stat: &str) -> Result<u64, BoxError> {
    // The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    let rest = &stat[stat.rfind(')').ok_or("no ) in stat")? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 -> index 11, stime index 12.
    let utime: u64 = f.get(11).ok_or("short stat")?.parse()?;
    let stime: u64 = f.get(12).ok_or("short stat")?.parse()?;
    Ok(utime + stime)
}

/// Blocks a default-configured shm-ring receiver for `idle`, then wakes it with one message;
/// returns its CPU time over the wait.
///
/// # Errors
/// shm-ring or `/proc` errors.
pub fn measure(idle: Duration) -> Result<IdleCpu, BoxError> {
    let mut tx = Sender::<Message>::anonymous(&ChannelConfig::default())?;
    let mut rx = Receiver::<Message>::from_fd(tx.as_fd().try_clone_to_owned()?)?;
    let waker = std::thread::spawn(move || -> Result<(), shm_ring::Error> {
        std::thread::sleep(idle);
        tx.send(MessageBuilder::new().tag(1))?;
        // Keep the sender until the receiver has its message (dropping it closes the channel,
        // which would also end the wait).
        std::thread::sleep(Duration::from_millis(100));
        Ok(())
    });
    let (cpu0, ticks0, t0) = (thread_cpu_ns()?, process_ticks()?, Instant::now());
    let m = rx.recv()?;
    let (cpu1, ticks1, wall) = (thread_cpu_ns()?, process_ticks()?, t0.elapsed());
    waker.join().map_err(|_| "waker panicked")??;
    if m.tag() != 1 {
        return Err(format!("woken by message {}, expected 1", m.tag()).into());
    }
    Ok(IdleCpu {
        wall_s: wall.as_secs_f64(),
        cpu_ns: cpu1.saturating_sub(cpu0),
        ticks: ticks1.saturating_sub(ticks0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_found_after_the_command_name() {
        let line = "42 (a) b (c)) S 1 42 42 0 -1 4194304 100 0 0 0 7 3 0 0 20 0 1 0 5 0 0";
        assert_eq!(stat_ticks(line).unwrap(), 10);
        assert!(stat_ticks("garbage").is_err());
    }

    #[test]
    fn a_blocked_receiver_is_measured() {
        let c = measure(Duration::from_millis(200)).unwrap();
        assert!(c.wall_s >= 0.2, "{c:?}");
        // It did wake up now and then (liveness checks) and spun a little: some CPU, but far
        // from a whole core (a spinning waiter would be near 100%).
        assert!(c.percent() < 50.0, "{c:?}");
        assert!(thread_cpu_ns().unwrap() > 0);
    }
}
