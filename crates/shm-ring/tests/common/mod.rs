//! shm-ring's own test helpers: unique channel names, the `shm-ring-peer` child process, the
//! peer's checksum, and writes into a live segment. The generic guards (`/dev/shm`, processes,
//! `/proc`, a small `/dev/shm`) are in `shmpipe-test-kit`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use shmpipe_test_kit::{ChildGuard, ShmGuard};

/// A channel name unique to this process and call, so tests can run in parallel.
pub fn unique(tag: &str) -> String {
    format!("t-{}", shmpipe_test_kit::unique_name(tag))
}

/// The `/dev/shm` path of channel `name`.
pub fn shm_path(name: &str) -> String {
    format!("/dev/shm/{}{}", shm_ring::NAME_PREFIX, name)
}

/// A guard over the segments of these channel names (see [`ShmGuard`]).
pub fn shm_guard(names: &[&str]) -> ShmGuard {
    ShmGuard::new(
        names
            .iter()
            .map(|n| format!("{}{n}", shm_ring::NAME_PREFIX)),
    )
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

/// Writes `bytes` at `offset` of the live segment `name`, as a hostile peer would (through
/// its own file descriptor, while both ends have the segment mapped).
pub fn poke(name: &str, offset: usize, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(shm_path(name))
        .expect("open segment to poke");
    std::os::unix::fs::FileExt::write_all_at(&f, bytes, offset as u64).expect("poke");
}
