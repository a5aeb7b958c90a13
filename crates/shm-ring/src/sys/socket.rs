//! Unix sequenced-packet sockets: the name server of a named channel listens on one, and an
//! opener connects to it and receives the channel's descriptor (`SCM_RIGHTS`). Every call
//! here is non-blocking; waits are `poll`s with a bound.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use rustix::event::{PollFd, PollFlags, poll};
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

/// Descriptors an opener accepts in one answer before it calls the answer malformed (room to
/// see, and close, a few more than the one expected).
const MAX_FDS: usize = 4;

fn new_socket() -> rustix::io::Result<OwnedFd> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
}

/// A listening socket bound at `path` (which must not exist), non-blocking, close-on-exec.
pub(crate) fn listen_at(path: &str, backlog: i32) -> rustix::io::Result<OwnedFd> {
    let fd = new_socket()?;
    rustix::net::bind(&fd, &SocketAddrUnix::new(path)?)?;
    rustix::net::listen(&fd, backlog)?;
    Ok(fd)
}

/// A connection accepted on `listener`, non-blocking and close-on-exec; `Ok(None)` when none is
/// waiting.
pub(crate) fn accept(listener: &OwnedFd) -> rustix::io::Result<Option<OwnedFd>> {
    loop {
        match rustix::net::accept_with(listener, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK) {
            Ok(fd) => return Ok(Some(fd)),
            Err(Errno::AGAIN) => return Ok(None),
            // A connector that gave up before we took it: try the next one.
            Err(Errno::INTR | Errno::CONNABORTED) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Connects to the socket at `path` without waiting: `ECONNREFUSED` when nobody listens
/// there (a stale socket, or not a socket at all), `EAGAIN` when the listener's backlog is
/// full, `ENOENT` when nothing is there.
pub(crate) fn connect_at(path: &str) -> rustix::io::Result<OwnedFd> {
    let fd = new_socket()?;
    loop {
        match rustix::net::connect(&fd, &SocketAddrUnix::new(path)?) {
            Ok(()) => return Ok(fd),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// `struct ucred` (`SO_PEERCRED`).
#[repr(C)]
#[derive(Default)]
struct Ucred {
    pid: i32,
    uid: u32,
    gid: u32,
}

unsafe extern "C" {
    fn getsockopt(
        fd: std::ffi::c_int,
        level: std::ffi::c_int,
        name: std::ffi::c_int,
        value: *mut std::ffi::c_void,
        len: *mut u32,
    ) -> std::ffi::c_int;
}

const SOL_SOCKET: std::ffi::c_int = 1;
const SO_PEERCRED: std::ffi::c_int = 17;

/// The pid and uid of the process at the other end of a connected socket, as the kernel
/// recorded them when that end connected or listened. The pid is 0 when that process is in a
/// pid namespace ours cannot see (`rustix::net::sockopt::socket_peercred` would make a
/// non-zero pid type of it: undefined behaviour).
pub(crate) fn peer(fd: &OwnedFd) -> rustix::io::Result<(u32, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = Ucred::default();
    let mut len = std::mem::size_of::<Ucred>() as u32;
    // SAFETY: `cred` is a `struct ucred` of ours and `len` its size; the kernel writes at most
    // `len` bytes into it and any bit pattern is a valid `Ucred`.
    let rc = unsafe {
        getsockopt(
            fd.as_raw_fd(),
            SOL_SOCKET,
            SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO));
    }
    Ok((u32::try_from(cred.pid).unwrap_or(0), cred.uid))
}

/// Sends `bytes` and the descriptor `fd` as one message, without waiting (a connector that
/// does not read cannot hold us: the message is tiny and its socket buffer is empty).
pub(crate) fn send_fd(conn: &OwnedFd, bytes: &[u8], fd: BorrowedFd<'_>) -> rustix::io::Result<()> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !anc.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(Errno::NOBUFS);
    }
    loop {
        match rustix::net::sendmsg(
            conn,
            &[IoSlice::new(bytes)],
            &mut anc,
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// One message received on a connected socket.
#[derive(Debug)]
pub(crate) struct Received {
    /// Bytes of the message (at most the buffer's length).
    pub bytes: usize,
    /// The message was longer than the buffer, or its descriptors did not fit.
    pub truncated: bool,
    /// Every descriptor that came with it (close-on-exec; closed when dropped).
    pub fds: Vec<OwnedFd>,
}

/// Waits (until `deadline`) for one message on `conn` and receives it into `buf`.
/// `Err(ETIMEDOUT)` when nothing came in time; a message of 0 bytes is the peer's end of
/// file.
pub(crate) fn recv_fds(
    conn: &OwnedFd,
    buf: &mut [u8],
    deadline: Instant,
) -> rustix::io::Result<Received> {
    loop {
        if !wait_readable(conn.as_fd(), deadline)? {
            return Err(Errno::TIMEDOUT);
        }
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        let r = rustix::net::recvmsg(
            conn,
            &mut [IoSliceMut::new(buf)],
            &mut anc,
            RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
        );
        let msg = match r {
            Ok(m) => m,
            Err(Errno::INTR | Errno::AGAIN) => continue,
            Err(e) => return Err(e),
        };
        // Own every descriptor that came, so that each is closed on every path.
        let mut fds = Vec::new();
        for m in anc.drain() {
            if let RecvAncillaryMessage::ScmRights(it) = m {
                fds.extend(it);
            }
        }
        return Ok(Received {
            bytes: msg.bytes,
            truncated: msg.flags.contains(ReturnFlags::TRUNC)
                || msg.flags.contains(ReturnFlags::CTRUNC),
            fds,
        });
    }
}

/// Waits until `fd` is readable (or at its end of file); `false` when `deadline` passed.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, deadline: Instant) -> rustix::io::Result<bool> {
    Ok(wait_any(&[fd], deadline)?.is_some())
}

/// Waits until one of `fds` is readable (or at its end of file, or in error) and returns its
/// index; `None` when `deadline` passed. A signal interrupts the wait, never ends it.
pub(crate) fn wait_any(
    fds: &[BorrowedFd<'_>],
    deadline: Instant,
) -> rustix::io::Result<Option<usize>> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ts = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut polled: Vec<PollFd<'_>> =
            fds.iter().map(|f| PollFd::new(f, PollFlags::IN)).collect();
        match poll(&mut polled, Some(&ts)) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(polled.iter().position(|p| !p.revents().is_empty())),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// A pipe whose write end, dropped, wakes a `wait_any` on its read end (end of file).
pub(crate) fn wake_pipe() -> rustix::io::Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
}
