//! The Unix stream socket transport behind [`Tx`]/[`Rx`]: a reference transport used to
//! cross-check the pipeline logic and in benchmarks (the default, shared memory, is in
//! [`shm`](crate::shm); the traits and the encoding both use are in [`wire`](crate::wire)).
//!
//! Neither transport has a name: a producer creates its channel (a sealed memfd, or a connected socket
//! pair) and its consumer receives the descriptor through the parent (see
//! [`handover`](crate::handover)). So nobody else can connect, squat or listen, and there is
//! no `accept()` to wait in.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::wire::{self, Frame, Rx, TransportError, Tx};

/// Waits up to `left` until `fd` is ready for `events` (or has an error or hang-up).
fn wait_for(
    fd: &UnixStream,
    events: rustix::event::PollFlags,
    left: Duration,
) -> Result<(), TransportError> {
    use rustix::event::{PollFd, Timespec, poll};
    let ts = Timespec {
        tv_sec: left.as_secs() as i64,
        tv_nsec: i64::from(left.subsec_nanos()),
    };
    let fd = fd.as_fd();
    let mut fds = [PollFd::new(&fd, events)];
    match poll(&mut fds, Some(&ts)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(TransportError::Other(e.to_string())),
    }
}

/// Producer end over a Unix socket pair.
///
/// Writes never block for long: a batch goes out in non-blocking pieces, and while the socket
/// is full the producer waits at most [`WRITE_SLICE`] at a time, looking at its cancel flag
/// between waits. A consumer that does not read is no error by itself (it may be busy in a
/// long step); one that died is reported by the supervisor, whose teardown raises the flag of
/// the parent's input thread, the one producer that is not a child (children are stopped or
/// killed). Without that, a worker that died while a process it forked held its socket kept
/// the input thread, and the teardown that joins it, in a blocked write for as long as the
/// fork lived (issue 16, review finding 3).
pub(crate) struct SockTx {
    stream: UnixStream,
    buf: Vec<u8>,
    /// Largest batch in bytes (the consumer refuses larger ones).
    max: usize,
    /// Set: a send waiting for room gives up (with `Closed`) once the flag is raised.
    cancel: Option<Arc<AtomicBool>>,
}

/// How long a producer waits for room before it looks at its cancel flag again.
const WRITE_SLICE: Duration = Duration::from_millis(10);

impl SockTx {
    /// A connected pair: the producer end, and the consumer's descriptor to hand over.
    /// `max`: the largest encoded batch either side accepts; `cancel`: see [`SockTx`].
    pub(crate) fn pair(
        max: usize,
        cancel: Option<Arc<AtomicBool>>,
    ) -> std::io::Result<(SockTx, OwnedFd)> {
        let (a, b) = UnixStream::pair()?;
        Ok((
            SockTx {
                stream: a,
                buf: Vec::new(),
                max,
                cancel,
            },
            OwnedFd::from(b),
        ))
    }

    /// Writes `buf` in non-blocking pieces, waiting for room in slices (see [`SockTx`]).
    fn write_all(&self) -> Result<(), TransportError> {
        use rustix::io::Errno;
        use rustix::net::SendFlags;
        let mut off = 0;
        while off < self.buf.len() {
            let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
            match rustix::net::send(&self.stream, &self.buf[off..], flags) {
                Ok(n) => off += n,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => {
                    if self
                        .cancel
                        .as_ref()
                        .is_some_and(|c| c.load(Ordering::Relaxed))
                    {
                        return Err(TransportError::Closed);
                    }
                    wait_for(&self.stream, rustix::event::PollFlags::OUT, WRITE_SLICE)?;
                }
                Err(e @ (Errno::PIPE | Errno::CONNRESET)) => {
                    return Err(TransportError::PeerDied(e.to_string()));
                }
                Err(e) => return Err(TransportError::Other(e.to_string())),
            }
        }
        Ok(())
    }
}

