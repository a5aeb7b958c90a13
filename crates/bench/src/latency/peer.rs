//! The peers and what every peer's end does: the message ([`ELEMENTS`] floats, checked by
//! [`check_message`]), the sides a worker plays and the [`PingPong`] trait each peer's end
//! implements (in `raw`, `shm` and `iox`).

use std::fmt;

use crate::BoxError;
use crate::kernel;

/// Floats in the ping-pong message.
pub const ELEMENTS: usize = 16;

/// Spins between two `yield_now` calls while a raw or iceoryx2 peer waits (the two cores may
/// be shared with other work: a waiter gives its core up now and then).
pub const SPINS_PER_YIELD: u32 = 1024;

/// One way of passing the message there and back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Peer {
    /// One bare cache line bounced between the two cores (a counter, no payload): the floor.
    CacheLine,
    /// A futex word per direction, spun on (no system call), and the 16 floats beside it.
    FutexSpin,
    /// As `futex-spin`, but both sides sleep in `FUTEX_WAIT` at once and every send wakes.
    FutexSleep,
    /// shm-ring's self-describing `Sender`/`Receiver`, default `WaitConfig` (spin, then sleep).
    ShmSpin,
    /// shm-ring's self-describing `Sender`/`Receiver` with a spin budget of 0 (sleep at once).
    ShmSleep,
    /// shm-ring's typed path, `Sender<[f32; 16]>`/`Receiver<[f32; 16]>`, default `WaitConfig`.
    ShmTypedSpin,
    /// shm-ring's typed path with a spin budget of 0.
    ShmTypedSleep,
    /// iceoryx2 publish-subscribe, the subscriber polling `receive()` (cargo feature `iceoryx2`).
    Iceoryx2Poll,
    /// iceoryx2 publish-subscribe plus an event service per direction: the receiver sleeps in
    /// the listener's `timed_wait` (cargo feature `iceoryx2`).
    Iceoryx2Event,
}

impl Peer {
    /// Every peer, in table order.
    pub const ALL: [Peer; 9] = [
        Peer::CacheLine,
        Peer::FutexSpin,
        Peer::FutexSleep,
        Peer::ShmSpin,
        Peer::ShmSleep,
        Peer::ShmTypedSpin,
        Peer::ShmTypedSleep,
        Peer::Iceoryx2Poll,
        Peer::Iceoryx2Event,
    ];

    /// Name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Peer::CacheLine => "cache-line",
            Peer::FutexSpin => "futex-spin",
            Peer::FutexSleep => "futex-sleep",
            Peer::ShmSpin => "shm-spin",
            Peer::ShmSleep => "shm-sleep",
            Peer::ShmTypedSpin => "shm-typed-spin",
            Peer::ShmTypedSleep => "shm-typed-sleep",
            Peer::Iceoryx2Poll => "iceoryx2-poll",
            Peer::Iceoryx2Event => "iceoryx2-event",
        }
    }

    /// What the peer is, in a few words (the table legend).
    pub fn describe(self) -> &'static str {
        match self {
            Peer::CacheLine => {
                "one bare cache line (a counter) bounced between the cores: the floor"
            }
            Peer::FutexSpin => {
                "raw futex word + 16 floats per direction, spinning on the word (no system call)"
            }
            Peer::FutexSleep => {
                "raw futex word + 16 floats per direction, FUTEX_WAIT at once, FUTEX_WAKE per send"
            }
            Peer::ShmSpin => {
                "shm-ring Sender/Receiver, self-describing message, default WaitConfig"
            }
            Peer::ShmSleep => "shm-ring Sender/Receiver, self-describing message, spin budget 0",
            Peer::ShmTypedSpin => "shm-ring Sender/Receiver<[f32; 16]>, default WaitConfig",
            Peer::ShmTypedSleep => "shm-ring Sender/Receiver<[f32; 16]>, spin budget 0",
            Peer::Iceoryx2Poll => "iceoryx2 publish-subscribe, [f32] slice, subscriber polling",
            Peer::Iceoryx2Event => {
                "iceoryx2 publish-subscribe + event service, listener timed_wait, then receive"
            }
        }
    }

    /// Whether this binary can run the peer (iceoryx2 needs the cargo feature).
    pub fn is_built(self) -> bool {
        !matches!(self, Peer::Iceoryx2Poll | Peer::Iceoryx2Event) || cfg!(feature = "iceoryx2")
    }

    /// Every peer this binary can run.
    pub fn built() -> Vec<Peer> {
        Peer::ALL.into_iter().filter(|p| p.is_built()).collect()
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// Which side of the ping-pong a worker process plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Side {
    /// Sends message `seq`, waits for it to come back, checks it, records the round trip.
    Ping,
    /// Waits for message `seq`, checks it, sends it back.
    Echo,
    /// Blocks in an shm-ring receive while nothing arrives and reports its own CPU time.
    Idle,
}

/// One peer's end of the ping-pong, after the rendezvous.
pub trait PingPong {
    /// Pinger: sends message `seq`, waits for the echo and checks every element of it.
    ///
    /// # Errors
    /// Transport errors; an echo that fails the check.
    fn round_trip(&mut self, seq: u64) -> Result<(), BoxError>;

    /// Echoer: waits for message `seq`, checks every element, sends the 16 floats back.
    ///
    /// # Errors
    /// As [`PingPong::round_trip`].
    fn echo(&mut self, seq: u64) -> Result<(), BoxError>;
}

/// Checks a received message `seq` of [`ELEMENTS`] floats.
///
/// # Errors
/// A message of the wrong length, or one whose elements are not the ones message `seq` holds.
pub fn check_message(xs: &[f32], seq: u64) -> Result<(), BoxError> {
    if xs.len() != ELEMENTS {
        return Err(format!("message of {} floats, expected {ELEMENTS}", xs.len()).into());
    }
    kernel::check(xs, seq)?;
    Ok(())
}
