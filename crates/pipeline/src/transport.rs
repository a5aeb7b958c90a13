//! Transports behind [`Tx`]/[`Rx`]: shared memory (`shm-ring`, the default) and Unix stream
//! sockets (a reference transport used to cross-check the pipeline logic and in benchmarks).
//!
//! Neither has a name: a producer creates its channel (a sealed memfd, or a connected socket
//! pair) and its consumer receives the descriptor through the parent (see
//! [`handover`](crate::handover)). So nobody else can connect, squat or listen, and there is
//! no `accept()` to wait in.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::wire::{self, Frame, Rx, TransportError, Tx};

/// Which transport carries the batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum TransportKind {
    /// `shm-ring` shared-memory rings (the default).
    #[default]
    Shm,
    /// Unix stream sockets (socket pairs handed over by descriptor). Slower; a reference.
    Socket,
}

fn io_err(e: std::io::Error) -> TransportError {
    match e.kind() {
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
            TransportError::PeerDied(e.to_string())
        }
        _ => TransportError::Other(e.to_string()),
    }
}

/// Producer end over a Unix socket pair.
pub(crate) struct SockTx {
    stream: UnixStream,
    buf: Vec<u8>,
    /// Largest batch in bytes (the consumer refuses larger ones).
    max: usize,
}

impl SockTx {
    /// A connected pair: the producer end, and the consumer's descriptor to hand over.
    /// `max`: the largest encoded batch either side accepts.
    pub(crate) fn pair(max: usize) -> std::io::Result<(SockTx, OwnedFd)> {
        let (a, b) = UnixStream::pair()?;
        Ok((
            SockTx {
                stream: a,
                buf: Vec::new(),
                max,
            },
            OwnedFd::from(b),
        ))
    }
}

impl Tx for SockTx {
    fn send(&mut self, frames: &[Frame]) -> Result<(), TransportError> {
        for seg in wire::segments(frames) {
            let b = wire::build(seg).map_err(TransportError::Other)?;
            let (words, len) = shm_ring::message::encode_inline(&b)
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
            self.stream.write_all(&self.buf).map_err(io_err)?;
        }
        Ok(())
    }
}

/// Consumer end over a Unix socket pair.
pub(crate) struct SockRx {
    stream: UnixStream,
    /// One message body (8-aligned, as shm-ring's decoder wants it).
    buf: Vec<u64>,
    /// Largest batch in bytes accepted from the peer.
    max: usize,
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
        })
    }
}

impl Rx for SockRx {
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Option<Vec<Frame>>, TransportError> {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let ts = Timespec {
            tv_sec: timeout.map_or(0, |t| t.as_secs() as i64),
            tv_nsec: timeout.map_or(0, |t| i64::from(t.subsec_nanos())),
        };
        let fd = self.stream.as_fd();
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let ready = match poll(&mut fds, Some(&ts)) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => 0,
            Err(e) => return Err(TransportError::Other(e.to_string())),
        };
        if ready == 0 {
            return Ok(None);
        }
        let mut len = [0u8; 8];
        match self.stream.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(TransportError::Closed);
            }
            Err(e) => return Err(TransportError::PeerDied(e.to_string())),
        }
        // The peer's length, checked before anything is allocated for it.
        let len = u64::from_le_bytes(len);
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= self.max)
            .ok_or_else(|| {
                TransportError::Other(format!(
                    "peer announced a batch of {len} bytes, more than the channel's {}",
                    self.max
                ))
            })?;
        self.buf.resize(len.div_ceil(8), 0);
        let body = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.buf)[..len];
        self.stream
            .read_exact(body)
            .map_err(|e| TransportError::PeerDied(e.to_string()))?;
        let view =
            shm_ring::message::decode(body).map_err(|e| TransportError::Other(e.to_string()))?;
        let mut frames = Vec::new();
        wire::decode(view, &mut frames, None).map_err(TransportError::Other)?;
        Ok(Some(frames))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn batches_over_the_limit_are_refused_by_the_sender() {
        let (mut tx, _rx) = SockTx::pair(64).unwrap();
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
}
