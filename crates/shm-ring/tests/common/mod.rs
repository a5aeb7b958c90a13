//! shm-ring's own test helpers: unique channel names and the guard over what they may leave
//! (a socket in the socket directory, anything in `/dev/shm`), the `shm-ring-peer` child
//! process, the peer's checksum, and writes into a live channel's memory. The generic guards
//! (directory entries, processes, `/proc`, a small `/dev/shm`) are in `shmpipe-test-kit`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use shmpipe_test_kit::{ChildGuard, EntryGuard, ShmGuard};

/// A channel name unique to this process and call, so tests can run in parallel.
pub fn unique(tag: &str) -> String {
    format!("t-{}", shmpipe_test_kit::unique_name(tag))
}

/// The default socket directory of named channels (what `Receiver::open` uses).
pub fn socket_dir() -> std::path::PathBuf {
    shm_ring::Rendezvous::default().socket_dir()
}

/// The path of channel `name`'s socket in the default socket directory.
pub fn socket_path(name: &str) -> std::path::PathBuf {
    socket_dir().join(name)
}

/// What these channel names may leave behind: their sockets in the socket directory, and
/// anything in `/dev/shm` whose name contains one of them (named channels must create nothing
/// there). Both are removed on drop; [`NameGuard::assert_gone`] is the "nothing leaked" check.
pub struct NameGuard {
    sockets: EntryGuard,
    shm: Vec<ShmGuard>,
}

impl NameGuard {
    pub fn assert_gone(&self) {
        self.sockets.assert_gone();
        for g in &self.shm {
            g.assert_gone();
        }
    }
}

/// A [`NameGuard`] over these channel names.
pub fn name_guard(names: &[&str]) -> NameGuard {
    NameGuard {
        sockets: EntryGuard::new(&socket_dir(), names.iter().copied()),
        shm: names.iter().map(|n| ShmGuard::containing(*n)).collect(),
    }
}

/// A channel name unique to this call (see [`unique`]) and the [`NameGuard`] over it.
pub fn named(tag: &str) -> (String, NameGuard) {
    let name = unique(tag);
    let guard = name_guard(&[&name]);
    (name, guard)
}

/// A private socket directory (mode 0700; removed with everything in it on drop) and the
/// [`shm_ring::Rendezvous`] that points both ends of a channel to it.
pub fn private_rendezvous(tag: &str) -> (shmpipe_test_kit::TempDir, shm_ring::Rendezvous) {
    use std::os::unix::fs::PermissionsExt;
    let dir = shmpipe_test_kit::TempDir::new(tag);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let path: &'static std::path::Path = Box::leak(dir.path().to_path_buf().into_boxed_path());
    let rdv = shm_ring::Rendezvous {
        dir: Some(path),
        ..shm_ring::Rendezvous::default()
    };
    (dir, rdv)
}

/// `/proc/<pid>/fd/<n>` of process `pid`'s descriptor of channel `name`'s memory (its memfd
/// is called `shmpipe:<name>`), if it has one.
pub fn channel_memfd(pid: u32, name: &str) -> Option<String> {
    let want = format!("/memfd:shmpipe:{name} (deleted)");
    shmpipe_test_kit::proc::fd_links(pid)
        .into_iter()
        .find(|(_, to)| to.to_string_lossy() == want)
        .map(|(fd, _)| fd.to_string_lossy().into_owned())
}

/// `/proc/<our pid>/fd/<n>` for a descriptor of a channel's memory: the path another process
/// of this user opens to write into it (as a hostile one would).
pub fn mem_path(fd: &impl std::os::fd::AsFd) -> String {
    use std::os::fd::AsRawFd;
    format!("/proc/{}/fd/{}", std::process::id(), fd.as_fd().as_raw_fd())
}

/// A `shm-ring-peer` child process, SIGKILLed and reaped when dropped.
pub struct Peer {
    pub child: ChildGuard,
    pub out: BufReader<ChildStdout>,
}

pub fn peer_cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shm-ring-peer"))
}

