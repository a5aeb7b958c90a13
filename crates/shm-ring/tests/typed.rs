//! The typed path: `Sender<T>` / `Receiver<T>`, one `Pod` value per ring slot.
//! In-process behaviour (batches, `try_send` giving the value back, drain then Disconnected,
//! opening as the wrong type) and across real processes (a killed peer is `PeerDied` within a
//! second; a closed one drains, then Disconnected).
#![cfg(not(loom))]

mod common;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use common::{Peer, name_guard, named, unique};
use shm_ring::{
    ChannelConfig, CreateError, Message, OpenError, Receiver, RecvError, RecvTimeoutError,
    SchemaError, SendError, SendTimeoutError, Sender, TryRecvError, TrySendError,
};

fn no_linger() -> ChannelConfig {
    ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    }
}

fn anon<T: bytemuck::Pod>(cfg: &ChannelConfig) -> (Sender<T>, Receiver<T>) {
    let tx = Sender::<T>::anonymous(cfg).unwrap();
    let fd = tx.as_fd().try_clone_to_owned().unwrap();
    (tx, Receiver::<T>::from_fd(fd).unwrap())
}

#[test]
fn values_arrive_in_order_through_every_call_then_disconnected() {
    let cfg = ChannelConfig {
        slots: 8,
        ..no_linger()
    };
    let (mut tx, mut rx) = anon::<[f32; 16]>(&cfg);
    assert_eq!(tx.config().slot_size, 64);
    assert_eq!(tx.config().blocks, 0);
    // More than the ring holds in one send_batch, with a consumer in another thread.
    let many: Vec<[f32; 16]> = (0..100).map(|i| [i as f32; 16]).collect();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        loop {
            match rx.recv() {
                Ok(v) => got.push(v),
                Err(RecvError::Disconnected) => return got,
                Err(e) => panic!("{e}"),
            }
        }
    });
    tx.send(&[-1.0; 16]).unwrap();
    assert_eq!(tx.send_batch(&many).unwrap(), 100);
    tx.send(&[-2.0; 16]).unwrap();
    assert_eq!(tx.stats().messages, 102);
    drop(tx);
    let got = reader.join().unwrap();
    assert_eq!(got.len(), 102);
    assert_eq!(got[0], [-1.0; 16]);
    assert_eq!(&got[1..101], &many[..]);
    assert_eq!(got[101], [-2.0; 16]);
}

#[test]
fn try_recv_recv_batch_and_timeouts() {
    let (mut tx, mut rx) = anon::<u64>(&no_linger());
    assert_eq!(common::got(rx.try_recv()), None);
    assert!(matches!(
        rx.recv_timeout(Duration::from_millis(20)),
        Err(RecvTimeoutError::Timeout)
    ));
    tx.send(&7).unwrap();
    tx.send(&8).unwrap();
    assert_eq!(common::got(rx.try_recv()), Some(7));
    let mut seen = Vec::new();
    assert_eq!(rx.recv_batch(8, None, |v| seen.push(v * 2)).unwrap(), 1);
    assert_eq!(seen, [16]);
    drop(tx); // closes the channel
    assert!(matches!(
        rx.try_recv(),
        Err(TryRecvError::Failed(RecvError::Disconnected))
    ));
    assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
}

#[test]
fn try_send_gives_the_value_back_when_full() {
    let cfg = ChannelConfig {
        slots: 4,
        ..no_linger()
    };
    let (mut tx, mut rx) = anon::<[u32; 3]>(&cfg);
    for i in 0..4 {
        tx.try_send([i; 3]).unwrap();
    }
    match tx.try_send([9, 8, 7]) {
        Err(TrySendError::Full(v)) => assert_eq!(v, [9, 8, 7]),
        other => panic!("expected Full([9, 8, 7]), got {other:?}"),
    }
    assert!(matches!(
        tx.send_timeout([5; 3], Duration::from_millis(20)),
        Err(SendTimeoutError::Timeout([5, 5, 5]))
    ));
    assert_eq!(rx.recv().unwrap(), [0; 3]);
    // The slot read is handed back (the ring was full, so at once): room for one more.
    tx.try_send([4; 3]).unwrap();
    for i in 1..5 {
        assert_eq!(rx.recv().unwrap(), [i; 3]);
    }
    drop(rx);
    match tx.try_send([1, 2, 3]) {
        Err(TrySendError::Disconnected(v)) => assert_eq!(v, [1, 2, 3]),
        other => panic!("expected Disconnected, got {other:?}"),
    }
    assert!(matches!(tx.send(&[0; 3]), Err(SendError::Disconnected)));
}

