//! A producer that sends and exits before (or after) its consumer starts: both start orders,
//! in two real processes, deliver every message; a sender nobody opens leaves nothing behind.
#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::{Peer, named, socket_path, unique};
use shm_ring::{
    ChannelConfig, LoanError, Message, OpenError, Receiver, RecvError, SendError, Sender,
};

const COUNT: &str = "200";

#[test]
fn producer_first_then_consumer_gets_every_message() {
    let (name, guard) = named("linger-a-first");
    // A creates, sends everything and drops its sender before B exists.
    let mut producer = Peer::spawn(&["produce", &name, COUNT]);
    assert_eq!(producer.line(), "sent");
    std::thread::sleep(Duration::from_millis(200));
    let consumer = Peer::spawn(&["consume", &name, COUNT, "10000"]);
    let (ok, out, err) = consumer.finish(Duration::from_secs(30));
    assert!(ok, "consumer failed: {err}");
    assert_eq!(out.trim(), format!("ok {COUNT}"));
    let (ok, out, err) = producer.finish(Duration::from_secs(30));
    assert!(ok, "producer failed: {err}");
    assert_eq!(out.trim(), "closed");
    guard.assert_gone();
}

#[test]
fn consumer_first_then_producer_gets_every_message() {
    let (name, guard) = named("linger-b-first");
    // B waits for a channel that does not exist yet.
    let consumer = Peer::spawn(&["consume", &name, COUNT, "10000"]);
    std::thread::sleep(Duration::from_millis(200));
    let producer = Peer::spawn(&["produce", &name, COUNT]);
    let (ok, out, err) = consumer.finish(Duration::from_secs(30));
    assert!(ok, "consumer failed: {err}");
    assert_eq!(out.trim(), format!("ok {COUNT}"));
    let (ok, out, err) = producer.finish(Duration::from_secs(30));
    assert!(ok, "producer failed: {err}");
    assert_eq!(out.trim(), "sent\nclosed");
    guard.assert_gone();
}

#[test]
fn a_sender_nobody_opens_unlinks_after_its_linger() {
    let (name, guard) = named("linger-alone");
    let cfg = ChannelConfig {
        linger: Duration::from_millis(300),
        ..ChannelConfig::default()
    };
    let tx = Sender::<Message>::create(&name, &cfg).unwrap();
    let t0 = Instant::now();
    drop(tx);
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(300),
        "dropped after {waited:?}, before the linger ended"
    );
    assert!(waited < Duration::from_secs(5), "lingered {waited:?}");
    guard.assert_gone();
    match Receiver::<Message>::open(&name) {
        Err(OpenError::NotFound(_)) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[test]
fn zero_linger_unlinks_at_once_and_open_timeout_gives_up() {
    let (name, guard) = named("linger-zero");
    let cfg = ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    };
    let tx = Sender::<Message>::create(&name, &cfg).unwrap();
    let t0 = Instant::now();
    drop(tx);
    assert!(t0.elapsed() < Duration::from_millis(200));
    assert!(!socket_path(&name).exists());
    let t0 = Instant::now();
    let e = Receiver::<Message>::open_timeout(&name, Duration::from_millis(100)).unwrap_err();
    assert!(matches!(e, OpenError::NotFound(_)), "{e:?}");
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(100), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    guard.assert_gone();
}

#[test]
fn an_attached_consumer_ends_the_linger_at_once() {
    let (name, guard) = named("linger-attached");
    let tx = Sender::<Message>::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    let t0 = Instant::now();
    drop(tx);
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    drop(rx);
    guard.assert_gone();
}

#[test]
fn errors_say_what_to_change() {
    let e = Receiver::<Message>::open(&unique("nobody"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Receiver::open_timeout"), "{e}");
    assert!(e.contains("not created it yet"), "{e}");
    let (name, guard) = named("too-large");
    let cfg = ChannelConfig {
        blocks: 2,
        block_size: 4096,
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::create(&name, &cfg).unwrap();
    let e = tx.loan::<f32>(&[2000]).unwrap_err();
    assert!(
        matches!(e, LoanError::Send(SendError::TooLarge { needed: 8000, .. })),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(
        e.contains("ChannelConfig::block_size to at least 8000"),
        "{e}"
    );
    drop(tx);
    guard.assert_gone();
}
