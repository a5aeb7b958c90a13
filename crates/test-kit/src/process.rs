//! Processes a test starts: killed (and reaped) on drop, and checked gone.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// SIGKILLs these processes on drop (for a test that fails half-way). For processes that are
/// not our children (a pipeline's workers): their parent reaps them.
#[derive(Debug)]
pub struct KillOnDrop(pub Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &p in &self.0 {
            if !gone(p) {
                signal(p, Signal::KILL);
            }
        }
    }
}

/// A child process that is SIGKILLed and reaped when dropped, so a failing test leaves no
/// process (nor zombie) behind. Derefs to the [`Child`].
#[derive(Debug)]
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// Kills and reaps the child now (nothing if it already ended).
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A command that runs test `test` of this test binary again, alone (`--exact`, with its
/// output shown): the way a test starts itself as a helper process. Give it an environment
/// variable that tells the re-run it is the helper.
///
/// # Panics
/// If the path of this executable is unknown.
pub fn rerun_test(test: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("path of the test binary"));
    c.args(["--exact", test, "--nocapture"]);
    c
}

/// Sends `sig` to `pid`, ignoring a process that is already gone.
pub fn signal(pid: u32, sig: Signal) {
    if let Some(p) = Pid::from_raw(pid as i32) {
        let _ = kill_process(p, sig);
    }
}

/// Whether process `pid` is gone (or a zombie: it has ended, only its parent's wait is
/// missing).
pub fn gone(pid: u32) -> bool {
    crate::proc::stat(pid).is_none_or(|s| s.state == 'Z')
}

/// Waits until every pid is [`gone`]; returns how long it took, or `None` after `timeout`.
pub fn wait_gone(pids: &[u32], timeout: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    loop {
        if pids.iter().all(|&p| gone(p)) {
            return Some(t0.elapsed());
        }
        if t0.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `f` on a thread and panics if it takes longer than `limit` (a hang becomes a failure;
/// the thread is left behind).
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what} took more than {limit:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_guard_kills_and_reaps() {
        let pid;
        {
            let g = ChildGuard(Command::new("sleep").arg("30").spawn().unwrap());
            pid = g.id();
            assert!(!gone(pid));
        }
        // Reaped, not a zombie: the pid is gone from /proc (unless reused at once).
        assert!(crate::proc::stat(pid).is_none_or(|s| s.ppid != std::process::id()));
    }

    #[test]
    fn kill_on_drop_kills_and_wait_gone_sees_it() {
        let mut c = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = c.id();
        drop(KillOnDrop(vec![pid]));
        assert!(wait_gone(&[pid], Duration::from_secs(5)).is_some());
        c.wait().unwrap();
        assert!(wait_gone(&[pid], Duration::ZERO).is_some());
    }

    #[test]
    fn wait_gone_times_out_on_a_live_process() {
        let _c = ChildGuard(Command::new("sleep").arg("30").spawn().unwrap());
        assert!(wait_gone(&[_c.id()], Duration::from_millis(30)).is_none());
    }

    #[test]
    fn rerun_test_runs_one_test_of_this_binary() {
        if std::env::var_os("SHMPIPE_TEST_KIT_RERUN").is_some() {
            println!("RERUN-OK");
            return;
        }
        let out = rerun_test("process::tests::rerun_test_runs_one_test_of_this_binary")
            .env("SHMPIPE_TEST_KIT_RERUN", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("RERUN-OK"), "{text}");
        assert!(
            text.contains("1 passed"),
            "ran more than the one test: {text}"
        );
    }

    #[test]
    fn within_returns_the_value_or_panics_on_a_hang() {
        assert_eq!(within(Duration::from_secs(5), "add", || 2 + 2), 4);
        let r = std::panic::catch_unwind(|| {
            within(Duration::from_millis(20), "sleep", || {
                std::thread::sleep(Duration::from_millis(500))
            })
        });
        assert!(r.is_err());
    }
}