impl Peer {
    pub fn spawn(args: &[&str]) -> Peer {
        Self::spawn_cmd(peer_cmd().args(args))
    }

    pub fn spawn_cmd(cmd: &mut Command) -> Peer {
        let mut child = ChildGuard(
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn peer"),
        );
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Peer { child, out }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads one line of the peer's stdout.
    pub fn line(&mut self) -> String {
        let mut s = String::new();
        self.out.read_line(&mut s).expect("read peer stdout");
        s.trim().to_string()
    }

    /// Writes one line to the peer's stdin (a command for the peers that read one).
    pub fn tell(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write peer stdin");
        stdin.flush().expect("flush peer stdin");
    }

    /// Waits until the peer's thread-group leader shows `State: Z` (its main thread ended while
    /// other threads run), at most 5 s.
    pub fn wait_leader_zombie(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while shmpipe_test_kit::proc::stat(self.pid()).map(|s| s.state) != Some('Z') {
            assert!(
                Instant::now() < deadline,
                "the peer's main thread did not end"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Waits for the peer to exit (at most `limit`), returning success and stderr.
    pub fn finish(mut self, limit: Duration) -> (bool, String, String) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let mut rest = String::new();
                let _ = std::io::Read::read_to_string(&mut self.out, &mut rest);
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return (status.success(), rest, err);
            }
            assert!(
                Instant::now() < deadline,
                "peer did not finish within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// FNV-1a, as the peer computes it.
pub fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Writes `bytes` at `offset` of a live channel's memory, as a hostile peer would: through a
/// file of its own (opened by `/proc/<pid>/fd/<n>` from `fd`, a descriptor of the channel),
/// while both ends have the memory mapped.
pub fn poke(fd: &impl std::os::fd::AsFd, offset: usize, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(mem_path(fd))
        .expect("open channel memory to poke");
    std::os::unix::fs::FileExt::write_all_at(&f, bytes, offset as u64).expect("poke");
}

/// What a non-blocking receive got: `Some` value, `None` if the channel was empty; panics on
/// any other failure (as the `Result<Option<_>>` of the old API did under `unwrap`).
#[allow(dead_code)]
pub fn got<T>(r: Result<T, shm_ring::TryRecvError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(shm_ring::TryRecvError::Empty) => None,
        Err(e) => panic!("try_recv failed: {e}"),
    }
}

/// `blocks` blocks of 64 KiB, arrays always zero-copy, no linger: a consumer holding `blocks`
/// messages of [`send_filled`] holds the pool.
pub fn zero_copy_blocks(blocks: u32) -> shm_ring::ChannelConfig {
    shm_ring::ChannelConfig {
        blocks,
        block_size: 64 << 10,
        transfer: shm_ring::Transfer::ZeroCopy,
        linger: Duration::ZERO,
        ..shm_ring::ChannelConfig::default()
    }
}

/// Sends one message per value, its u32 array "x" (1000 values, loaned) filled with the value.
pub fn send_filled(tx: &mut shm_ring::Sender, values: impl IntoIterator<Item = u32>) {
    for v in values {
        let loan = tx.loan::<u32>(&[1000]).unwrap().fill(v);
        tx.send(shm_ring::MessageBuilder::new().array_loan("x", loan))
            .unwrap();
    }
}

/// Creates channel `name` with `cfg`, spawns the peer `args` and waits (at most 20 s) until it
/// has opened the channel as its consumer.
pub fn producer_and_consumer_peer(
    name: &str,
    cfg: &shm_ring::ChannelConfig,
    args: &[&str],
) -> (shm_ring::Sender, Peer) {
    let tx = shm_ring::Sender::<shm_ring::Message>::create(name, cfg).unwrap();
    let consumer = Peer::spawn(args);
    tx.wait_for_consumer(Duration::from_secs(20)).unwrap();
    (tx, consumer)
}

/// A new Unix `SOCK_SEQPACKET` socket (close-on-exec), as named channels use.
pub fn seqpacket() -> std::os::fd::OwnedFd {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap()
}

/// Open descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}
