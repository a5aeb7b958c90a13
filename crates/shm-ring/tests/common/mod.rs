//! Helpers shared by the cross-process tests: unique names, child processes that are killed
//! and reaped even when a test fails, and a check that no segment of the test survives.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A name unique to this process and call, so tests can run in parallel.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "t-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn shm_path(name: &str) -> String {
    format!("/dev/shm/{}{}", shm_ring::NAME_PREFIX, name)
}

/// Removes the named segments when dropped (after asserting, in `assert_gone`, that they are
/// gone), so a failing test still leaves nothing behind.
pub struct ShmGuard(pub Vec<String>);

impl ShmGuard {
    pub fn new(names: &[&str]) -> Self {
        ShmGuard(names.iter().map(|s| s.to_string()).collect())
    }
    pub fn assert_gone(&self) {
        for n in &self.0 {
            assert!(
                !std::path::Path::new(&shm_path(n)).exists(),
                "segment {n} leaked in /dev/shm"
            );
        }
    }
}

impl Drop for ShmGuard {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = std::fs::remove_file(shm_path(n));
        }
    }
}

/// A child process that is SIGKILLed and reaped when dropped.
pub struct Peer {
    pub child: Child,
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
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn peer");
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

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
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

/// Runs `script` with `sh -c` in a private mount namespace whose `/dev/shm` is a fresh 16 MB
/// tmpfs (a small container's), and returns its exit status, stdout and stderr. Needs root.
pub fn in_small_dev_shm(script: &str) -> (std::process::ExitStatus, String, String) {
    let script = format!("mount -t tmpfs -o size=16m tmpfs /dev/shm && {script}");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("run unshare");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