impl Tx for SockTx {
    fn send(&mut self, frames: &[Frame]) -> Result<(), TransportError> {
        for seg in wire::segments(frames) {
            let b = wire::build(seg).map_err(TransportError::Other)?;
            let (words, len) = b
                .encode_inline()
                .map_err(|e| TransportError::Other(e.to_string()))?;
            if len > self.max {
                return Err(TransportError::Other(format!(
                    "a batch of {len} bytes exceeds the channel's {} bytes (raise the pool with \
                     PipelineBuilder::channel, or lower batch_bytes)",
                    self.max
                )));
            }
            self.buf.clear();
            self.buf.extend_from_slice(&(len as u64).to_le_bytes());
            self.buf
                .extend_from_slice(&bytemuck::cast_slice::<u64, u8>(&words)[..len]);
            self.write_all()?;
        }
        Ok(())
    }
}

/// Consumer end over a Unix socket pair.
///
/// A batch arrives as an 8-byte length prefix and a body, in as many pieces as the socket
/// delivers. `recv` reads whatever is there without blocking, keeps what it got (`head`,
/// `have`) and waits for more only until its deadline: a peer that wrote part of a batch and
/// stays alive never holds the consumer past it (issue 16, hole 5), so the consumer's idle
/// callback, and with it the supervisor's liveness check, runs between waits exactly as with
/// the shared-memory transport.
pub(crate) struct SockRx {
    stream: UnixStream,
    /// One message body (8-aligned, as shm-ring's decoder wants it).
    buf: Vec<u64>,
    /// Largest batch in bytes accepted from the peer.
    max: usize,
    /// The length prefix of the current batch, as far as it arrived.
    head: [u8; 8],
    /// Bytes of the current batch received so far, prefix included: `0 ..= 8 + len`.
    have: usize,
    /// The current batch's body length, once its prefix is complete (checked against `max`).
    len: Option<usize>,
    /// When the last byte of the current batch arrived (meaningful while `have > 0`).
    last_byte: Instant,
    /// A started batch of which nothing more is waiting this long after its last byte is an
    /// error: a live producer writes a batch in one go and blocks only on a full socket (then
    /// bytes are waiting), so only a broken or stopped one leaves it half-way this long.
    stall_limit: Duration,
}

/// What one non-blocking read gave.
enum Progress {
    /// Some bytes (the batch may be complete).
    Bytes,
    /// Nothing waiting.
    Nothing,
}

impl SockRx {
    /// The consumer end from a descriptor received from the parent.
    ///
    /// # Errors
    /// When `fd` is not a Unix stream socket.
    pub(crate) fn from_fd(fd: OwnedFd, max: usize) -> Result<SockRx, String> {
        let ty = rustix::net::sockopt::socket_type(&fd).map_err(|e| e.to_string())?;
        if ty != rustix::net::SocketType::STREAM {
            return Err(format!("expected a stream socket, got {ty:?}"));
        }
        Ok(SockRx {
            stream: UnixStream::from(fd),
            buf: Vec::new(),
            max,
            head: [0; 8],
            have: 0,
            len: None,
            last_byte: Instant::now(),
            stall_limit: Duration::from_secs(10),
        })
    }

