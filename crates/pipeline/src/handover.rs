//! The control socket between a pipeline's parent and each of its children, and the hand-over
//! of channels on it.
//!
//! Every child inherits one end of its own `SOCK_SEQPACKET` socket pair (the only descriptor
//! it inherits; its number travels in the role payload). The start-up runs in lock step:
//!
//! 0. right after spawning a child the parent sends it `SHARED`: the sealed memfds its
//!    arguments name ([`crate::share`]; none for most children), which it checks and keeps;
//! 1. each producer creates its outgoing channels (sealed anonymous memfds, or socket pairs for
//!    the socket transport) and sends their descriptors to the parent (`OUTPUTS`);
//! 2. the parent forwards each consumer its incoming descriptors in upstream order (`INPUTS`);
//!    it is the broker between stages and the consumer of the last one;
//! 3. each child attaches to its inputs and says so (`ATTACHED`);
//! 4. once everything is attached, the parent says `GO`; only then does data flow.
//!
//! Afterwards the socket carries little: `STOP` (a deliberate shutdown: a child then exits
//! without a word), `FAILED` (a child that cannot go on says why, as text), `CREDIT` (ordered mode: how many records an emitter may issue, see
//! [`crate::credit`]) and, from a child about to exit on its own terms, `EXIT` with its code
//! (so that the parent never takes a code that a step passed to `exit` for one of the
//! pipeline's own). End of file means the other side is gone; since a fork of the parent
//! holds the parent's ends too, children watch their parent's process as well (see
//! [`crate::watchdog`]). A child that dies closes its end, which the parent sees at once during
//! start-up.
//!
//! Nothing is named: no path, no `/dev/shm` entry, no abstract socket address. A descriptor can
//! only reach a process through this socket, which only the parent and that child hold.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType, recvmsg,
    sendmsg, socketpair,
};

/// Most descriptors in one message (the kernel's limit is 253).
pub(crate) const MAX_FDS: usize = 128;

/// What a control message says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// Child to parent: the descriptors of its outgoing channels, in plan order.
    Outputs = 1,
    /// Parent to child: the descriptors of its incoming channels, in upstream order.
    Inputs = 2,
    /// Child to parent: attached to every input.
    Attached = 3,
    /// Parent to child: every channel of the pipeline is attached; start.
    Go = 4,
    /// Parent to child: deliberate shutdown; exit quietly.
    Stop = 5,
    /// Parent to child, first of all: the shared descriptors its arguments name, in the
    /// order of its role payload's `shared` list (see [`crate::share`]).
    Shared = 6,
    /// Child to parent: it cannot go on, and why (UTF-8 text after the two header bytes, at
    /// most [`MAX_TEXT`] bytes; no descriptors). Received as [`CtrlError::Failed`].
    Failed = 7,
    /// Parent to emitter (ordered mode): it may issue its records `0..value`.
    Credit = 8,
    /// Child to parent, last of all: it exits with code `value` on its own terms.
    Exit = 9,
}

/// Longest text of a [`Kind::Failed`] message.
pub(crate) const MAX_TEXT: usize = 4096;

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Outputs,
            2 => Kind::Inputs,
            3 => Kind::Attached,
            4 => Kind::Go,
            5 => Kind::Stop,
            6 => Kind::Shared,
            7 => Kind::Failed,
            8 => Kind::Credit,
            9 => Kind::Exit,
            _ => return None,
        })
    }

    /// Whether a message of this kind carries a value (8 bytes after its header).
    fn has_value(self) -> bool {
        matches!(self, Kind::Credit | Kind::Exit)
    }
}

/// One control message: its kind, the descriptors it carried, and its value (0 for kinds
/// without one).
#[derive(Debug)]
pub(crate) struct Msg {
    pub kind: Kind,
    pub fds: Vec<OwnedFd>,
    pub value: u64,
}

/// Why receiving a control message failed.
#[derive(Debug)]
pub(crate) enum CtrlError {
    /// The other end is closed (its process exited or died).
    Eof,
    /// Nothing arrived in time.
    Timeout,
    /// The child says it cannot go on ([`Kind::Failed`]), and why.
    Failed(String),
    /// Anything else (a malformed message, an OS error).
    Other(String),
}

