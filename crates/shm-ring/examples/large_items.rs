//! Items larger than a pool block, three ways, in one run (issue 18's design measurement):
//!
//! - **blocks sized for them**: `block_size` raised to hold an item (the old workaround, a
//!   setting the user had to know);
//! - **large pool**: the default 1 MiB blocks plus `ChannelConfig::large_pool`: an item goes
//!   into an extent whose pages stay reserved while items keep coming (what pipelines use);
//! - **fresh pages per item**: the same, with the extent's pages given back after every item
//!   (`trim_memory(ZERO)`), so each item faults fresh pages in: what a channel pays that
//!   returns memory at once, or an item in a memfd of its own.
//!
//! A producer thread copies each item into the channel (`array_slice`, zero-copy transfer);
//! the consumer thread reads every element. Prints items/s, GB/s, each way's ratio to the
//! first, and the channel's memory after the run and after an idle pause.
//!
//! `cargo run --release -p shm-ring --example large_items -- [MiB per item] [items]`

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, Sender};

fn held(tx: &Sender) -> f64 {
    tx.segment().file().metadata().map_or(0, |m| m.blocks()) as f64 * 512.0 / 1048576.0
}

/// Items/s of `n` items of `floats` f32 each, and the MiB the channel holds at the end.
fn run(cfg: &ChannelConfig, floats: usize, n: usize, fresh: bool) -> (f64, f64) {
    let mut tx = Sender::<Message>::anonymous(cfg).expect("channel");
    let mut rx =
        Receiver::<Message>::from_fd(tx.as_fd().try_clone_to_owned().expect("fd")).expect("rx");
    let reader = std::thread::spawn(move || {
        let mut sum = 0f64;
        for _ in 0..n {
            let m = rx.recv().expect("recv");
            let x = m.record(0).expect("record").array::<f32>("x").expect("x");
            sum += x.iter().map(|&v| f64::from(v)).sum::<f64>();
        }
        sum
    });
    let data: Vec<f32> = (0..floats).map(|i| (i % 7) as f32).collect();
    let t0 = Instant::now();
    for _ in 0..n {
        tx.send(
            MessageBuilder::new()
                .array_slice("x", &[floats], &data)
                .expect("shape"),
        )
        .expect("send");
        if fresh {
            // Gives back every extent the consumer is done with: the next item faults its
            // pages in again.
            tx.trim_memory(Duration::ZERO).expect("trim");
        }
    }
    let sum = reader.join().expect("reader");
    let rate = n as f64 / t0.elapsed().as_secs_f64();
    let want: f64 = data.iter().map(|&v| f64::from(v)).sum::<f64>() * n as f64;
    assert_eq!(sum, want, "every element read");
    (rate, held(&tx))
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4);
    let n: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(500);
    let floats = mib * 1048576 / 4;
    let base = ChannelConfig {
        transfer: shm_ring::Transfer::ZeroCopy,
        ..ChannelConfig::default()
    };
    let sized = ChannelConfig {
        block_size: mib * 1048576,
        ..base
    };
    let large = ChannelConfig {
        large_pool: shm_ring::machine_large_pool(),
        ..base
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# {n} items of {mib} MiB, producer and consumer threads; load {}",
        load.split_whitespace().next().unwrap_or("?")
    );
    println!(
        "{:>26} {:>10} {:>8} {:>10} {:>14}",
        "", "items/s", "GB/s", "vs sized", "MiB held after"
    );
    // The three ways one after the other, twice: a loaded machine shifts all of them alike.
    for round in 1..=2 {
        let rows = [
            ("blocks sized for them", run(&sized, floats, n, false)),
            ("large pool (default)", run(&large, floats, n, false)),
            ("fresh pages per item", run(&large, floats, n, true)),
        ];
        let r0 = rows[0].1.0;
        for (label, (r, h)) in rows {
            println!(
                "{label:>26} {r:>10.0} {:>8.2} {:>9.2}x {h:>14.1}  (round {round})",
                r * (floats * 4) as f64 / 1e9,
                r / r0,
            );
        }
    }
    // Memory after large items stop: sends of small messages give it back after LARGE_KEEP.
    let mut tx = Sender::<Message>::anonymous(&large).expect("channel");
    let mut rx =
        Receiver::<Message>::from_fd(tx.as_fd().try_clone_to_owned().expect("fd")).expect("rx");
    let data = vec![1f32; floats];
    for _ in 0..8 {
        tx.send(
            MessageBuilder::new()
                .array_slice("x", &[floats], &data)
                .expect("shape"),
        )
        .expect("send");
        drop(rx.recv().expect("recv"));
    }
    let busy = held(&tx);
    std::thread::sleep(shm_ring::LARGE_KEEP + Duration::from_millis(100));
    tx.send(MessageBuilder::new().meta_i64("n", 1))
        .expect("send");
    drop(rx.recv().expect("recv"));
    println!(
        "large pool: {busy:.1} MiB held while {mib} MiB items flow, {:.1} MiB after {:?} without one",
        held(&tx),
        shm_ring::LARGE_KEEP
    );
}