    /// Reads what is waiting of the current batch, without blocking.
    fn read_some(&mut self) -> Result<Progress, TransportError> {
        use rustix::io::Errno;
        use rustix::net::RecvFlags;
        let into: &mut [u8] = match self.len {
            None => &mut self.head[self.have..],
            Some(len) => {
                &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.buf)[self.have - 8..len]
            }
        };
        let n = loop {
            match rustix::net::recv(&self.stream, &mut *into, RecvFlags::DONTWAIT) {
                Ok((n, _)) => break n,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => return Ok(Progress::Nothing),
                Err(e) => return Err(TransportError::PeerDied(e.to_string())),
            }
        };
        if n == 0 {
            return Err(if self.have == 0 {
                TransportError::Closed
            } else {
                TransportError::PeerDied("closed in the middle of a batch".into())
            });
        }
        self.have += n;
        self.last_byte = Instant::now();
        if self.len.is_none() && self.have == 8 {
            // The peer's length, checked before anything is allocated for it.
            let len = u64::from_le_bytes(self.head);
            let len = usize::try_from(len)
                .ok()
                .filter(|&l| l <= self.max)
                .ok_or_else(|| {
                    TransportError::Other(format!(
                        "peer announced a batch of {len} bytes, more than the channel's {}",
                        self.max
                    ))
                })?;
            self.buf.clear();
            self.buf.resize(len.div_ceil(8), 0);
            self.len = Some(len);
        }
        Ok(Progress::Bytes)
    }

    /// The complete batch, decoded; the reader is ready for the next one.
    fn take_batch(&mut self) -> Result<Vec<Frame>, TransportError> {
        let len = self.len.take().unwrap_or(0);
        self.have = 0;
        let body = &bytemuck::cast_slice::<u64, u8>(&self.buf)[..len];
        let view = shm_ring::MessageView::decode(body)
            .map_err(|e| TransportError::Other(e.to_string()))?;
        let mut frames = Vec::new();
        wire::decode(view, &mut frames, None).map_err(TransportError::Other)?;
        Ok(frames)
    }

    /// Waits up to `left` for bytes (or the end of the stream).
    fn wait(&self, left: Duration) -> Result<(), TransportError> {
        wait_for(&self.stream, rustix::event::PollFlags::IN, left)
    }
}