impl std::fmt::Display for CtrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CtrlError::Eof => f.write_str("control socket closed"),
            CtrlError::Timeout => f.write_str("timed out on the control socket"),
            CtrlError::Failed(m) => f.write_str(m),
            CtrlError::Other(m) => f.write_str(m),
        }
    }
}

/// Whether a failed send says that the other end is gone (its process exited or died), which
/// the caller learns of elsewhere, rather than that something is wrong with the message.
pub(crate) fn peer_gone(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(c) if c == Errno::PIPE.raw_os_error() || c == Errno::CONNRESET.raw_os_error()
    )
}

/// One end of a control socket.
#[derive(Debug)]
pub(crate) struct Ctrl {
    fd: OwnedFd,
}

impl Ctrl {
    /// A connected pair, both ends close-on-exec: (the parent's end, the child's end).
    pub(crate) fn pair() -> std::io::Result<(Ctrl, OwnedFd)> {
        let (a, b) = socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        Ok((Ctrl { fd: a }, b))
    }

    /// Wraps an end received from the parent.
    pub(crate) fn from_fd(fd: OwnedFd) -> Ctrl {
        Ctrl { fd }
    }

    /// Sends a message of `kind` carrying `fds` (at most [`MAX_FDS`]). Never blocks: the
    /// messages are tiny and a socket buffer holds many.
    pub(crate) fn send(&self, kind: Kind, fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        self.send_msg(kind, fds, 0)
    }

    /// Sends a message of `kind` (one that carries a value) with `value`. Never blocks.
    pub(crate) fn send_value(&self, kind: Kind, value: u64) -> std::io::Result<()> {
        debug_assert!(kind.has_value());
        self.send_msg(kind, &[], value)
    }

    /// Tells the parent that this child cannot go on, and why ([`Kind::Failed`]; the text is
    /// cut to [`MAX_TEXT`] bytes on a character boundary).
    pub(crate) fn send_failure(&self, why: &str) -> std::io::Result<()> {
        let mut end = why.len().min(MAX_TEXT);
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        let mut body = vec![Kind::Failed as u8, 0];
        body.extend_from_slice(&why.as_bytes()[..end]);
        let mut space: [MaybeUninit<u8>; 0] = [];
        self.send_bytes(&body, &mut SendAncillaryBuffer::new(&mut space))
    }

    fn send_msg(&self, kind: Kind, fds: &[BorrowedFd<'_>], value: u64) -> std::io::Result<()> {
        if fds.len() > MAX_FDS {
            return Err(std::io::Error::other(format!(
                "{} descriptors in one control message (at most {MAX_FDS})",
                fds.len()
            )));
        }
        let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !anc.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(std::io::Error::other("control buffer too small"));
        }
        let mut body = [0u8; 10];
        body[..2].copy_from_slice(&[kind as u8, fds.len() as u8]);
        body[2..].copy_from_slice(&value.to_le_bytes());
        let len = if kind.has_value() { 10 } else { 2 };
        self.send_bytes(&body[..len], &mut anc)
    }

