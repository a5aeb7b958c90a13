//! The `latency` subcommand: a two-process ping-pong of one 16-float message, round-trip
//! percentiles per peer, peers interleaved over rounds in one run.
//!
//! Two processes pinned to two CPUs (the pinger on the first, the echoer on the second) pass
//! one message back and forth. The pinger writes message `seq` (every element
//! [`kernel::value_for`](crate::kernel::value_for)`(seq)`), the echoer reads and checks every element and sends the same
//! 16 floats back, the pinger reads and checks them: a round trip. The pinger reads the clock
//! once per round trip (the difference between two reads is one sample, clock read included,
//! the same for every peer) and prints its samples as one JSON line.
//!
//! The peers ([`Peer`]) range from the floor (one bare cache line bounced between the two
//! cores) through raw futex-word protocols to shm-ring and iceoryx2; [`harness`] runs them
//! and [`idle`] measures what a blocked shm-ring receiver costs while nothing arrives.

pub mod harness;
pub mod idle;
#[cfg(feature = "iceoryx2")]
pub mod iox;
mod peer;
pub mod raw;
pub mod shm;

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use peer::{ELEMENTS, Peer, PingPong, SPINS_PER_YIELD, Side, check_message};

use crate::BoxError;
use crate::parse::parse_duration_or_zero;
use crate::sys;

/// How long one side waits for the other to show up.
pub const RENDEZVOUS: Duration = Duration::from_secs(10);

/// What a pinger measured: one round-trip time per measured trip, in nanoseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Samples {
    /// Round-trip times in ns, in trip order (clock read included).
    pub ns: Vec<u32>,
}

/// Runs `warmup` unmeasured round trips, then `trips` measured ones.
///
/// # Errors
/// The first failed round trip.
pub fn ping<P: PingPong>(p: &mut P, warmup: u64, trips: u64) -> Result<Samples, BoxError> {
    for seq in 0..warmup {
        p.round_trip(seq)?;
    }
    let mut ns = Vec::with_capacity(trips as usize);
    let mut last = Instant::now();
    for seq in warmup..warmup + trips {
        p.round_trip(seq)?;
        let now = Instant::now();
        ns.push(u32::try_from((now - last).as_nanos()).unwrap_or(u32::MAX));
        last = now;
    }
    Ok(Samples { ns })
}

/// Answers `total` messages.
///
/// # Errors
/// The first failed echo.
pub fn echo<P: PingPong>(p: &mut P, total: u64) -> Result<(), BoxError> {
    for seq in 0..total {
        p.echo(seq)?;
    }
    Ok(())
}

/// `latency` options.
#[derive(Debug, Clone, clap::Args)]
pub struct LatencyArgs {
    /// Measured round trips per peer, split evenly over the rounds.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub trips: u64,
    /// Interleaved rounds (fresh processes per peer and round, peers rotated each round).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Unmeasured round trips at the start of each peer's round.
    #[arg(long, default_value_t = 1_000)]
    pub warmup: u64,
    /// Peers, comma-separated (default: every one this binary was built with).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub peers: Vec<Peer>,
    /// How long the idle shm-ring receiver stays blocked (`0` skips it).
    #[arg(long, default_value = "2s", value_parser = parse_duration_or_zero)]
    pub idle: Duration,
    /// Write one row per peer (percentiles) to this CSV file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Do not print a line per round.
    #[arg(long)]
    pub no_progress: bool,
}

/// Arguments of one latency worker process (the hidden `latency-worker` subcommand).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Peer under test.
    #[arg(long, value_enum)]
    pub peer: Peer,
    /// Which side this process plays.
    #[arg(long, value_enum)]
    pub side: Side,
    /// Measured round trips.
    #[arg(long)]
    pub trips: u64,
    /// Unmeasured round trips before them.
    #[arg(long)]
    pub warmup: u64,
    /// Idle side: how long to stay blocked, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub idle_ms: u64,
    /// Rendezvous name.
    #[arg(long)]
    pub name: String,
    /// CPU this process is pinned to.
    #[arg(long)]
    pub core: usize,
}