fn assert_mismatch<T: std::fmt::Debug>(r: Result<T, OpenError>, channel: &str, expected: &str) {
    match r {
        Err(OpenError::Schema(SchemaError::Mismatch {
            channel: c,
            expected: e,
        })) => {
            assert!(c.contains(channel), "{c:?} lacks {channel:?}");
            assert!(e.contains(expected), "{e:?} lacks {expected:?}");
        }
        other => panic!("expected a schema mismatch, got {other:?}"),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Point {
    t: u64,
    x: f32,
    y: f32,
}

#[test]
fn opening_as_another_type_is_refused_and_leaves_the_channel_usable() {
    let (name, guard) = named("typed-mismatch");
    let mut tx = Sender::<[f32; 16]>::create(&name, &no_linger()).unwrap();
    assert_mismatch(
        Receiver::<[f64; 16]>::open(&name),
        "f32 array of shape [16]",
        "f64 array of shape [16]",
    );
    // Same size and alignment, another dtype.
    assert_mismatch(Receiver::<[u32; 16]>::open(&name), "f32 array", "u32 array");
    assert_mismatch(
        Receiver::<[[f32; 4]; 4]>::open(&name),
        "shape [16]",
        "shape [4, 4]",
    );
    assert_mismatch(
        Receiver::<Message>::open(&name),
        "f32 array",
        "self-describing",
    );
    assert_mismatch(
        Receiver::<Message>::open_timeout(&name, Duration::from_secs(1)),
        "f32 array",
        "self-describing",
    );
    // None of the refused openers claimed or closed the channel.
    let mut rx = Receiver::<[f32; 16]>::open(&name).unwrap();
    tx.send(&[3.0; 16]).unwrap();
    assert_eq!(rx.recv().unwrap(), [3.0; 16]);
    drop((tx, rx));
    guard.assert_gone();

    // A user struct is opaque: size and alignment are what is checked.
    let (name, guard) = named("typed-struct");
    let mut tx = Sender::<Point>::create(&name, &no_linger()).unwrap();
    assert_mismatch(
        Receiver::<[u64; 2]>::open(&name),
        "opaque 16-byte value",
        "u64 array",
    );
    assert_mismatch(Receiver::<[u64; 3]>::open(&name), "opaque", "u64");
    let mut rx = Receiver::<Point>::open(&name).unwrap();
    tx.send(&Point {
        t: 1,
        x: 2.0,
        y: 3.0,
    })
    .unwrap();
    assert_eq!(
        rx.recv().unwrap(),
        Point {
            t: 1,
            x: 2.0,
            y: 3.0
        }
    );
    drop((tx, rx));
    guard.assert_gone();

    // A channel of self-describing messages is not a typed one.
    let (name, guard) = named("typed-plain");
    let tx = Sender::<Message>::create(&name, &no_linger()).unwrap();
    assert_mismatch(
        Receiver::<[f32; 16]>::open(&name),
        "self-describing messages (no schema)",
        "f32 array",
    );
    let rx = Receiver::<Message>::open(&name).unwrap();
    drop((tx, rx));
    guard.assert_gone();
}

#[test]
fn a_value_over_64_kib_is_refused_at_creation() {
    let r = Sender::<[[u8; 4096]; 17]>::anonymous(&no_linger());
    assert!(
        matches!(r, Err(CreateError::TooLarge { needed: 69632, .. })),
        "{r:?}"
    );
    assert!(Sender::<[[u8; 4096]; 16]>::anonymous(&no_linger()).is_ok());
}

#[test]
fn killed_producer_is_peer_died_within_a_second_after_its_values() {
    let name = unique("typed-kill-producer");
    let _guard = name_guard(&[&name]);
    let mut peer = Peer::spawn(&["typed-produce", &name, "5"]);
    let mut rx = Receiver::<[f32; 16]>::open_timeout(&name, Duration::from_secs(10)).unwrap();
    assert_eq!(peer.line(), "sent");
    peer.kill();
    let killed = Instant::now();
    for i in 0..5 {
        assert_eq!(rx.recv().unwrap(), [i as f32; 16]);
    }
    match rx.recv() {
        Err(RecvError::PeerDied { pid }) => assert_eq!(pid, peer.pid()),
        other => panic!("expected PeerDied, got {other:?}"),
    }
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(1), "PeerDied after {took:?}");
}

#[test]
fn killed_consumer_is_peer_died_within_a_second_for_a_blocked_sender() {
    let (name, guard) = named("typed-kill-consumer");
    let cfg = ChannelConfig {
        slots: 4,
        ..no_linger()
    };
    let mut tx = Sender::<[f32; 16]>::create(&name, &cfg).unwrap();
    let mut peer = Peer::spawn(&["typed-take", &name, "1"]);
    tx.send(&[0.0; 16]).unwrap();
    assert_eq!(peer.line(), "took 1");
    while tx.try_send([1.0; 16]).is_ok() {}
    peer.kill();
    let killed = Instant::now();
    match tx.send(&[2.0; 16]) {
        Err(SendError::PeerDied { pid, .. }) => assert_eq!(pid, peer.pid()),
        other => panic!("expected PeerDied, got {other:?}"),
    }
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(1), "PeerDied after {took:?}");
    // The dead consumer's ring was reset: a new consumer attaches and gets what follows.
    let mut rx = Receiver::<[f32; 16]>::open(&name).unwrap();
    tx.send(&[3.0; 16]).unwrap();
    assert_eq!(rx.recv().unwrap(), [3.0; 16]);
    drop((tx, rx));
    guard.assert_gone();
}

