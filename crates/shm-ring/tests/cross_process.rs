//! Real cross-process tests: a peer process (`shm-ring-peer`) on the other end of a channel.
#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::{Peer, checksum, named, send_filled};
use shm_ring::{
    ChannelConfig, CreateError, LoanError, Message, MessageBuilder, OpenError, Receiver, RecvError,
    RecvTimeoutError, SendError, Sender, Transfer,
};
use shmpipe_test_kit::in_small_dev_shm;

fn send_seq(tx: &mut Sender, seq: u64, data: &[f32]) {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    let msg = MessageBuilder::new()
        .meta_i64("seq", seq as i64)
        .meta_i64("sum", checksum(bytes) as i64)
        .array_slice("data", &[data.len()], data)
        .unwrap();
    tx.send(msg).unwrap();
}

#[test]
fn one_million_messages_arrive_in_order_with_checksums() {
    let (name, guard) = named("million");
    let mut tx = Sender::<Message>::create(&name, &ChannelConfig::default()).unwrap();
    let consumer = Peer::spawn(&["consume", &name, "1000000"]);
    let mut data = [0f32; 16];
    for seq in 0..1_000_000u64 {
        for (i, x) in data.iter_mut().enumerate() {
            *x = (seq as f32) * 0.5 + i as f32;
        }
        send_seq(&mut tx, seq, &data);
    }
    drop(tx);
    let (ok, out, err) = consumer.finish(Duration::from_secs(120));
    assert!(ok, "consumer failed: {err}");
    assert_eq!(out.trim(), "ok 1000000");
    guard.assert_gone();
}

fn large_arrays(transfer: Transfer) {
    let (name, guard) = named("large");
    let cfg = ChannelConfig {
        blocks: 4,
        block_size: 4 << 20,
        transfer,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::create(&name, &cfg).unwrap();
    let consumer = Peer::spawn(&["consume", &name, "12"]);
    for seq in 0..12u64 {
        let data: Vec<f32> = (0..1_000_000)
            .map(|i| (i as f32).sin() * seq as f32)
            .collect();
        send_seq(&mut tx, seq, &data);
    }
    let stats = tx.stats();
    drop(tx);
    let (ok, out, err) = consumer.finish(Duration::from_secs(60));
    assert!(ok, "consumer failed: {err}");
    assert_eq!(out.trim(), "ok 12");
    match transfer {
        Transfer::Copy => assert_eq!((stats.copied_arrays, stats.zero_copy_arrays), (12, 0)),
        _ => assert_eq!((stats.copied_arrays, stats.zero_copy_arrays), (0, 12)),
    }
    guard.assert_gone();
}

#[test]
fn million_element_arrays_are_byte_exact_zero_copy() {
    large_arrays(Transfer::ZeroCopy);
}

#[test]
fn million_element_arrays_are_byte_exact_copied() {
    large_arrays(Transfer::Copy);
}

#[test]
fn million_element_arrays_are_byte_exact_adaptive() {
    large_arrays(Transfer::default());
}

#[test]
fn producer_reclaims_every_block_of_a_killed_consumer() {
    let (name, guard) = named("reclaim");
    let cfg = ChannelConfig {
        blocks: 8,
        block_size: 64 << 10,
        transfer: Transfer::ZeroCopy,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::create(&name, &cfg).unwrap();
    let mut consumer = Peer::spawn(&["hold", &name, "5"]);
    send_filled(&mut tx, 0..5);
    assert_eq!(consumer.line(), "held 5");
    assert_eq!(tx.free_blocks().unwrap(), 3);
    consumer.kill();
    // The pool has 3 free blocks: take them, then the next loan must wait, notice the dead
    // consumer and reclaim its 5 blocks.
    let held: Vec<_> = (0..3).map(|_| tx.loan::<u32>(&[10]).unwrap()).collect();
    let t0 = Instant::now();
    match tx.loan::<u32>(&[10]) {
        Err(LoanError::Send(SendError::PeerDied { reclaimed, .. })) => assert_eq!(reclaimed, 5),
        other => panic!("expected PeerDied, got {other:?}"),
    }
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t0.elapsed()
    );
    drop(held);
    assert_eq!(tx.free_blocks().unwrap(), 8);
    // A new consumer can attach and the channel works again.
    let fresh = Peer::spawn(&["consume", &name, "1"]);
    assert_eq!(
        tx.wait_for_consumer(Duration::from_secs(10)).unwrap(),
        fresh.pid()
    );
    send_seq(&mut tx, 0, &[1.0; 100]);
    drop(tx);
    let (ok, out, err) = fresh.finish(Duration::from_secs(20));
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "ok 1");
    guard.assert_gone();
}

#[test]
fn blocked_consumer_sees_a_killed_producer_within_a_second() {
    let (name, guard) = named("prodkill");
    let mut producer = Peer::spawn(&["produce-hang", &name]);
    assert_eq!(producer.line(), "ready");
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    assert_eq!(rx.producer_pid(), producer.pid());
    let pid = producer.pid();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        producer.kill();
        Instant::now()
    });
    let res = rx.recv();
    let woke = Instant::now();
    let killed_at = killer.join().unwrap();
    match res {
        Err(RecvError::PeerDied { pid: p, .. }) => assert_eq!(p, pid),
        other => panic!("expected PeerDied, got {other:?}"),
    }
    let lag = woke.saturating_duration_since(killed_at);
    assert!(lag < Duration::from_secs(1), "noticed after {lag:?}");
    // The producer never removed its socket: the consumer that saw it die did.
    guard.assert_gone();
    drop(rx);
}

