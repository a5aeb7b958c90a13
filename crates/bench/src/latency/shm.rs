//! shm-ring peers: two channels (`<name>-ping` created by the pinger, `<name>-pong` by the
//! echoer), one self-describing message per direction: tag `seq`, one f32 array `x` of shape
//! `[16]`, copied in (`MessageBuilder::array_slice`) and read in place
//! (`Receiver::recv_batch` of one).
//! `shm-spin` waits with the default `WaitConfig` (spin, then sleep), `shm-sleep` with a spin
//! budget of 0 (sleep on the futex at once), on both the receiving and the sending side.
//!
//! The typed peers (`shm-typed-spin`, `shm-typed-sleep`) do the same over typed channels of
//! `[f32; 16]` (`Sender<[f32; 16]>::send`, `Receiver<[f32; 16]>::recv`): one slot per message, no
//! message description.

use std::time::Duration;

use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, Sender, Transfer, WaitConfig};

use super::peer::{ELEMENTS, Peer, PingPong, Side, check_message};
use crate::BoxError;
use crate::kernel;

/// Name of the array in every message.
const ARRAY: &str = "x";

/// The wait configuration of `peer`.
pub fn wait_config(peer: Peer) -> WaitConfig {
    match peer {
        Peer::ShmSleep | Peer::ShmTypedSleep => WaitConfig {
            spin: Duration::ZERO,
            ..WaitConfig::default()
        },
        _ => WaitConfig::default(),
    }
}

/// The channel configuration of `peer`: the default one (inline messages, the message is
/// 64 bytes of data), copying, with `peer`'s wait configuration.
pub fn channel_config(peer: Peer) -> ChannelConfig {
    ChannelConfig {
        transfer: Transfer::Copy,
        wait: wait_config(peer),
        ..ChannelConfig::default()
    }
}

/// One end of an shm-ring peer.
#[derive(Debug)]
pub struct Shm {
    tx: Sender,
    rx: Receiver,
    buf: [f32; ELEMENTS],
}

impl Shm {
    /// Creates this side's outgoing channel and opens the other side's (waiting at most
    /// `patience` for it).
    ///
    /// # Errors
    /// shm-ring errors; no other side within `patience`.
    pub fn connect(
        peer: Peer,
        name: &str,
        side: Side,
        patience: Duration,
    ) -> Result<Shm, BoxError> {
        let (mine, theirs) = match side {
            Side::Ping => ("ping", "pong"),
            _ => ("pong", "ping"),
        };
        let tx = Sender::<Message>::create(&format!("{name}-{mine}"), &channel_config(peer))?;
        let mut rx = Receiver::<Message>::open_timeout(&format!("{name}-{theirs}"), patience)?;
        rx.set_wait(wait_config(peer));
        Ok(Shm {
            tx,
            rx,
            buf: [0.0; ELEMENTS],
        })
    }

    fn send(&mut self, seq: u64) -> Result<(), BoxError> {
        let msg =
            MessageBuilder::new()
                .tag(seq as u32)
                .array_slice(ARRAY, &[ELEMENTS], &self.buf)?;
        self.tx.send(msg)?;
        Ok(())
    }

    fn recv(&mut self, seq: u64) -> Result<(), BoxError> {
        let buf = &mut self.buf;
        let mut result: Result<(), BoxError> = Err("no message".into());
        // One message read in place and released (`recv_batch` of one).
        self.rx.recv_batch(1, None, |m| {
            result = (|| {
                if m.tag() != seq as u32 {
                    return Err(format!("message tagged {}, expected {seq}", m.tag()).into());
                }
                let x = m.record(0)?.array::<f32>(ARRAY)?;
                let xs = x.as_slice().ok_or("array not contiguous")?;
                check_message(xs, seq)?;
                buf.copy_from_slice(xs);
                Ok(())
            })();
        })?;
        result
    }
}

impl PingPong for Shm {
    fn round_trip(&mut self, seq: u64) -> Result<(), BoxError> {
        kernel::fill(&mut self.buf, seq);
        self.send(seq)?;
        self.recv(seq)
    }

    fn echo(&mut self, seq: u64) -> Result<(), BoxError> {
        self.recv(seq)?;
        self.send(seq)
    }
}

/// One end of a typed shm-ring peer.
#[derive(Debug)]
pub struct Typed {
    tx: Sender<[f32; ELEMENTS]>,
    rx: Receiver<[f32; ELEMENTS]>,
    buf: [f32; ELEMENTS],
}

