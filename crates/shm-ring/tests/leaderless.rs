//! Issue 16, hole 2: a process whose main thread has ended while other threads run shows
//! `State: Z` for its thread-group leader, yet it is alive. Neither end may take it for dead:
//! a producer must not reclaim (and reuse) the blocks such a consumer still reads, and a
//! consumer must not report such a producer as `PeerDied`.
#![cfg(not(loom))]

mod common;

use std::time::Duration;

use common::{Peer, named, producer_and_consumer_peer, send_filled, zero_copy_blocks};
use shm_ring::{
    LoanError, Message, MessageBuilder, Receiver, RecvError, RecvTimeoutError, SendError,
};

#[test]
fn a_consumer_whose_main_thread_ended_keeps_its_blocks() {
    let (name, guard) = named("leaderless-c");
    let cfg = zero_copy_blocks(2);
    let (mut tx, mut consumer) =
        producer_and_consumer_peer(&name, &cfg, &["hold-leaderless", &name, "2"]);
    send_filled(&mut tx, 1..=2);
    assert_eq!(consumer.line(), "held");
    consumer.wait_leader_zombie();
    // The consumer lives on in its second thread and holds both blocks: no block may come
    // back, however long the producer waits and however often it checks.
    let checked = tx.check_consumer();
    let loaned = tx.loan_timeout::<u32>(&[1000], Duration::from_millis(600));
    // What a reused block does to the reader: new values under its view.
    let reused = loaned.map(|l| {
        let _ = tx.send(MessageBuilder::new().array_loan("x", l.fill(7)));
    });
    consumer.tell("check");
    let sums = consumer.line();
    assert!(checked.is_ok(), "live consumer judged gone: {checked:?}");
    assert!(
        matches!(reused, Err(LoanError::Timeout)),
        "a block of the live consumer was taken back: {reused:?}"
    );
    assert_eq!(sums, "sums 1000 2000", "the live consumer's arrays changed");
    assert_eq!(tx.free_blocks().unwrap(), 0);
    // Once its last thread is gone it is dead, and its blocks come back.
    consumer.kill();
    match tx.loan_timeout::<u32>(&[10], Duration::from_secs(5)) {
        Err(LoanError::Send(SendError::PeerDied { reclaimed, .. })) => assert_eq!(reclaimed, 2),
        other => panic!("expected PeerDied, got {other:?}"),
    }
    drop(tx);
    guard.assert_gone();
}

#[test]
fn a_producer_whose_main_thread_ended_is_not_reported_dead() {
    let (name, guard) = named("leaderless-p");
    let mut producer = Peer::spawn(&["produce-leaderless", &name]);
    assert_eq!(producer.line(), "ready");
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    producer.wait_leader_zombie();
    // Several liveness checks (every 50 ms) run during this wait: the producer is alive.
    let r = rx.recv_timeout(Duration::from_millis(600)).map(|m| m.tag());
    assert!(
        matches!(r, Err(RecvTimeoutError::Timeout)),
        "live producer judged gone: {r:?}"
    );
    producer.tell("send");
    assert_eq!(producer.line(), "sent");
    let m = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(m.record(0).unwrap().meta_i64("seq"), Some(0));
    drop(m);
    producer.kill();
    let r = rx.recv_timeout(Duration::from_secs(5)).map(|m| m.tag());
    assert!(
        matches!(r, Err(RecvTimeoutError::Failed(RecvError::PeerDied { .. }))),
        "{r:?}"
    );
    drop(rx);
    drop(guard);
}