impl Rx for SockRx {
    /// The next batch if it is complete within `timeout` (`None`: without waiting).
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Option<Vec<Frame>>, TransportError> {
        let deadline = Instant::now() + timeout.unwrap_or(Duration::ZERO);
        loop {
            match self.read_some()? {
                Progress::Bytes => {
                    if self.len.is_some_and(|len| self.have == 8 + len) {
                        return self.take_batch().map(Some);
                    }
                    continue;
                }
                Progress::Nothing => {}
            }
            if self.have > 0 && self.last_byte.elapsed() >= self.stall_limit {
                return Err(TransportError::Other(format!(
                    "the producer stopped in the middle of a batch ({} of {} bytes) and sent \
                     nothing more for {:?}",
                    self.have,
                    self.len.map_or(8, |l| 8 + l),
                    self.last_byte.elapsed()
                )));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.wait(left)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Issue 8: a peer's length prefix is bounded before anything is allocated for it.
    #[test]
    fn a_hostile_length_prefix_is_an_error_not_a_panic() {
        for len in [u64::MAX, 1 << 40, (1 << 30) + 1] {
            let (mut a, b) = UnixStream::pair().unwrap();
            a.write_all(&len.to_le_bytes()).unwrap();
            let mut rx = SockRx::from_fd(OwnedFd::from(b), 1 << 30).unwrap();
            let r = rx.recv(Some(Duration::from_secs(1)));
            assert!(matches!(r, Err(TransportError::Other(_))), "{len}: {r:?}");
        }
    }

    /// One encoded batch of one item, as `SockTx` writes it: length prefix, then the body.
    fn encoded_batch(n: i64) -> Vec<u8> {
        let (mut tx, rx) = SockTx::pair(1 << 20, None).unwrap();
        let frames = [Frame::Item {
            e: 0,
            k: 0,
            last: true,
            item: crate::Item::new().with_meta("n", n),
        }];
        tx.send(&frames).unwrap();
        drop(tx);
        let mut bytes = Vec::new();
        UnixStream::from(rx).read_to_end(&mut bytes).unwrap();
        bytes
    }

    /// Issue 16, hole 5: a peer that wrote a length prefix (or part of a body) and stays alive
    /// blocked `recv` in `read_exact` forever, whatever its timeout. Now `recv` returns at its
    /// deadline, keeps what arrived, and completes the message when the rest comes.
    #[test]
    fn a_partial_batch_does_not_block_past_the_deadline() {
        let bytes = encoded_batch(7);
        for cut in [3, 8, 8 + 5, bytes.len() - 1] {
            let (mut a, b) = UnixStream::pair().unwrap();
            let mut rx = SockRx::from_fd(OwnedFd::from(b), 1 << 20).unwrap();
            a.write_all(&bytes[..cut]).unwrap();
            let (r, waited, rx) = shmpipe_test_kit::within(
                Duration::from_secs(5),
                "recv over a partial batch",
                move || {
                    let t0 = std::time::Instant::now();
                    let r = rx.recv(Some(Duration::from_millis(50)));
                    (r.map(|f| f.is_some()), t0.elapsed(), rx)
                },
            );
            let mut rx = rx;
            assert!(matches!(r, Ok(false)), "cut {cut}: {r:?}");
            assert!(waited < Duration::from_secs(2), "cut {cut}: {waited:?}");
            a.write_all(&bytes[cut..]).unwrap();
            let frames = rx.recv(Some(Duration::from_secs(1))).unwrap().unwrap();
            match &frames[..] {
                [Frame::Item { item, .. }] => assert_eq!(item.i64("n"), Some(7), "cut {cut}"),
                other => panic!("cut {cut}: {} frames", other.len()),
            }
        }
    }

    /// A peer that stops in the middle of a batch and stays alive is an error once nothing
    /// more of it has come for `stall_limit`; a peer that closes in the middle of one is a lost
    /// peer, not a clean end.
    #[test]
    fn a_batch_cut_short_is_an_error() {
        let bytes = encoded_batch(1);
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut rx = SockRx::from_fd(OwnedFd::from(b), 1 << 20).unwrap();
        rx.stall_limit = Duration::from_millis(100);
        a.write_all(&bytes[..12]).unwrap();
        let err = shmpipe_test_kit::within(Duration::from_secs(5), "the stall error", move || {
            loop {
                match rx.recv(Some(Duration::from_millis(20))) {
                    Ok(None) => {}
                    other => break other,
                }
            }
        });
        assert!(
            matches!(&err, Err(TransportError::Other(m)) if m.contains("middle of a batch")),
            "{err:?}"
        );
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut rx = SockRx::from_fd(OwnedFd::from(b), 1 << 20).unwrap();
        a.write_all(&bytes[..12]).unwrap();
        drop(a);
        let r = rx.recv(Some(Duration::from_secs(1)));
        assert!(matches!(r, Err(TransportError::PeerDied(_))), "{r:?}");
    }

    #[test]
    fn batches_over_the_limit_are_refused_by_the_sender() {
        let (mut tx, _rx) = SockTx::pair(64, None).unwrap();
        let item = crate::Item::new().with("x", ndarray::Array1::<f32>::zeros(100));
        let frames = [Frame::Item {
            e: 0,
            k: 0,
            last: true,
            item,
        }];
        let err = tx.send(&frames).unwrap_err();
        assert!(
            err.to_string().contains("PipelineBuilder::channel"),
            "{err}"
        );
    }

    /// A producer whose consumer does not read (its socket full, the consumer alive or held open
    /// by a fork) waits in slices, and gives up as soon as its cancel flag is raised.
    #[test]
    fn a_full_socket_does_not_hold_a_cancelled_producer() {
        let cancel = Arc::new(AtomicBool::new(false));
        let (mut tx, rx) = SockTx::pair(64 << 20, Some(Arc::clone(&cancel))).unwrap();
        let item = crate::Item::new().with("x", ndarray::Array1::<f32>::zeros(1 << 20));
        let frames = [Frame::Item {
            e: 0,
            k: 0,
            last: true,
            item,
        }];
        let flag = Arc::clone(&cancel);
        let raiser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            flag.store(true, Ordering::Relaxed);
        });
        let t0 = Instant::now();
        let r = shmpipe_test_kit::within(Duration::from_secs(10), "a cancelled send", move || {
            let r = tx.send(&frames);
            drop(rx);
            r
        });
        raiser.join().unwrap();
        assert!(matches!(r, Err(TransportError::Closed)), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }
}