    fn send_bytes(
        &self,
        body: &[u8],
        anc: &mut SendAncillaryBuffer<'_, '_, '_>,
    ) -> std::io::Result<()> {
        loop {
            match sendmsg(
                &self.fd,
                &[IoSlice::new(body)],
                anc,
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            ) {
                Ok(_) => return Ok(()),
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The messages a peer that has ended left on the socket (its `EXIT`), without waiting.
    /// A peer that ended with messages of ours unread (a `CREDIT` sent as it exited) reset the
    /// connection: the reset is reported once, by the first read, before the messages it
    /// sent, so one failed read is passed over (the peer is gone: what is queued is finite).
    pub(crate) fn left_by_ended_peer(&self) -> Vec<Msg> {
        let mut out = Vec::new();
        let mut failed = 0;
        while failed < 2 {
            match self.recv_msg(Some(Duration::ZERO)) {
                Ok(m) => out.push(m),
                Err(_) => failed += 1,
            }
        }
        out
    }

    /// Receives one message, waiting up to `timeout` (`None`: forever). Received descriptors
    /// are close-on-exec.
    pub(crate) fn recv(
        &self,
        timeout: Option<Duration>,
    ) -> Result<(Kind, Vec<OwnedFd>), CtrlError> {
        self.recv_msg(timeout).map(|m| (m.kind, m.fds))
    }

    /// [`Ctrl::recv`], with the message's value.
    pub(crate) fn recv_msg(&self, timeout: Option<Duration>) -> Result<Msg, CtrlError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if !self.wait_readable(left)? {
                return Err(CtrlError::Timeout);
            }
            let mut space =
                vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
            let mut anc = RecvAncillaryBuffer::new(&mut space);
            // The longest message (a failure's text); a longer one shows as truncated.
            let mut body = [0u8; 2 + MAX_TEXT];
            let r = recvmsg(
                &self.fd,
                &mut [IoSliceMut::new(&mut body)],
                &mut anc,
                RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
            );
            let msg = match r {
                Ok(m) => m,
                Err(Errno::INTR | Errno::AGAIN) => continue,
                Err(Errno::CONNRESET) => return Err(CtrlError::Eof),
                Err(e) => return Err(CtrlError::Other(format!("control socket: {e}"))),
            };
            // Take ownership of whatever descriptors came, so that they are closed on every
            // error path below.
            let mut fds = Vec::new();
            for m in anc.drain() {
                if let RecvAncillaryMessage::ScmRights(it) = m {
                    fds.extend(it);
                }
            }
            if msg.bytes == 0 {
                return Err(CtrlError::Eof);
            }
            if msg.flags.contains(ReturnFlags::CTRUNC) || msg.flags.contains(ReturnFlags::TRUNC) {
                return Err(CtrlError::Other("truncated control message".into()));
            }
            let shown = msg.bytes.min(16);
            let bad = || CtrlError::Other(format!("bad control message {:?}", &body[..shown]));
            let kind = Kind::from_u8(body[0]).ok_or_else(bad)?;
            if kind == Kind::Failed {
                if !fds.is_empty() || body[1] != 0 {
                    return Err(CtrlError::Other("failure report with descriptors".into()));
                }
                let text = String::from_utf8_lossy(&body[2..msg.bytes]).into_owned();
                return Err(CtrlError::Failed(text));
            }
            let len = if kind.has_value() { 10 } else { 2 };
            if msg.bytes != len {
                return Err(bad());
            }
            if usize::from(body[1]) != fds.len() {
                return Err(CtrlError::Other(format!(
                    "control message announces {} descriptors, carries {}",
                    body[1],
                    fds.len()
                )));
            }
            let mut value = [0u8; 8];
            if kind.has_value() {
                value.copy_from_slice(&body[2..10]);
            }
            return Ok(Msg {
                kind,
                fds,
                value: u64::from_le_bytes(value),
            });
        }
    }

    /// Waits until a message (or the end of file) is waiting; `false` on timeout.
    pub(crate) fn wait_readable(&self, timeout: Option<Duration>) -> Result<bool, CtrlError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            // A signal interrupts the wait, never ends it: wait again for what is left.
            let ts = deadline.map(|d| {
                let left = d.saturating_duration_since(Instant::now());
                Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: i64::from(left.subsec_nanos()),
                }
            });
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
            match poll(&mut fds, ts.as_ref()) {
                Ok(0) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(CtrlError::Other(format!("control socket: {e}"))),
            }
        }
    }
}

impl AsFd for Ctrl {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_travel_and_eof_is_seen() {
        let (a, b) = Ctrl::pair().unwrap();
        let b = Ctrl::from_fd(b);
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        a.send(Kind::Outputs, &[f.as_fd(), f.as_fd()]).unwrap();
        let (k, fds) = b.recv(Some(Duration::from_secs(1))).unwrap();
        assert_eq!((k, fds.len()), (Kind::Outputs, 2));
        assert!(matches!(
            b.recv(Some(Duration::from_millis(10))),
            Err(CtrlError::Timeout)
        ));
        a.send(Kind::Stop, &[]).unwrap();
        assert_eq!(b.recv(None).unwrap().0, Kind::Stop);
        a.send_value(Kind::Credit, 1 << 40).unwrap();
        let m = b.recv_msg(None).unwrap();
        assert_eq!((m.kind, m.fds.len(), m.value), (Kind::Credit, 0, 1 << 40));
        drop(a);
        assert!(matches!(b.recv(None), Err(CtrlError::Eof)));
    }

