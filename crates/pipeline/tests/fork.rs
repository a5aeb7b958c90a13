//! A process that runs a pipeline and forks (a forked helper of a library, `multiprocessing`'s
//! fork start method, a forked worker pool): the fork holds copies of the pipeline's handle
//! and of every descriptor (issue 16, review of the pipeline part, findings 2 and 4).
//! - Children notice their parent's death whatever forks of it hold: the fork keeps the
//!   parent's ends of their control sockets open, so an end of file never comes.
//! - The fork's copy of a `Pipeline` does nothing: dropping it neither stops nor kills the
//!   parent's children, and it cannot take the parent's outputs.

mod common;

use std::time::Duration;

use common::*;
use rustix::process::Signal;
use shmpipe::{Epochs, Pipeline};

/// In a helper: an endless pipeline (2 workers), then a fork of this process that only sleeps
/// (what `multiprocessing`'s fork, or a forked helper of any library, does); prints
/// `READY <id> <pids>,<forked pid>` and consumes.
fn helper_forking_parent(socket: bool) {
    let reg = registry();
    let mut p = endless_slow(&reg).socket_transport(socket).start().unwrap();
    // SAFETY: the child only calls async-signal-safe functions (sleep, _exit).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            libc::sleep(30);
            libc::_exit(0);
        }
    }
    use std::io::Write;
    let pids: Vec<String> = p
        .pids()
        .iter()
        .map(u32::to_string)
        .chain([pid.to_string()])
        .collect();
    println!("READY {} {}", p.id(), pids.join(","));
    std::io::stdout().flush().unwrap();
    while let Ok(Some(_)) = p.dequeue() {}
}

fn forked_parent_sigkilled(test: &str, socket: bool) {
    let reg = registry();
    shmpipe::init(&reg);
    if helper_mode().is_some() {
        return helper_forking_parent(socket);
    }
    let h = Helper::start_with(test, "fork");
    let workers: Vec<u32> = h.pids[..h.pids.len() - 1].to_vec();
    let mut h = h;
    std::thread::sleep(Duration::from_millis(300));
    signal(h.child.id(), Signal::KILL);
    let _ = h.child.wait();
    let took = wait_gone(&workers, Duration::from_secs(5));
    let alive: Vec<u32> = workers.iter().copied().filter(|&p| !gone(p)).collect();
    // Helper's drop kills the forked sleeper and any child left.
    assert!(
        took.is_some(),
        "children {alive:?} still alive 5 s after their parent was SIGKILLed (a forked copy \
         of the parent holds the parent's ends of their sockets)"
    );
    assert!(
        took.unwrap() < Duration::from_secs(2),
        "children took {took:?} to notice"
    );
}

/// ARCHITECTURE said children watch their parent through their control socket ("its end of
/// file: the parent is gone, even SIGKILLed; they exit at once"). A fork of the parent holds
/// the parent's ends too, so the end of file never came while the fork lived.
#[test]
fn children_exit_when_a_forking_parent_is_sigkilled_socket() {
    forked_parent_sigkilled(
        "children_exit_when_a_forking_parent_is_sigkilled_socket",
        true,
    );
}

/// The same with the shared-memory transport.
#[test]
fn children_exit_when_a_forking_parent_is_sigkilled_shm() {
    forked_parent_sigkilled(
        "children_exit_when_a_forking_parent_is_sigkilled_shm",
        false,
    );
}

/// Waits for the forked `pid` up to 10 s (then kills it); its exit code, or `None` if it had
/// to be killed or died by a signal.
fn reap(pid: i32) -> Option<i32> {
    let t0 = std::time::Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if t0.elapsed() > Duration::from_secs(10) {
            signal(pid as u32, Signal::KILL);
            // SAFETY: as above.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Forks this process; the child runs `f` and exits with the code it returns (`_exit`: no
/// destructor and no atexit handler of the test harness runs there). Returns the child's
/// exit code (`None`: hung, or died by a signal).
fn in_fork(f: impl FnOnce() -> i32) -> Option<i32> {
    // SAFETY: the child calls only what `f` calls, then `_exit`. `f` here touches the
    // pipeline handle the way a forked program would; that it does nothing unsafe in the child
    // (no lock another thread held at the fork, no thread joined) is what these tests check:
    // a hang is caught by `reap`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = f();
        // SAFETY: ends the forked child at once.
        unsafe { libc::_exit(code) }
    }
    reap(pid)
}

/// A forked child that drops its copy of the parent's `Pipeline` (every Rust program whose
/// forked child returns from a function holding one) sent `STOP` to every child of the
/// parent's pipeline and killed them by pid; now the drop does nothing there, and the
/// parent's pipeline runs on.
#[test]
fn a_forked_child_dropping_the_pipeline_leaves_it_running() {
    let reg = registry();
    shmpipe::init(&reg);
    let mut p = Pipeline::builder(&reg)
        .source_named("range", serde_json::json!({"n": 64, "len": 4}))
        .epochs(Epochs::Cycle)
        .step("inc")
        .workers(2)
        .start()
        .unwrap();
    let (_, pids, _g) = guarded(&p);
    assert!(p.dequeue().unwrap().is_some());
    let p = within(Duration::from_secs(30), "the fork", move || {
        let mut p = p;
        let copy: *mut Pipeline = &mut p;
        let code = in_fork(|| {
            // What a forked child's end of scope does to its copy of the handle.
            // SAFETY: in the child, `copy` points to the child's own copy of `p`, dropped
            // exactly once here; the child then exits without touching it again.
            unsafe { std::ptr::drop_in_place(copy) };
            0
        });
        (code, p)
    });
    let (code, mut p) = p;
    assert_eq!(code, Some(0), "the fork's drop hung or crashed");
    std::thread::sleep(Duration::from_millis(200));
    let alive: Vec<u32> = pids.iter().copied().filter(|&q| !gone(q)).collect();
    assert_eq!(alive, pids, "children gone after the fork's drop");
    let got = within(
        Duration::from_secs(20),
        "200 outputs after the fork",
        move || (0..200).map(|_| p.dequeue()).collect::<Result<Vec<_>, _>>(),
    );
    let got = got.unwrap_or_else(|e| panic!("the parent's pipeline failed: {e}"));
    assert!(got.iter().all(Option::is_some));
}

/// A forked child that dequeues from its copy took outputs (and their pool blocks) meant for
/// the parent; now it gets an error that says why, and the parent loses nothing.
#[test]
fn a_forked_child_cannot_take_the_outputs() {
    let reg = registry();
    shmpipe::init(&reg);
    let (mut p, _g) = start_guarded(
        Pipeline::builder(&reg)
            .source_named("range", serde_json::json!({"n": 20, "len": 4}))
            .ordered(true)
            .step("inc")
            .workers(2),
    );
    assert_eq!(p.dequeue().unwrap().unwrap().i64("n"), Some(1));
    let r = within(Duration::from_secs(30), "the fork", move || {
        let mut p = p;
        let code = in_fork(|| match p.dequeue() {
            Err(e) if e.to_string().contains("fork") => 0,
            Err(_) => 2,
            Ok(_) => 1,
        });
        (code, p)
    });
    let (code, p) = r;
    assert_eq!(
        code,
        Some(0),
        "the forked child's dequeue (1: it got an output, 2: another error)"
    );
    let rest: Vec<i64> = within(Duration::from_secs(20), "the rest", move || {
        p.map(|r| r.unwrap().i64("n").unwrap()).collect()
    });
    assert_eq!(rest, (2..=20).collect::<Vec<i64>>());
}
