//! A hostile peer process writes random bytes at random offsets of a live named channel (its
//! headers, both rings, record headers and bodies, pool blocks) while this process sends and
//! receives for several seconds in the debug profile: every call returns data or an error,
//! within its bound; nothing panics, hangs or crashes.
#![cfg(not(loom))]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Peer, named};
use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, Sender, Transfer};

const RUN: Duration = Duration::from_secs(4);

fn cfg() -> ChannelConfig {
    ChannelConfig {
        slots: 64,
        blocks: 4,
        block_size: 4096,
        transfer: Transfer::Adaptive { threshold: 256 },
        linger: Duration::ZERO,
        attach_timeout: Duration::from_millis(500),
        ..ChannelConfig::default()
    }
}

fn produce(mut tx: Sender, stop: Arc<AtomicBool>) -> (u64, u64) {
    let (mut ok, mut err) = (0u64, 0u64);
    let small = [1.25f32; 16];
    let large = [0.5f32; 600];
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let msg = match i % 3 {
            0 => MessageBuilder::new()
                .meta_str("id", "item-17")
                .array_slice("x", &[16], &small)
                .unwrap(),
            1 => MessageBuilder::new()
                .array_slice("x", &[600], &large)
                .unwrap()
                .meta_i64("n", i as i64),
            _ => MessageBuilder::new()
                .meta_f64("v", 2.0)
                .next_record()
                .array_slice("y", &[4, 4], &small)
                .unwrap(),
        };
        let t0 = Instant::now();
        match tx.send_timeout(msg, Duration::from_millis(50)) {
            Ok(()) => ok += 1,
            Err(_) => {
                err += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "send took {:?}",
            t0.elapsed()
        );
        i += 1;
    }
    drop(tx);
    (ok, err)
}

fn consume(mut rx: Receiver, until: Instant) -> (u64, u64, Duration, Vec<(String, u64)>) {
    let (mut ok, mut err) = (0u64, 0u64);
    let mut kinds = std::collections::HashMap::<String, u64>::new();
    let mut kind = |e: shm_ring::Error| {
        let k = format!("{e:?}");
        *kinds.entry(k.chars().take(60).collect()).or_default() += 1;
    };
    let mut slowest = Duration::ZERO;
    let mut i = 0u64;
    while Instant::now() < until {
        let t0 = Instant::now();
        if i.is_multiple_of(2) {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(m) => {
                    ok += 1;
                    for r in 0..m.view().len() {
                        if let Ok(rec) = m.record(r) {
                            let _ = rec.array::<f32>("x").map(|a| a.sum());
                            let _ = rec.array::<f32>("y").map(|a| a.sum());
                            let _ = rec.meta_str("id").map(|s| s.len());
                        }
                    }
                }
                Err(e) => {
                    err += 1;
                    kind(e.into());
                }
            }
        } else {
            let r = rx.recv_batch(8, Some(Duration::from_millis(50)), |m| {
                for rec in m.records().flatten() {
                    for f in rec.fields().flatten() {
                        let _ = rec.array_bytes(f.name()).map(|b| b.len());
                        let _ = rec.meta(f.name());
                    }
                }
            });
            match r {
                Ok(n) => ok += n as u64,
                Err(e) => {
                    err += 1;
                    kind(e.into());
                }
            }
        }
        slowest = slowest.max(t0.elapsed());
        i += 1;
    }
    let mut kinds: Vec<_> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    (ok, err, slowest, kinds)
}

#[test]
fn random_writes_into_a_live_channel_give_data_or_errors() {
    let (name, guard) = named("scribble");
    let c = cfg();
    let tx = Sender::<Message>::create(&name, &c).unwrap();
    let rx = Receiver::<Message>::open(&name).unwrap();
    let seed = std::process::id().to_string();
    // The scribbler reaches the channel's memory as any process of this user can: through
    // /proc/<pid>/fd of one of the two ends.
    let mem = common::mem_path(&tx);
    let scribbler = Peer::spawn(&[
        "scribble",
        &mem,
        &RUN.as_millis().to_string(),
        &seed,
        &c.blocks.to_string(),
        &c.block_size.to_string(),
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let producer = std::thread::spawn({
        let stop = stop.clone();
        move || produce(tx, stop)
    });
    let until = Instant::now() + RUN;
    let consumer = std::thread::spawn(move || consume(rx, until));
    // Both threads must end: a hang is a failure, not a stuck test.
    let deadline = until + Duration::from_secs(20);
    while !consumer.is_finished() {
        assert!(Instant::now() < deadline, "the consumer hangs");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    while !producer.is_finished() {
        assert!(Instant::now() < deadline, "the producer hangs");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (rx_ok, rx_err, slowest, kinds) = consumer.join().expect("the consumer panicked");
    let (tx_ok, tx_err) = producer.join().expect("the producer panicked");
    let (ok, out, err) = scribbler.finish(Duration::from_secs(20));
    assert!(ok, "scribbler failed: {err}");
    eprintln!(
        "sent {tx_ok} ({tx_err} errors), received {rx_ok} ({rx_err} errors), slowest receive \
         {slowest:?}, scribbler: {out}; errors: {:?}",
        &kinds[..kinds.len().min(8)]
    );
    assert!(
        slowest < Duration::from_secs(5),
        "a 50 ms receive took {slowest:?}"
    );
    assert!(rx_err > 0, "the scribbler never disturbed the consumer");
    assert!(rx_ok > 0, "nothing got through at all");
    guard.assert_gone();
}