/// Runs one latency worker; the pinger and the idle side print their result as one JSON line.
///
/// # Errors
/// Anything that stops the measurement.
pub fn run_worker(a: &WorkerArgs) -> Result<(), BoxError> {
    let _ = sys::die_with_parent();
    // Generous: the slowest peer (a futex sleep on a loaded VM) takes ~100 us per round trip.
    let limit = Duration::from_secs(30)
        + Duration::from_micros(200) * u32::try_from(a.trips + a.warmup).unwrap_or(u32::MAX)
        + Duration::from_millis(a.idle_ms);
    crate::worker::start_watchdog(limit);
    sys::pin_to_core(a.core)?;
    let samples = match a.side {
        Side::Idle => {
            let cpu = idle::measure(Duration::from_millis(a.idle_ms))?;
            return print_line(&serde_json::to_string(&cpu)?);
        }
        Side::Ping | Side::Echo => match a.peer {
            Peer::CacheLine | Peer::FutexSpin | Peer::FutexSleep => {
                let file = sys::stdin_file()?;
                side(raw::Raw::connect(a.peer, &file, a.side, RENDEZVOUS)?, a)?
            }
            Peer::ShmSpin | Peer::ShmSleep => {
                side(shm::Shm::connect(a.peer, &a.name, a.side, RENDEZVOUS)?, a)?
            }
            Peer::ShmTypedSpin | Peer::ShmTypedSleep => {
                side(shm::Typed::connect(a.peer, &a.name, a.side, RENDEZVOUS)?, a)?
            }
            #[cfg(feature = "iceoryx2")]
            Peer::Iceoryx2Poll | Peer::Iceoryx2Event => {
                side(iox::Iox::connect(a.peer, &a.name, a.side, RENDEZVOUS)?, a)?
            }
            #[cfg(not(feature = "iceoryx2"))]
            p => {
                return Err(format!(
                    "{p} is not in this build: rebuild with `--features iceoryx2`"
                )
                .into());
            }
        },
    };
    match samples {
        Some(s) => print_line(&serde_json::to_string(&s)?),
        None => Ok(()),
    }
}

/// Plays `a.side` on peer end `p` (monomorphised per peer: no indirect call in the loop).
fn side<P: PingPong>(mut p: P, a: &WorkerArgs) -> Result<Option<Samples>, BoxError> {
    if a.side == Side::Ping {
        Ok(Some(ping(&mut p, a.warmup, a.trips)?))
    } else {
        echo(&mut p, a.warmup + a.trips)?;
        Ok(None)
    }
}

fn print_line(line: &str) -> Result<(), BoxError> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel;
    use clap::ValueEnum;

    #[test]
    fn names_match_the_command_line() {
        for p in Peer::ALL {
            assert_eq!(p.to_possible_value().unwrap().get_name(), p.name());
        }
        assert_eq!(
            Peer::built().contains(&Peer::Iceoryx2Poll),
            cfg!(feature = "iceoryx2")
        );
    }

    /// A pretend peer that only counts: the loops call it once per trip, in order.
    struct Counter(Vec<u64>);

    impl PingPong for Counter {
        fn round_trip(&mut self, seq: u64) -> Result<(), BoxError> {
            self.0.push(seq);
            Ok(())
        }
        fn echo(&mut self, seq: u64) -> Result<(), BoxError> {
            if seq == 3 {
                return Err("broken".into());
            }
            self.0.push(seq);
            Ok(())
        }
    }

    #[test]
    fn ping_measures_only_after_the_warmup() {
        let mut c = Counter(Vec::new());
        let s = ping(&mut c, 2, 5).unwrap();
        assert_eq!(c.0, vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(s.ns.len(), 5);
        assert!(echo(&mut c, 10).unwrap_err().to_string().contains("broken"));
    }

    #[test]
    fn messages_are_checked() {
        let mut xs = [0f32; ELEMENTS];
        kernel::fill(&mut xs, 7);
        check_message(&xs, 7).unwrap();
        assert!(check_message(&xs, 8).is_err());
        assert!(check_message(&xs[..8], 7).is_err());
    }
}