    /// A child that exits with a `CREDIT` of the parent unread resets the connection; the
    /// parent's next read fails with that reset before the child's `EXIT` (seen as a step's
    /// `exit(0)`, "exited with code 0 on its own", in about one ordered Python run in five).
    #[test]
    fn an_exit_sent_before_a_reset_is_read() {
        let (parent, child) = Ctrl::pair().unwrap();
        let child = Ctrl::from_fd(child);
        parent.send_value(Kind::Credit, 7).unwrap();
        child.send_value(Kind::Exit, 0).unwrap();
        drop(child);
        let left: Vec<_> = parent
            .left_by_ended_peer()
            .into_iter()
            .map(|m| (m.kind, m.value))
            .collect();
        assert_eq!(left, [(Kind::Exit, 0)]);
    }

    #[test]
    fn a_failure_report_carries_its_text() {
        let (a, b) = Ctrl::pair().unwrap();
        let b = Ctrl::from_fd(b);
        a.send_failure("cannot create a channel: é").unwrap();
        match b.recv(Some(Duration::from_secs(1))) {
            Err(CtrlError::Failed(t)) => assert_eq!(t, "cannot create a channel: é"),
            other => panic!("{other:?}"),
        }
        // Long texts are cut on a character boundary.
        a.send_failure(&"é".repeat(MAX_TEXT)).unwrap();
        match b.recv(Some(Duration::from_secs(1))) {
            Err(CtrlError::Failed(t)) => assert!(t.len() <= MAX_TEXT && t.starts_with("éé")),
            other => panic!("{other:?}"),
        }
        // A failure report may carry no descriptor.
        rustix::net::send(&a, &[7, 1, b'x'], SendFlags::empty()).unwrap();
        assert!(matches!(b.recv(None), Err(CtrlError::Other(_))));
    }

    #[test]
    fn a_malformed_message_is_an_error() {
        let (a, b) = Ctrl::pair().unwrap();
        let b = Ctrl::from_fd(b);
        rustix::net::send(&a, &[10, 0], SendFlags::empty()).unwrap();
        assert!(matches!(b.recv(None), Err(CtrlError::Other(_))));
        rustix::net::send(&a, &[1, 3], SendFlags::empty()).unwrap();
        assert!(matches!(b.recv(None), Err(CtrlError::Other(_))));
        // A kind with a value, without it; one without, with one; a message too long.
        rustix::net::send(&a, &[Kind::Credit as u8, 0], SendFlags::empty()).unwrap();
        assert!(matches!(b.recv(None), Err(CtrlError::Other(_))));
        rustix::net::send(&a, &[5, 0, 1, 2, 3, 4, 5, 6, 7, 8], SendFlags::empty()).unwrap();
        assert!(matches!(b.recv(None), Err(CtrlError::Other(_))));
        rustix::net::send(&a, &[Kind::Credit as u8; 12], SendFlags::empty()).unwrap();
        assert!(matches!(b.recv(None), Err(CtrlError::Other(_))));
    }

    #[test]
    fn a_signal_does_not_end_the_wait() {
        // A handler (without SA_RESTART semantics for poll) so the signal interrupts `poll`.
        let hit = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        signal_hook::flag::register(signal_hook::consts::SIGUSR2, hit.clone()).unwrap();
        let (a, b) = Ctrl::pair().unwrap();
        let b = Ctrl::from_fd(b);
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let t0 = Instant::now();
            let r = b.wait_readable(Some(Duration::from_secs(5)));
            (r.unwrap(), t0.elapsed())
        });
        let tid = rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        // SAFETY: `tid` is the live waiter thread (it cannot end before `a` sends below).
        assert_eq!(unsafe { libc::pthread_kill(tid, libc::SIGUSR2) }, 0);
        std::thread::sleep(Duration::from_millis(150));
        a.send(Kind::Go, &[]).unwrap();
        let (readable, waited) = waiter.join().unwrap();
        assert!(
            hit.load(std::sync::atomic::Ordering::SeqCst),
            "the signal arrived"
        );
        assert!(
            readable,
            "a signal ended the wait as a timeout after {waited:?}"
        );
        assert!(
            waited >= Duration::from_millis(150),
            "returned after {waited:?}"
        );
    }
}
