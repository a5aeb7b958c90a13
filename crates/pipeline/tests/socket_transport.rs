//! The socket transport under a worker that misbehaves (issue 16, hole 5): a worker that
//! writes the start of a batch and stays alive must not block the consumer, and the death of
//! another worker meanwhile is reported as quickly as with the shared-memory transport.

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

fn reg() -> Registry {
    registry().step("stall_mid_batch", |cx| {
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
    let (id, pids) = (p.id().to_owned(), p.pids());
    let _g = (ShmGuard::containing(id), KillOnDrop(pids.clone()));
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
