//! The worker processes: the harness re-executes itself with the hidden `worker` subcommand as
//! a producer, a consumer or a solo measurement. A consumer (or solo worker) prints its
//! [`Outcome`] as one JSON line on stdout.

use std::io::Write;
use std::os::fd::AsFd;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::BoxError;
use crate::kernel;
use crate::meter::{Deadline, Meter, Outcome, stride_for};
use crate::sys;
use crate::transport::{Layout, Transport};
use crate::transports::{channel, stream};

/// Role of a worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Sends messages until the time is up, then closes.
    Producer,
    /// Receives, sums and checks every message; prints the outcome.
    Consumer,
    /// Runs a single-process transport (memcpy, channel); prints the outcome.
    Solo,
}

/// Arguments of the hidden `worker` subcommand.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Which side this process plays.
    #[arg(long, value_enum)]
    pub role: Role,
    /// Transport under test.
    #[arg(long, value_enum)]
    pub transport: Transport,
    /// f32 elements per message.
    #[arg(long)]
    pub elements: usize,
    /// Measured time in milliseconds (after the warm-up).
    #[arg(long)]
    pub duration_ms: u64,
    /// Warm-up in milliseconds (not measured).
    #[arg(long)]
    pub warmup_ms: u64,
    /// Rendezvous name (segment, socket or service name).
    #[arg(long)]
    pub name: String,
    /// CPU this process (or its producer thread) is pinned to.
    #[arg(long)]
    pub core: usize,
    /// CPU of the consumer thread of a solo two-thread transport.
    #[arg(long)]
    pub peer_core: usize,
    /// Pid of the producer (given to the consumer: its CPU waits count against the window).
    #[arg(long)]
    pub peer_pid: Option<u32>,
}

/// Extra time a worker allows itself beyond its run before it gives up and exits (status 3),
/// so that no worker can outlive a stuck measurement.
pub const WATCHDOG_SLACK: Duration = Duration::from_secs(20);

/// How long a producer waits for its consumer to show up.
pub const RENDEZVOUS: Duration = Duration::from_secs(10);

/// Runs one worker and prints its outcome (consumer and solo roles).
///
/// # Errors
/// Anything that stops the measurement: OS errors, a transport error, data that fails the check.
pub fn run(a: &WorkerArgs) -> Result<(), BoxError> {
    let _ = sys::die_with_parent();
    let warmup = Duration::from_millis(a.warmup_ms);
    let run = Duration::from_millis(a.warmup_ms + a.duration_ms);
    start_watchdog(run + WATCHDOG_SLACK);
    // A solo memcpy runs on one CPU: only that one's steal counts.
    let cores = if a.transport == Transport::Memcpy {
        (a.core, a.core)
    } else {
        (a.core, a.peer_core)
    };
    crate::contention::set_context(a.peer_pid, cores);
    let outcome = match (a.role, a.transport.layout()) {
        (Role::Solo, Layout::Solo) => Some(solo(a, warmup, run)?),
        (Role::Producer, Layout::Pair) => {
            sys::pin_to_core(a.core)?;
            produce(a, run)?;
            None
        }
        (Role::Consumer, Layout::Pair) => {
            sys::pin_to_core(a.core)?;
            Some(consume(a, warmup)?)
        }
        (role, _) => return Err(format!("{} has no {role:?} role", a.transport).into()),
    };
    if let Some(o) = outcome {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, &o)?;
        writeln!(out)?;
        out.flush()?;
    }
    Ok(())
}

/// Exits the process (status 3) after `limit`: no worker outlives a stuck measurement.
pub fn start_watchdog(limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("shmpipe-bench worker: no end after {limit:?}, giving up");
        std::process::exit(3);
    });
}

