//! Publishing in batches without delaying anyone: a lone message is published at once, the
//! receiver hands read slots back in batches, but never keeps a blocked sender waiting.
#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::named;
use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, Sender};

/// Waits until the `sender` thread, blocked on a full ring, sleeps on the futex; takes one
/// message with `take_one`; then joins the thread and asserts its send succeeded within 2 s of
/// that (`what` names the sender in the failure). Returns the sender.
fn join_after_one_taken<T, E: std::fmt::Debug>(
    sender: std::thread::JoinHandle<(Result<(), E>, Instant, T)>,
    take_one: impl FnOnce(),
    what: &str,
) -> T {
    // Long enough for the sender to stop spinning and sleep on the futex.
    std::thread::sleep(Duration::from_millis(200));
    take_one();
    let took_one = Instant::now();
    let (r, done, tx) = sender.join().unwrap();
    r.unwrap();
    let lag = done.saturating_duration_since(took_one);
    assert!(
        lag < Duration::from_secs(2),
        "{what} went on {lag:?} after a slot was taken"
    );
    tx
}

/// A sender blocked on a full ring goes on as soon as the receiver takes one message, although
/// the receiver hands slots back only in batches of a quarter of the ring otherwise.
#[test]
fn a_blocked_sender_proceeds_when_one_message_is_taken() {
    let (name, guard) = named("batch-full");
    let cfg = ChannelConfig {
        slots: 64,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::create(&name, &cfg).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    let mut sent = 0;
    while tx.try_send(MessageBuilder::new().tag(sent)).is_ok() {
        sent += 1;
    }
    assert_eq!(sent, 64, "one slot per message");
    let sender = std::thread::spawn(move || {
        let r = tx.send_timeout(MessageBuilder::new().tag(64), Duration::from_secs(10));
        (r, Instant::now(), tx)
    });
    let tx = join_after_one_taken(
        sender,
        || {
            assert_eq!(rx.recv().unwrap().tag(), 0);
        },
        "the sender",
    );
    for i in 1..=64 {
        assert_eq!(rx.recv().unwrap().tag(), i);
    }
    drop((tx, rx));
    guard.assert_gone();
}

/// A lone message is visible to the receiver at once (no batching on the sending side), and
/// a burst sent with `send_batch` arrives whole and in order.
#[test]
fn lone_messages_are_not_held_back_and_bursts_arrive_whole() {
    let (name, guard) = named("batch-lone");
    let mut tx = Sender::<Message>::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    for i in 0..10 {
        tx.send(MessageBuilder::new().tag(i)).unwrap();
        // Non-blocking: the message must already be published.
        assert_eq!(common::got(rx.try_recv()).map(|m| m.tag()), Some(i));
    }
    let n = tx
        .send_batch((100..150).map(|i| MessageBuilder::new().tag(i)))
        .unwrap();
    assert_eq!(n, 50);
    let mut got = Vec::new();
    while let Some(m) = common::got(rx.try_recv()) {
        got.push(m.tag());
    }
    assert_eq!(got, (100..150).collect::<Vec<_>>());
    drop((tx, rx));
    guard.assert_gone();
}

/// The typed path, as `a_blocked_sender_proceeds_when_one_message_is_taken`: a `Receiver<T>`
/// must not hold the slots it read across calls while its producer waits for room (it used to
/// hand them back once per quarter of the ring, so this sender timed out).
#[test]
fn a_blocked_typed_sender_proceeds_when_one_value_is_taken() {
    let (name, guard) = named("batch-typed-full");
    let cfg = ChannelConfig {
        slots: 64,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<[f32; 16]>::create(&name, &cfg).unwrap();
    let mut rx = Receiver::<[f32; 16]>::open(&name).unwrap();
    let mut sent = 0u32;
    while tx.try_send([sent as f32; 16]).is_ok() {
        sent += 1;
    }
    assert_eq!(sent, 64, "one slot per value");
    let sender = std::thread::spawn(move || {
        let r = tx.send_timeout([64.0; 16], Duration::from_secs(10));
        (r, Instant::now(), tx)
    });
    let tx = join_after_one_taken(
        sender,
        || {
            assert_eq!(rx.recv().unwrap()[0], 0.0);
        },
        "the typed sender",
    );
    for i in 1..=64 {
        assert_eq!(rx.recv().unwrap()[0], i as f32);
    }
    drop((tx, rx));
    guard.assert_gone();
}
