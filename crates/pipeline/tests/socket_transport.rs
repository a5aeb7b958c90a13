//! The socket transport under a worker that misbehaves (issue 16, hole 5): a worker that
//! writes the start of a batch and stays alive must not block the consumer, and the death of
//! another worker meanwhile is reported as quickly as with the shared-memory transport. Writes
//! too are bounded: a worker that dies while a process it forked holds its socket does not
//! hold the parent's input thread (and with it the error report) in a blocked write (review
//! of issue 16's pipeline part, finding 3).

mod common;

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use common::*;
use rustix::process::Signal;
use shmpipe::{Error, Item, Pipeline, Registry, map};

/// Writes a length prefix (100 bytes announced, none sent) on every stream socket of this
/// process: a worker's output connection is one of them.
fn write_a_prefix_everywhere() {
    for (fd, _) in proc::fd_links(std::process::id()) {
        let Some(n) = fd.file_name().and_then(|n| n.to_str()?.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: `n` was open a moment ago in this process and nothing closes descriptors
        // in a worker while its step runs; a number that is closed makes the calls fail.
        let fd = unsafe { BorrowedFd::borrow_raw(n) };
        if rustix::net::sockopt::socket_type(fd) == Ok(rustix::net::SocketType::STREAM) {
            let _ = rustix::io::write(fd, &100u64.to_le_bytes());
        }
    }
}

/// Writes one whole error report, as the pipeline's wire encodes it (`wire.rs`: message tag
/// 3, an error; record tag 1, a step's failure), on every stream socket of this process: the
/// worker's output connection is one of them. Its indices are `(stage, worker, emitter)`.
fn forge_a_report_everywhere(stage: i64, worker: i64, emitter: i64) {
    let b = shm_ring::MessageBuilder::new()
        .tag(3)
        .record_tag(1)
        .meta_str("step", "forged")
        .meta_i64("stage", stage)
        .meta_i64("worker", worker)
        .meta_str("input", "emitter 0, record 0")
        .meta_str("message", "forged by a hostile worker")
        .meta_i64("emitter", emitter)
        .meta_i64("record", 0);
    let (words, len) = b.encode_inline().unwrap();
    let mut msg = (len as u64).to_le_bytes().to_vec();
    msg.extend_from_slice(&bytemuck::cast_slice::<u64, u8>(&words)[..len]);
    for (fd, _) in proc::fd_links(std::process::id()) {
        let Some(n) = fd.file_name().and_then(|n| n.to_str()?.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: as in `write_a_prefix_everywhere`.
        let fd = unsafe { BorrowedFd::borrow_raw(n) };
        if rustix::net::sockopt::socket_type(fd) == Ok(rustix::net::SocketType::STREAM) {
            let _ = rustix::io::write(fd, &msg);
        }
    }
}

fn reg() -> Registry {
    registry()
        .step("forge_report", |cx| {
            let idx = |k: &str| cx.args[k].as_i64().unwrap_or(0);
            let (stage, worker, emitter) = (idx("stage"), idx("worker"), idx("emitter"));
            Ok(map(move |it: Item| {
                forge_a_report_everywhere(stage, worker, emitter);
                std::thread::sleep(Duration::from_secs(120));
                Ok(it)
            }))
        })
        .step("fork_then_die", |cx| {
            let pid_file = cx.args["pid_file"].as_str().unwrap_or_default().to_owned();
            Ok(map(move |_it: Item| {
                // SAFETY: the child only calls async-signal-safe functions (sleep, _exit).
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    // SAFETY: as above.
                    unsafe {
                        libc::sleep(25);
                        libc::_exit(0);
                    }
                }
                std::fs::write(&pid_file, pid.to_string()).unwrap();
                // SAFETY: ends this worker at once, as a crash would.
                unsafe { libc::_exit(3) }
            }))
        })
        .step("stall_mid_batch", |cx| {
            let w = cx.worker.worker;
            Ok(map(move |it: Item| {
                if w == 0 {
                    write_a_prefix_everywhere();
                    std::thread::sleep(Duration::from_secs(120));
                }
                Ok(it)
            }))
        })
}

/// Worker 0 writes the start of a batch and stalls (alive); worker 1 is SIGKILLed. Before the
/// fix the consumer sat in `read_exact` on worker 0 and never reported worker 1.
#[test]
fn a_stalled_worker_does_not_hide_a_dead_one() {
    let reg = reg();
    shmpipe::init(&reg);
    let mut p = Pipeline::builder(&reg)
        .step("stall_mid_batch")
        .workers(2)
        .socket_transport(true)
        .start()
        .unwrap();
    let (_, pids, _g) = guarded(&p);
    // Item k goes to worker k % 2.
    for n in 0..2 {
        p.enqueue(Item::new().with_meta("n", n)).unwrap();
    }
    // Wait until worker 1 has answered (so both workers have their item).
    let first = within(Duration::from_secs(10), "worker 1's output", move || {
        let r = p.dequeue().map(|o| o.and_then(|i| i.i64("n")));
        (r, p)
    });
    let (r, mut p) = first;
    assert_eq!(r.unwrap(), Some(1));
    std::thread::sleep(Duration::from_millis(200));
    signal(pids[1], Signal::KILL);
    let t0 = Instant::now();
    let (err, took) = within(
        Duration::from_secs(10),
        "dequeue after a death",
        move || {
            let err = p.by_ref().find_map(Result::err);
            (err, t0.elapsed())
        },
    );
    match err {
        Some(Error::ProcessDied { pid, status, .. }) => {
            assert_eq!(pid, pids[1]);
            assert!(status.contains("signal 9"), "{status}");
        }
        other => panic!("expected worker 1's death, got {other:?}"),
    }
    assert!(took < Duration::from_secs(3), "reported after {took:?}");
}

/// SIGKILLs the process whose pid a step wrote to this file, on drop.
struct KillPidInFile(std::path::PathBuf);

impl KillPidInFile {
    fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(&self.0).ok()?.trim().parse().ok()
    }
}