fn solo(a: &WorkerArgs, warmup: Duration, run: Duration) -> Result<Outcome, BoxError> {
    match a.transport {
        Transport::Memcpy => {
            sys::pin_to_core(a.core)?;
            Ok(memcpy(a.elements, warmup, run))
        }
        Transport::Channel => channel::run(a.elements, warmup, run - warmup, (a.core, a.peer_core)),
        t => Err(format!("{t} is not a single-process transport").into()),
    }
}

/// Single-thread `memcpy` of `elements` floats between two buffers, repeated for `run`.
pub fn memcpy(elements: usize, warmup: Duration, run: Duration) -> Outcome {
    let src = vec![1f32; elements];
    let mut dst = vec![0f32; elements];
    let mut meter = Meter::new(warmup, stride_for(elements));
    let mut deadline = Deadline::new(run, stride_for(elements));
    while deadline.keep_going() {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        meter.record(0.0);
    }
    let mut o = meter.finish();
    o.checksum = kernel::sum_f32(&dst);
    o
}

fn produce(a: &WorkerArgs, run: Duration) -> Result<(), BoxError> {
    match a.transport {
        Transport::Pipe => {
            // stdout is the pipe into the consumer's stdin.
            let mut pipe = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
            stream::produce(&mut pipe, a.elements, run)?;
        }
        Transport::UnixSocket => {
            let mut s = stream::socket_connect(&a.name, RENDEZVOUS)?;
            stream::produce(&mut s, a.elements, run)?;
        }
        t => return produce_more(t, a, run),
    }
    Ok(())
}

fn consume(a: &WorkerArgs, warmup: Duration) -> Result<Outcome, BoxError> {
    match a.transport {
        Transport::Pipe => {
            let pipe = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
            stream::consume(pipe, a.elements, warmup)
        }
        Transport::UnixSocket => {
            stream::consume(stream::socket_accept(&a.name)?, a.elements, warmup)
        }
        t => consume_more(t, a, warmup),
    }
}

fn produce_more(t: Transport, a: &WorkerArgs, run: Duration) -> Result<(), BoxError> {
    match t {
        Transport::RingMin => crate::transports::ring::produce(
            &crate::sys::stdin_file()?,
            a.elements,
            run,
            RENDEZVOUS,
        ),
        Transport::ShmZeroCopy | Transport::ShmCopy | Transport::ShmAdaptive => {
            crate::transports::shm::produce(t, &a.name, a.elements, run)
        }
        Transport::ShmTyped => crate::transports::typed::produce(&a.name, a.elements, run),
        #[cfg(feature = "iceoryx2")]
        Transport::Iceoryx2 => {
            crate::transports::iox::produce(&a.name, a.elements, run, RENDEZVOUS)
        }
        _ => {
            let _ = (a, run);
            Err(format!("{t} is not available in this build").into())
        }
    }
}

fn consume_more(t: Transport, a: &WorkerArgs, warmup: Duration) -> Result<Outcome, BoxError> {
    match t {
        Transport::RingMin => crate::transports::ring::consume(
            &crate::sys::stdin_file()?,
            a.elements,
            warmup,
            RENDEZVOUS,
        ),
        Transport::ShmZeroCopy | Transport::ShmCopy | Transport::ShmAdaptive => {
            crate::transports::shm::consume(&a.name, a.elements, warmup, RENDEZVOUS)
        }
        Transport::ShmTyped => {
            crate::transports::typed::consume(&a.name, a.elements, warmup, RENDEZVOUS)
        }
        #[cfg(feature = "iceoryx2")]
        Transport::Iceoryx2 => {
            crate::transports::iox::consume(&a.name, a.elements, warmup, RENDEZVOUS)
        }
        _ => {
            let _ = (a, warmup);
            Err(format!("{t} is not available in this build").into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcpy_copies_and_counts() {
        let o = memcpy(1000, Duration::ZERO, Duration::from_millis(10));
        assert!(o.messages > 0 && o.seconds > 0.0);
        assert_eq!(o.checksum, 1000.0, "destination holds the source");
    }
}