#[test]
fn clean_close_drains_then_disconnects() {
    let (name, guard) = named("close");
    let mut tx = Sender::<Message>::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    for i in 0..10 {
        tx.send(MessageBuilder::new().meta_i64("i", i)).unwrap();
    }
    drop(tx); // closes the channel
    for i in 0..10 {
        assert_eq!(rx.recv().unwrap().record(0).unwrap().meta_i64("i"), Some(i));
    }
    assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    assert!(matches!(
        rx.recv_timeout(Duration::from_millis(10)),
        Err(RecvTimeoutError::Failed(RecvError::Disconnected))
    ));
    guard.assert_gone();
}

#[test]
fn the_socket_of_a_dead_creator_is_removed_by_the_next_open() {
    let (name, guard) = named("stale");
    let mut p = Peer::spawn(&["produce-hang", &name]);
    assert_eq!(p.line(), "ready");
    assert!(common::socket_path(&name).exists());
    // Alive: its name is served and cannot be taken.
    assert!(matches!(
        Sender::<Message>::create(&name, &ChannelConfig::default()),
        Err(CreateError::AlreadyExists(_))
    ));
    drop(Receiver::<Message>::open(&name).unwrap());
    p.kill();
    // Dead: its socket is stale; the next open removes it and reports "not created yet".
    match Receiver::<Message>::open(&name) {
        Err(OpenError::NotFound(n)) => assert_eq!(n, name),
        other => panic!("expected NotFound, got {other:?}"),
    }
    guard.assert_gone();
}

#[test]
fn a_create_over_the_socket_of_a_dead_creator_takes_the_name() {
    let (name, guard) = named("takeover");
    let mut p = Peer::spawn(&["produce-hang", &name]);
    assert_eq!(p.line(), "ready");
    p.kill();
    assert!(
        common::socket_path(&name).exists(),
        "the dead creator left its socket"
    );
    let mut tx = Sender::<Message>::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    assert_eq!(rx.producer_pid(), std::process::id());
    send_seq(&mut tx, 7, &[1.0; 4]);
    assert_eq!(
        rx.recv().unwrap().record(0).unwrap().meta_i64("seq"),
        Some(7)
    );
    drop((tx, rx));
    guard.assert_gone();
}

#[test]
fn idle_consumer_sleeps_instead_of_spinning() {
    let (name, guard) = named("idle");
    let tx = Sender::<Message>::create(&name, &ChannelConfig::default()).unwrap();
    let mut consumer = Peer::spawn(&["consume", &name, "0"]);
    std::thread::sleep(Duration::from_millis(1500));
    let ticks = shmpipe_test_kit::proc::cpu_ticks(consumer.pid()).unwrap();
    // Clock ticks are 10 ms: 1.5 s of spinning would be ~150 ticks. Start-up costs a few.
    assert!(
        ticks < 30,
        "idle consumer used {ticks} ticks of CPU in 1.5 s"
    );
    drop(tx);
    let _ = consumer.line();
    consumer.kill();
    guard.assert_gone();
}

/// A named channel is a memfd, not a file in `/dev/shm`: in a private mount namespace with a
/// 16 MB tmpfs on `/dev/shm` (a small container's), a producer fills a 64 MiB pool (16 blocks
/// of 4 MiB, each byte written) and sends every block, a consumer in another process holds all
/// 16 messages at once and checks every byte, and `/dev/shm` stays empty.
#[test]
fn a_named_channel_moves_a_64_mib_pool_under_a_16_mb_dev_shm() {
    if !shmpipe_test_kit::is_root() {
        eprintln!("SKIPPED: needs root for a private mount namespace (unshare)");
        return;
    }
    let (name, guard) = named("tmpfs");
    let peer = env!("CARGO_BIN_EXE_shm-ring-peer");
    let script = format!(
        "{peer} fill-named 67108864 {name} & {peer} drain-named {name}; r=$?; wait $! || r=$?; \
         echo \"shm entries: $(ls -A /dev/shm | wc -l)\"; exit $r"
    );
    let (status, stdout, stderr) = in_small_dev_shm(&script);
    assert!(status.success(), "{stdout} {stderr}");
    assert!(stdout.contains("sent 16"), "{stdout} {stderr}");
    assert!(stdout.contains("verified 67108864"), "{stdout} {stderr}");
    assert!(stdout.contains("shm entries: 0"), "{stdout} {stderr}");
    guard.assert_gone();
}

#[test]
fn calibrate_measures_both_modes_at_every_size() {
    let cal = shm_ring::calibrate(Duration::from_millis(5)).unwrap();
    let sizes: Vec<usize> = cal.points.iter().map(|p| p.0).collect();
    assert_eq!(
        sizes,
        vec![1024, 4096, 16384, 65536, 262144, 1048576, 4194304]
    );
    assert!(cal.points.iter().all(|&(_, c, z)| c > 0.0 && z > 0.0));
    assert!(sizes.contains(&cal.threshold));
}

#[test]
fn non_blocking_calls_do_not_wait() {
    let (name, guard) = named("nonblock");
    let mut tx = Sender::<Message>::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    let t0 = Instant::now();
    for _ in 0..1000 {
        assert!(common::got(rx.try_recv()).is_none());
    }
    // 1000 empty polls must not spin 50 us each (that alone would be 50 ms).
    assert!(
        t0.elapsed() < Duration::from_millis(40),
        "{:?}",
        t0.elapsed()
    );
    tx.send(MessageBuilder::new().meta_i64("i", 1)).unwrap();
    assert!(common::got(rx.try_recv()).is_some());
    drop((tx, rx));
    guard.assert_gone();
}
