//! "Cannot tell" is not "dead": a consumer that cannot read `/proc` (here: out of file
//! descriptors) must keep waiting for its live producer, not report it dead.
//!
//! Alone in its own test binary because it exhausts the process's file descriptors; the tests
//! of this file take turns (`FDS`), as `cargo test` runs them as threads of one process.
#![cfg(not(loom))]

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::{named, producer_and_consumer_peer, send_filled, zero_copy_blocks};
use rustix::process::{Resource, Rlimit};
use shm_ring::{ChannelConfig, LoanError, Message, Receiver, RecvTimeoutError, Sender};

static FDS: Mutex<()> = Mutex::new(());

/// Lowers the descriptor limit to 256 and opens descriptors until none is left; returns
/// them and the old limit (for [`restore`]).
fn exhaust_descriptors() -> (Vec<std::fs::File>, Rlimit) {
    let old = rustix::process::getrlimit(Resource::Nofile);
    rustix::process::setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(256),
            maximum: old.maximum,
        },
    )
    .unwrap();
    let mut hog = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        hog.push(f);
    }
    (hog, old)
}

fn restore((hog, old): (Vec<std::fs::File>, Rlimit)) {
    drop(hog);
    rustix::process::setrlimit(Resource::Nofile, old).unwrap();
}

#[test]
fn out_of_file_descriptors_is_not_a_dead_producer() {
    let _turn = FDS.lock().unwrap_or_else(|e| e.into_inner());
    let (name, guard) = named("emfile");
    let tx = Sender::<Message>::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    let hog = exhaust_descriptors();
    // The producer is alive (it is us); several liveness checks run during this wait.
    let res = rx.recv_timeout(Duration::from_millis(500));
    restore(hog);
    assert!(
        matches!(res, Err(RecvTimeoutError::Timeout)),
        "expected Timeout, got {res:?}"
    );
    drop((tx, rx));
    guard.assert_gone();
}

/// The producer side of the same rule (issue 8, "cannot tell is treated as dead"): a producer
/// that judges its consumer's claim while `/proc` cannot be read must not declare the live
/// consumer dead and take back the blocks it is reading.
#[test]
fn out_of_file_descriptors_is_not_a_dead_consumer() {
    let _turn = FDS.lock().unwrap_or_else(|e| e.into_inner());
    let (name, guard) = named("emfile-c");
    let cfg = zero_copy_blocks(2);
    let (mut tx, mut consumer) = producer_and_consumer_peer(&name, &cfg, &["hold", &name, "2"]);
    send_filled(&mut tx, 0..2);
    assert_eq!(consumer.line(), "held 2");
    // The consumer is alive and holds both blocks. Judge its claim with no descriptor left
    // (the claim is first judged here), then wait for a block a little.
    let hog = exhaust_descriptors();
    let checked = tx.check_consumer();
    let loaned = tx
        .loan_timeout::<u32>(&[10], Duration::from_millis(300))
        .map(|_| ());
    restore(hog);
    assert!(checked.is_ok(), "live consumer judged gone: {checked:?}");
    assert!(
        matches!(loaned, Err(LoanError::Timeout)),
        "expected Timeout, got {loaned:?}"
    );
    assert_eq!(
        tx.free_blocks().unwrap(),
        0,
        "the live consumer's blocks were taken"
    );
    // With /proc readable again the claim is judged for real: the consumer is alive.
    assert!(tx.check_consumer().is_ok());
    consumer.kill();
    drop(tx);
    guard.assert_gone();
}
