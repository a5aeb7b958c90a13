//! Real cross-process tests: a peer process (`shm-ring-peer`) on the other end of a channel.
#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::{Peer, checksum, shm_guard, unique};
use shm_ring::{ChannelConfig, Error, MessageBuilder, Receiver, Sender, Transfer};
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
    let name = unique("million");
    let guard = shm_guard(&[&name]);
    let mut tx = Sender::create(&name, &ChannelConfig::default()).unwrap();
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
    let name = unique("large");
    let guard = shm_guard(&[&name]);
    let cfg = ChannelConfig {
        blocks: 4,
        block_size: 4 << 20,
        transfer,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::create(&name, &cfg).unwrap();
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
    let name = unique("reclaim");
    let guard = shm_guard(&[&name]);
    let cfg = ChannelConfig {
        blocks: 8,
        block_size: 64 << 10,
        transfer: Transfer::ZeroCopy,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::create(&name, &cfg).unwrap();
    let mut consumer = Peer::spawn(&["hold", &name, "5"]);
    for i in 0..5 {
        let loan = tx.loan::<u32>(&[1000]).unwrap().fill(i);
        tx.send(MessageBuilder::new().array_loan("x", loan))
            .unwrap();
    }
    assert_eq!(consumer.line(), "held 5");
    assert_eq!(tx.free_blocks().unwrap(), 3);
    consumer.kill();
    // The pool has 3 free blocks: take them, then the next loan must wait, notice the dead
    // consumer and reclaim its 5 blocks.
    let held: Vec<_> = (0..3).map(|_| tx.loan::<u32>(&[10]).unwrap()).collect();
    let t0 = Instant::now();
    match tx.loan::<u32>(&[10]) {
        Err(Error::PeerDied { reclaimed, .. }) => assert_eq!(reclaimed, 5),
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
    let name = unique("prodkill");
    let guard = shm_guard(&[&name]);
    let mut producer = Peer::spawn(&["produce-hang", &name]);
    assert_eq!(producer.line(), "ready");
    let mut rx = Receiver::open(&name).unwrap();
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
        Err(Error::PeerDied { pid: p, .. }) => assert_eq!(p, pid),
        other => panic!("expected PeerDied, got {other:?}"),
    }
    let lag = woke.saturating_duration_since(killed_at);
    assert!(lag < Duration::from_secs(1), "noticed after {lag:?}");
    drop(rx);
    // The producer never unlinked its segment: reclaim_stale does.
    shm_ring::reclaim_stale().unwrap();
    guard.assert_gone();
}

#[test]
fn clean_close_drains_then_disconnects() {
    let name = unique("close");
    let guard = shm_guard(&[&name]);
    let mut tx = Sender::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::open(&name).unwrap();
    for i in 0..10 {
        tx.send(MessageBuilder::new().meta_i64("i", i)).unwrap();
    }
    tx.close();
    for i in 0..10 {
        assert_eq!(rx.recv().unwrap().record(0).unwrap().meta_i64("i"), Some(i));
    }
    assert!(matches!(rx.recv(), Err(Error::Disconnected)));
    assert!(matches!(
        rx.recv_timeout(Duration::from_millis(10)),
        Err(Error::Disconnected)
    ));
    guard.assert_gone();
}

#[test]
fn stale_segments_of_dead_creators_are_reclaimed() {
    let name = unique("stale");
    let guard = shm_guard(&[&name]);
    let mut p = Peer::spawn(&["create-die", &name]);
    assert_eq!(p.line(), "ready");
    assert!(std::path::Path::new(&common::shm_path(&name)).exists());
    // Alive: left alone.
    shm_ring::reclaim_stale().unwrap();
    assert!(std::path::Path::new(&common::shm_path(&name)).exists());
    p.kill();
    assert!(shm_ring::reclaim_stale().unwrap() >= 1);
    guard.assert_gone();
}

#[test]
fn idle_consumer_sleeps_instead_of_spinning() {
    let name = unique("idle");
    let guard = shm_guard(&[&name]);
    let tx = Sender::create(&name, &ChannelConfig::default()).unwrap();
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

#[test]
fn too_small_dev_shm_gives_a_clear_error_not_sigbus() {
    let name = unique("tmpfs");
    let peer = env!("CARGO_BIN_EXE_shm-ring-peer");
    // A private mount namespace with a 16 MB tmpfs on /dev/shm, as in a small container.
    // Pool blocks are committed (fallocate) when first loaned, so both channels are created;
    // the 64 MiB one fails at the loan that no longer fits, with an error, not a SIGBUS.
    let script = format!("{peer} create 4194304 {name}-small && {peer} create 67108864 {name}-big");
    let (status, stdout, stderr) = in_small_dev_shm(&script);
    let lines: Vec<&str> = stdout.lines().collect();
    let small_done = lines.iter().position(|l| *l == "loaned 16");
    assert!(
        lines.first() == Some(&"created") && small_done.is_some(),
        "4 MiB channel should fit, every block loaned and written: {stdout} {stderr}"
    );
    let big: Vec<&str> = lines[small_done.unwrap() + 1..].to_vec();
    assert_eq!(
        big.first(),
        Some(&"created"),
        "creating the 64 MiB channel commits only its rings, so it succeeds: {stdout} {stderr}"
    );
    // 4 MiB blocks in a 16 MB tmpfs: three fit beside the rings, the fourth does not.
    assert_eq!(
        big[1..],
        ["loaned 1", "loaned 2", "loaned 3"],
        "loans up to the limit work and can be written: {stdout} {stderr}"
    );
    assert!(
        !status.success(),
        "64 MiB of blocks should not fit in 16 MB"
    );
    assert_eq!(
        status.code(),
        Some(1),
        "expected a clean exit(1), not a signal: {stderr}"
    );
    let needed: u64 = stderr
        .split("needs ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("error should name the bytes needed: {stderr}"));
    assert!(
        needed > 16_000_000 && needed <= (64 << 20) + (1 << 20),
        "needs {needed}: the segment's committed size with the failing block"
    );
    assert!(
        stderr.contains("--shm-size") && stderr.contains("smaller pool"),
        "error should say how to raise the limit or shrink the pool: {stderr}"
    );
    // Nothing leaked into the real /dev/shm.
    assert!(!std::path::Path::new(&common::shm_path(&format!("{name}-big"))).exists());
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
    let name = unique("nonblock");
    let guard = shm_guard(&[&name]);
    let mut tx = Sender::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::open(&name).unwrap();
    let t0 = Instant::now();
    for _ in 0..1000 {
        assert!(rx.try_recv().unwrap().is_none());
    }
    // 1000 empty polls must not spin 50 us each (that alone would be 50 ms).
    assert!(
        t0.elapsed() < Duration::from_millis(40),
        "{:?}",
        t0.elapsed()
    );
    tx.send(MessageBuilder::new().meta_i64("i", 1)).unwrap();
    assert!(rx.try_recv().unwrap().is_some());
    drop((tx, rx));
    guard.assert_gone();
}