impl Drop for KillPidInFile {
    fn drop(&mut self) {
        drop(KillOnDrop(self.pid().into_iter().collect()));
    }
}

/// Enqueue mode: the worker forks a helper (what a step using `multiprocessing` with the fork
/// start method, or any library that forks without exec, does) and dies while the helper
/// lives. The parent's input thread was blocked in `write_all` on the dead worker's socket
/// (the fork holds its other end, so no EPIPE came); the consumer saw the death, but its
/// teardown joined the input thread without a bound, so `dequeue` returned only when the
/// fork ended.
#[test]
fn a_dead_worker_that_left_a_fork_is_reported_in_bounded_time() {
    let reg = reg();
    shmpipe::init(&reg);
    let pid_file = TempFile::new("forked-pid", "txt");
    let fork = KillPidInFile(pid_file.0.clone());
    let mut p = Pipeline::builder(&reg)
        .step_with(
            "fork_then_die",
            serde_json::json!({"pid_file": pid_file.0.display().to_string()}),
        )
        .workers(1)
        .socket_transport(true)
        .start()
        .unwrap();
    let (_, pids, _g) = guarded(&p);
    for n in 0..2000 {
        p.enqueue(
            Item::new()
                .with_meta("n", n)
                .with("x", shmpipe::ndarray::Array1::<f32>::zeros(1024)),
        )
        .unwrap();
    }
    let t0 = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let err = p.dequeue().err();
        let _ = tx.send(err);
        drop(p);
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    let took = t0.elapsed();
    let forked = fork.pid();
    // Unblock the pipeline (kill the fork) before asserting, so nothing is left behind.
    drop(fork);
    let late = rx.recv_timeout(Duration::from_secs(5));
    let _ = h.join();
    let got = got.unwrap_or_else(|_| {
        panic!(
            "no error 10 s after the worker died (fork {forked:?} alive); once the fork was \
             killed: {late:?} after {:?}",
            t0.elapsed()
        )
    });
    match got {
        Some(Error::ProcessDied { pid, status, .. }) => {
            assert_eq!(pid, pids[0]);
            assert!(status.contains("code 3"), "{status}");
        }
        other => panic!("expected the worker's death, got {other:?}"),
    }
    assert!(took < Duration::from_secs(3), "reported after {took:?}");
}

/// Review 18, hole 4: the indices of a worker's error report (stage, worker, emitter) were
/// cast from the wire without a check, so a hostile or broken worker could blame a worker or
/// stage that does not exist (a negative one became 2^64 - 1). Each is checked against the
/// pipeline's own counts; a report out of range is a protocol error naming the worker that
/// sent it.
#[test]
fn an_error_report_naming_a_worker_that_does_not_exist_is_refused() {
    let reg = reg();
    shmpipe::init(&reg);
    let cases = [
        (0, 7, 0, "worker 7 of stage 0"),
        (5, 0, 0, "stage 5"),
        (0, -1, 0, "worker -1"),
        (0, 0, -3, "emitter -3"),
        (0, 0, 9, "emitter 9"),
    ];
    for (stage, worker, emitter, named) in cases {
        let mut p = Pipeline::builder(&reg)
            .step_with(
                "forge_report",
                serde_json::json!({"stage": stage, "worker": worker, "emitter": emitter}),
            )
            .workers(1)
            .socket_transport(true)
            .start()
            .unwrap();
        let (_, _pids, _g) = guarded(&p);
        p.enqueue(Item::new().with_meta("n", 0)).unwrap();
        let (err, p) = within(Duration::from_secs(20), "the forged report", move || {
            (p.dequeue().err(), p)
        });
        drop(p);
        let case = format!("stage {stage}, worker {worker}, emitter {emitter}");
        match err {
            Some(Error::Transport { message, .. }) => assert!(
                message.contains("worker 0 (stage 0)") && message.contains(named),
                "{case}: {message}"
            ),
            other => panic!("{case}: expected a protocol error naming worker 0, got {other:?}"),
        }
    }
}