/// Opens channel `name` of the typed producer `peer` (`typed-produce <name> <n> close`) and
/// receives its `n` values (`[i; 16]` for i in 0..n), then `Disconnected`; the producer
/// exits successfully, saying it closed.
fn receive_all_then_disconnected(name: &str, peer: Peer, n: usize) {
    let mut rx = Receiver::<[f32; 16]>::open_timeout(name, Duration::from_secs(10)).unwrap();
    for i in 0..n {
        assert_eq!(rx.recv().unwrap(), [i as f32; 16]);
    }
    assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    let (ok, out, err) = peer.finish(Duration::from_secs(10));
    assert!(ok && out.contains("closed"), "{out} {err}");
}

#[test]
fn closed_producer_in_another_process_drains_then_disconnected() {
    let (name, guard) = named("typed-drain");
    let peer = Peer::spawn(&["typed-produce", &name, "300", "close"]);
    receive_all_then_disconnected(&name, peer, 300);
    guard.assert_gone();
}

#[test]
fn a_typed_producer_that_finished_before_the_consumer_opened_still_delivers() {
    let (name, guard) = named("typed-linger");
    let mut peer = Peer::spawn(&["typed-produce", &name, "5", "close"]);
    assert_eq!(peer.line(), "sent");
    // The producer has dropped its sender and lingers for a consumer.
    std::thread::sleep(Duration::from_millis(100));
    receive_all_then_disconnected(&name, peer, 5);
    guard.assert_gone();
}

#[test]
fn a_loaned_slot_is_zeroed_written_in_place_and_sent_once() {
    let cfg = ChannelConfig {
        slots: 2,
        ..no_linger()
    };
    let (mut tx, mut rx) = anon::<[u32; 4]>(&cfg);
    tx.send(&[7; 4]).unwrap();
    tx.send(&[8; 4]).unwrap();
    assert_eq!(rx.recv().unwrap(), [7; 4]);
    assert_eq!(rx.recv().unwrap(), [8; 4]);
    // The next slot is slot 0 again, which held [7; 4]: a loan of it starts from zeros.
    let mut slot = tx.loan().unwrap();
    slot.write_at(4, 5u32);
    slot.send();
    {
        let mut slot = tx.loan().unwrap();
        slot.write([1, 2, 3, 4]);
    } // dropped unsent
    assert_eq!(rx.recv().unwrap(), [0, 5, 0, 0]);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    assert_eq!(tx.stats().messages, 3);
    // A full ring: the loan waits, and gives up at its timeout.
    tx.send(&[1; 4]).unwrap();
    tx.send(&[2; 4]).unwrap();
    assert!(matches!(
        tx.loan_timeout(Duration::from_millis(20)),
        Err(shm_ring::LoanError::Timeout)
    ));
}

#[test]
#[should_panic(expected = "outside a value of 16 bytes")]
fn a_write_past_the_value_panics() {
    let (mut tx, _rx) = anon::<[u32; 4]>(&no_linger());
    tx.loan().unwrap().write_at(14, 0u32);
}