impl Typed {
    /// As [`Shm::connect`], over typed channels of `[f32; 16]`.
    ///
    /// # Errors
    /// shm-ring errors; no other side within `patience`.
    pub fn connect(
        peer: Peer,
        name: &str,
        side: Side,
        patience: Duration,
    ) -> Result<Typed, BoxError> {
        let (mine, theirs) = match side {
            Side::Ping => ("ping", "pong"),
            _ => ("pong", "ping"),
        };
        let tx = Sender::create(&format!("{name}-{mine}"), &channel_config(peer))?;
        let mut rx = Receiver::open_timeout(&format!("{name}-{theirs}"), patience)?;
        rx.set_wait(wait_config(peer));
        Ok(Typed {
            tx,
            rx,
            buf: [0.0; ELEMENTS],
        })
    }

    fn recv(&mut self, seq: u64) -> Result<(), BoxError> {
        let buf = &mut self.buf;
        let xs = self.rx.recv()?;
        check_message(&xs, seq)?;
        *buf = xs;
        Ok(())
    }
}

impl PingPong for Typed {
    fn round_trip(&mut self, seq: u64) -> Result<(), BoxError> {
        kernel::fill(&mut self.buf, seq);
        self.tx.send(&self.buf)?;
        self.recv(seq)
    }

    fn echo(&mut self, seq: u64) -> Result<(), BoxError> {
        self.recv(seq)?;
        self.tx.send(&self.buf)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_waits_pass_checked_messages_between_threads() {
        for peer in [Peer::ShmSpin, Peer::ShmSleep] {
            let name = format!("bench-unit-lat-{}-{}", std::process::id(), peer.name());
            let echoer = {
                let name = name.clone();
                std::thread::spawn(move || {
                    let mut e = Shm::connect(peer, &name, Side::Echo, Duration::from_secs(10))?;
                    super::super::echo(&mut e, 30)
                })
            };
            let mut p = Shm::connect(peer, &name, Side::Ping, Duration::from_secs(10)).unwrap();
            let s = super::super::ping(&mut p, 10, 20).unwrap();
            drop(p);
            echoer.join().unwrap().unwrap();
            assert_eq!(s.ns.len(), 20);
            assert_no_segments(&name);
        }
    }

    /// Neither channel's socket is left, and nothing of them ever was in `/dev/shm`.
    fn assert_no_segments(name: &str) {
        let dir = shm_ring::Rendezvous::default().socket_dir();
        for side in ["ping", "pong"] {
            let path = dir.join(format!("{name}-{side}"));
            assert!(!path.exists(), "{} left behind", path.display());
            let shm = std::path::Path::new("/dev/shm").join(format!("shmpipe-{name}-{side}"));
            assert!(!shm.exists(), "{} made", shm.display());
        }
    }

    #[test]
    fn typed_peers_pass_checked_messages_between_threads() {
        for peer in [Peer::ShmTypedSpin, Peer::ShmTypedSleep] {
            let name = format!("bench-unit-lat-{}-{}", std::process::id(), peer.name());
            let echoer = {
                let name = name.clone();
                std::thread::spawn(move || {
                    let mut e = Typed::connect(peer, &name, Side::Echo, Duration::from_secs(10))?;
                    super::super::echo(&mut e, 30)
                })
            };
            let mut p = Typed::connect(peer, &name, Side::Ping, Duration::from_secs(10)).unwrap();
            let s = super::super::ping(&mut p, 10, 20).unwrap();
            drop(p);
            echoer.join().unwrap().unwrap();
            assert_eq!(s.ns.len(), 20);
            assert_no_segments(&name);
        }
    }

    #[test]
    fn a_typed_echo_of_the_wrong_message_is_caught() {
        let name = format!("bench-unit-lat-{}-typed-bad", std::process::id());
        let echoer = {
            let name = name.clone();
            std::thread::spawn(move || -> Result<(), BoxError> {
                let mut e = Typed::connect(
                    Peer::ShmTypedSpin,
                    &name,
                    Side::Echo,
                    Duration::from_secs(10),
                )?;
                e.recv(0)?;
                kernel::fill(&mut e.buf, 1);
                e.tx.send(&e.buf)?;
                Ok(())
            })
        };
        let mut p = Typed::connect(
            Peer::ShmTypedSpin,
            &name,
            Side::Ping,
            Duration::from_secs(10),
        )
        .unwrap();
        let err = p.round_trip(0).unwrap_err();
        assert!(err.to_string().contains("not moved intact"), "{err}");
        echoer.join().unwrap().unwrap();
    }
}
