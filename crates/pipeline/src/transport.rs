//! Transports behind [`Tx`]/[`Rx`]: shared memory (`shm-ring`, the default) and Unix sockets
//! in the abstract namespace (a reference transport used to cross-check the pipeline logic).
//!
//! In both, the producer creates the named endpoint without blocking and the consumer opens
//! it by name, retrying until the producer has created it.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::wire::{self, Frame, Rx, TransportError, Tx};

/// Which transport carries the batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum TransportKind {
    /// `shm-ring` shared-memory rings (the default).
    #[default]
    Shm,
    /// Unix stream sockets (abstract namespace). Slower; a reference for tests.
    Socket,
}

fn sock_addr(name: &str) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("shmpipe-{name}").as_bytes())
}

/// Producer end over a Unix socket: listens at creation, accepts at the first send.
pub(crate) struct SockTx {
    listener: UnixListener,
    stream: Option<UnixStream>,
    buf: Vec<u8>,
}

impl SockTx {
    pub(crate) fn create(name: &str) -> std::io::Result<SockTx> {
        let listener = UnixListener::bind_addr(&sock_addr(name)?)?;
        Ok(SockTx {
            listener,
            stream: None,
            buf: Vec::new(),
        })
    }
}

impl Tx for SockTx {
    fn send(&mut self, frames: &[Frame]) -> Result<(), TransportError> {
        let other = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                TransportError::PeerDied(e.to_string())
            }
            _ => TransportError::Other(e.to_string()),
        };
        if self.stream.is_none() {
            let (s, _) = self.listener.accept().map_err(other)?;
            self.stream = Some(s);
        }
        self.buf.clear();
        self.buf.extend_from_slice(&[0u8; 8]);
        wire::encode(frames, &mut self.buf);
        let len = (self.buf.len() - 8) as u64;
        self.buf[..8].copy_from_slice(&len.to_le_bytes());
        let stream = self.stream.as_mut().ok_or(TransportError::Closed)?;
        stream.write_all(&self.buf).map_err(other)
    }
}

/// Consumer end over a Unix socket.
pub(crate) struct SockRx {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl SockRx {
    pub(crate) fn open(name: &str, deadline: Instant) -> std::io::Result<SockRx> {
        let addr = sock_addr(name)?;
        loop {
            match UnixStream::connect_addr(&addr) {
                Ok(stream) => {
                    return Ok(SockRx {
                        stream,
                        buf: Vec::new(),
                    });
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
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
        let ready = poll(&mut fds, Some(&ts)).map_err(|e| TransportError::Other(e.to_string()))?;
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
        let len = u64::from_le_bytes(len) as usize;
        self.buf.resize(len, 0);
        self.stream
            .read_exact(&mut self.buf)
            .map_err(|e| TransportError::PeerDied(e.to_string()))?;
        wire::decode(&self.buf)
            .map(Some)
            .map_err(TransportError::Other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 8: a peer's length prefix is bounded before anything is allocated for it.
    #[test]
    fn a_hostile_length_prefix_is_an_error_not_a_panic() {
        for len in [u64::MAX, 1 << 40, (1 << 31) + 1] {
            let (mut a, b) = UnixStream::pair().unwrap();
            a.write_all(&len.to_le_bytes()).unwrap();
            let mut rx = SockRx {
                stream: b,
                buf: Vec::new(),
            };
            let r = rx.recv(Some(Duration::from_secs(1)));
            assert!(matches!(r, Err(TransportError::Other(_))), "{len}: {r:?}");
        }
    }
}
