//! The raw peers: the floor of a cross-process round trip, and the two futex-word protocols
//! that shm-ring's waiting is built from, with nothing else (no ring, no message format, no
//! validation of a hostile peer).
//!
//! One memory file (4 KiB, made by the harness and handed to both processes as their stdin:
//! nothing named, nothing in `/dev/shm`; laid out by the pinger):
//! ```text
//! 0    magic (u64, stored last by the pinger)     8  attached (u64, 1 once the echoer mapped it)
//! 64   ping word (cache-line: the one AtomicU64; futex peers: AtomicU32, seq + 1)
//! 128  pong word (AtomicU32, seq + 1)
//! 192  ping payload: 16 f32            256  pong payload: 16 f32
//! ```
//! - `cache-line`: the pinger stores `2 seq + 1` in the ping word and spins until it reads
//!   `2 seq + 2`, which the echoer stores when it sees `2 seq + 1`. No payload.
//! - `futex-spin`: the sender writes the 16 floats, then stores `seq + 1` in its word
//!   (Release); the receiver spins on the word (Acquire), then reads and checks the floats.
//!   Nobody ever sleeps, so no futex call is needed.
//! - `futex-sleep`: the same, but the receiver sleeps in `FUTEX_WAIT` on the word at once and
//!   every sender calls `FUTEX_WAKE` after its store.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::thread::futex;

use super::peer::{ELEMENTS, Peer, PingPong, SPINS_PER_YIELD, Side, check_message};
use crate::BoxError;
use crate::kernel;
use crate::sys::Mapping;

const MAGIC: u64 = u64::from_le_bytes(*b"BENCHLAT");
const LEN: usize = 4096;
const ATTACHED: usize = 8;
const PING: usize = 64;
const PONG: usize = 128;
const PING_DATA: usize = 192;
const PONG_DATA: usize = 256;
/// How long a sleeping side sleeps before it looks again (a lost wake-up costs this much
/// once; it never happens with the protocol above, but no wait is unbounded).
const SLEEP_SLICE: Duration = Duration::from_millis(100);

/// Bytes of the memory file both raw peers map.
pub const FILE_LEN: usize = LEN;

/// One end of a raw peer.
#[derive(Debug)]
pub struct Raw {
    map: Mapping,
    peer: Peer,
    /// Where this side sends (word, payload) and where it receives.
    out: (usize, usize),
    inp: (usize, usize),
    /// The message being passed, private to this side.
    buf: [f32; ELEMENTS],
}

impl Raw {
    /// Sets up the pinger's (lays the file out) or the echoer's end, over `file` (a fresh,
    /// zero-filled memory file of [`FILE_LEN`] bytes that the other side maps too).
    ///
    /// # Errors
    /// OS errors; no other side within `patience`.
    pub fn connect(
        peer: Peer,
        file: &std::fs::File,
        side: Side,
        patience: Duration,
    ) -> Result<Raw, BoxError> {
        let ping = side == Side::Ping;
        let start = Instant::now();
        let map = Mapping::of(file, LEN)?;
        let (out, inp) = if ping {
            ((PING, PING_DATA), (PONG, PONG_DATA))
        } else {
            ((PONG, PONG_DATA), (PING, PING_DATA))
        };
        let raw = Raw {
            map,
            peer,
            out,
            inp,
            buf: [0.0; ELEMENTS],
        };
        if ping {
            // SYNC POINT: the zeroed words (fresh object) are visible before MAGIC.
            raw.u64_at(0).store(MAGIC, Ordering::Release);
            while raw.u64_at(ATTACHED).load(Ordering::Acquire) != 1 {
                if start.elapsed() > patience {
                    return Err(format!("no {peer} echoer showed up").into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        } else {
            // SYNC POINT: pairs with the pinger's Release store of MAGIC.
            while raw.u64_at(0).load(Ordering::Acquire) != MAGIC {
                if start.elapsed() > patience {
                    return Err("the memory file is not a latency file".into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            raw.u64_at(ATTACHED).store(1, Ordering::Release);
        }
        Ok(raw)
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= PING_DATA && LEN <= self.map.len());
        // SAFETY: `offset` is 8-aligned inside the header of a live, page-aligned mapping of
        // LEN bytes (asserted); both processes touch these words only through atomics.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= PING_DATA && LEN <= self.map.len());
        // SAFETY: as `u64_at`, 4-aligned.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    fn payload(&self, offset: usize) -> *mut f32 {
        assert!(offset >= PING_DATA && offset + ELEMENTS * 4 <= LEN && LEN <= self.map.len());
        // SAFETY: in bounds (asserted) and 64-aligned inside a page-aligned mapping.
        unsafe { self.map.as_ptr().add(offset).cast::<f32>() }
    }

    /// Writes message `seq` (from `self.buf`) to this side's payload and publishes it.
    fn send(&mut self, seq: u64) {
        let (word, data) = self.out;
        // SAFETY: the outgoing payload is ours until we publish `seq + 1` below: the other
        // side reads it only between seeing that value and answering, and it has answered
        // the previous message before we got here.
        unsafe { std::ptr::copy_nonoverlapping(self.buf.as_ptr(), self.payload(data), ELEMENTS) };
        let w = self.u32_at(word);
        // SYNC POINT: the payload above is visible to the receiver that reads `seq + 1`.
        w.store(seq as u32 + 1, Ordering::Release);
        if self.peer == Peer::FutexSleep {
            // The receiver sleeps on the word: one wake per send, unconditionally.
            let _ = futex::wake(w, futex::Flags::empty(), 1);
        }
    }

    /// Waits for message `seq` on this side's incoming word, copies it into `self.buf` and
    /// checks it.
    fn recv(&mut self, seq: u64) -> Result<(), BoxError> {
        let (word, data) = self.inp;
        let want = seq as u32 + 1;
        let w = self.u32_at(word);
        let mut spins = 0u32;
        loop {
            // SYNC POINT: pairs with the sender's Release store (payload visible).
            let v = w.load(Ordering::Acquire);
            if v == want {
                break;
            }
            if self.peer == Peer::FutexSleep {
                let ts = rustix::fs::Timespec {
                    tv_sec: 0,
                    tv_nsec: SLEEP_SLICE.as_nanos() as _,
                };
                let _ = futex::wait(w, futex::Flags::empty(), v, Some(&ts));
            } else {
                spins += 1;
                if spins.is_multiple_of(SPINS_PER_YIELD) {
                    std::thread::yield_now();
                } else {
                    spin_loop();
                }
            }
        }
        // SAFETY: the sender published this payload (Acquire above) and does not write it
        // again before we answer.
        unsafe {
            std::ptr::copy_nonoverlapping(self.payload(data), self.buf.as_mut_ptr(), ELEMENTS)
        };
        check_message(&self.buf, seq)
    }

    /// The cache-line peer's half trip: wait for `wait_for` on the ping word, store `then`.
    fn bounce(&self, store: Option<u64>, wait_for: u64) {
        let line = self.u64_at(PING);
        if let Some(v) = store {
            line.store(v, Ordering::Release);
        }
        let mut spins = 0u32;
        while line.load(Ordering::Acquire) != wait_for {
            spins += 1;
            if spins.is_multiple_of(SPINS_PER_YIELD) {
                std::thread::yield_now();
            } else {
                spin_loop();
            }
        }
    }
}

impl PingPong for Raw {
    fn round_trip(&mut self, seq: u64) -> Result<(), BoxError> {
        if self.peer == Peer::CacheLine {
            self.bounce(Some(2 * seq + 1), 2 * seq + 2);
            return Ok(());
        }
        kernel::fill(&mut self.buf, seq);
        self.send(seq);
        self.recv(seq)
    }

    fn echo(&mut self, seq: u64) -> Result<(), BoxError> {
        if self.peer == Peer::CacheLine {
            self.bounce(None, 2 * seq + 1);
            self.u64_at(PING).store(2 * seq + 2, Ordering::Release);
            return Ok(());
        }
        self.recv(seq)?;
        self.send(seq);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_raw_peer_passes_checked_messages_between_threads() {
        for peer in [Peer::CacheLine, Peer::FutexSpin, Peer::FutexSleep] {
            let file = crate::sys::shared_memfd(FILE_LEN).unwrap();
            let echoer = {
                let file = file.try_clone().unwrap();
                std::thread::spawn(move || {
                    let mut e = Raw::connect(peer, &file, Side::Echo, Duration::from_secs(10))?;
                    super::super::echo(&mut e, 50)
                })
            };
            let mut p = Raw::connect(peer, &file, Side::Ping, Duration::from_secs(10)).unwrap();
            let s = super::super::ping(&mut p, 10, 40).unwrap();
            echoer.join().unwrap().unwrap();
            assert_eq!(s.ns.len(), 40);
            assert!(s.ns.iter().all(|&ns| ns > 0), "{peer}: {:?}", s.ns);
        }
    }

    #[test]
    fn a_wrong_message_is_caught() {
        let file = crate::sys::shared_memfd(FILE_LEN).unwrap();
        let echoer = {
            let file = file.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut e =
                    Raw::connect(Peer::FutexSpin, &file, Side::Echo, Duration::from_secs(10))?;
                // Answers message 0 with the contents of message 1.
                e.recv(0)?;
                kernel::fill(&mut e.buf, 1);
                e.send(0);
                Ok::<(), BoxError>(())
            })
        };
        let mut p =
            Raw::connect(Peer::FutexSpin, &file, Side::Ping, Duration::from_secs(10)).unwrap();
        let err = p.round_trip(0).unwrap_err();
        assert!(err.to_string().contains("not moved intact"), "{err}");
        echoer.join().unwrap().unwrap();
    }

    #[test]
    fn a_pinger_alone_gives_up() {
        let file = crate::sys::shared_memfd(FILE_LEN).unwrap();
        let err = Raw::connect(
            Peer::FutexSpin,
            &file,
            Side::Ping,
            Duration::from_millis(30),
        )
        .unwrap_err();
        assert!(err.to_string().contains("no futex-spin echoer"), "{err}");
    }
}
