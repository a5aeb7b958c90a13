//! Committed shared memory grows with the pool blocks really used, not with the pool's size:
//! a channel commits its header and rings at creation, and each block the first time the
//! allocator hands it out (then reuses warm blocks first).
#![cfg(not(loom))]

mod common;

use std::os::unix::fs::MetadataExt;

use common::{shm_guard, unique};
use shm_ring::{ChannelConfig, MessageBuilder, Receiver, Sender, Transfer};

const MIB: u64 = 1 << 20;

/// Bytes the file system has allocated to the channel's segment.
fn allocated(tx: &Sender) -> u64 {
    tx.segment().file().metadata().unwrap().blocks() * 512
}

fn grows_with_blocks_in_flight(mut tx: Sender, mut rx: Receiver, cfg: &ChannelConfig) {
    let layout = shm_ring::channel_layout(cfg).unwrap();
    let fixed = layout.pool as u64; // segment header, channel header, both rings
    let slack = 64 << 10;
    assert!(layout.total as u64 >= 64 * MIB);
    let at_start = allocated(&tx);
    assert!(
        at_start <= fixed + slack,
        "a fresh channel with a {} MiB pool commits {at_start} bytes; its header and rings \
         take {fixed}",
        layout.total as u64 / MIB
    );
    // Zero-copy arrays sent and received one at a time: one block, reused.
    for i in 0..100 {
        tx.send(
            MessageBuilder::new()
                .array_slice("x", &[16], &[i as f32; 16])
                .unwrap(),
        )
        .unwrap();
        rx.recv().unwrap();
    }
    let one = allocated(&tx);
    assert!(
        one >= fixed + MIB && one <= fixed + MIB + slack,
        "one block at a time in flight: {one} bytes committed (fixed part {fixed})"
    );
    // Five loans held at once: five blocks committed.
    let loans: Vec<_> = (0..5)
        .map(|i| tx.loan::<u8>(&[MIB as usize]).unwrap().fill(i))
        .collect();
    let five = allocated(&tx);
    assert!(
        five >= fixed + 5 * MIB && five <= fixed + 5 * MIB + slack,
        "5 blocks of 1 MiB loaned: {five} bytes committed (fixed part {fixed})"
    );
    drop(loans);
    // A steady stream of one block at a time reuses a warm block: no growth.
    for i in 0..50u8 {
        let loan = tx.loan::<u8>(&[1000]).unwrap().fill(i);
        tx.send(MessageBuilder::new().array_loan("x", loan))
            .unwrap();
        let m = rx.recv().unwrap();
        assert_eq!(m.record(0).unwrap().array::<u8>("x").unwrap()[0], i);
    }
    assert_eq!(allocated(&tx), five);
    // Zero-copy arrays in flight together: up to one block each.
    let held: Vec<_> = (0..8)
        .map(|i| {
            tx.send(
                MessageBuilder::new()
                    .array_slice("x", &[1000], &[i as f32; 1000])
                    .unwrap(),
            )
            .unwrap();
            rx.recv().unwrap()
        })
        .collect();
    let eight = allocated(&tx);
    assert!(
        eight >= fixed + 8 * MIB && eight <= fixed + 8 * MIB + slack,
        "8 blocks in flight: {eight} bytes committed"
    );
    drop(held);
    assert_eq!(tx.free_blocks().unwrap(), 64);
}

fn config() -> ChannelConfig {
    ChannelConfig {
        blocks: 64,
        block_size: MIB as usize,
        transfer: Transfer::ZeroCopy,
        ..ChannelConfig::default()
    }
}

#[test]
fn named_channel_commits_blocks_as_they_are_first_used() {
    let name = unique("lazy");
    let guard = shm_guard(&[&name]);
    let cfg = ChannelConfig {
        transfer: Transfer::Copy,
        ..config()
    };
    let tx = Sender::create(&name, &cfg).unwrap();
    let rx = Receiver::open(&name).unwrap();
    grows_with_blocks_in_flight_copy_or_zero(tx, rx, &cfg);
    guard.assert_gone();
}

#[test]
fn anonymous_channel_commits_blocks_as_they_are_first_used() {
    let cfg = config();
    let tx = Sender::anonymous(&cfg).unwrap();
    let fd = std::os::fd::AsFd::as_fd(&tx).try_clone_to_owned().unwrap();
    let rx = Receiver::from_fd(fd).unwrap();
    grows_with_blocks_in_flight(tx, rx, &cfg);
}

/// As `grows_with_blocks_in_flight`, for a channel that copies small arrays inline
/// (`Transfer::Copy`): only loans take blocks.
fn grows_with_blocks_in_flight_copy_or_zero(tx: Sender, rx: Receiver, cfg: &ChannelConfig) {
    let layout = shm_ring::channel_layout(cfg).unwrap();
    let fixed = layout.pool as u64;
    let (mut tx, mut rx) = (tx, rx);
    assert!(allocated(&tx) <= fixed + (64 << 10));
    for i in 0..100 {
        tx.send(
            MessageBuilder::new()
                .array_slice("x", &[1000], &[i as f32; 1000])
                .unwrap(),
        )
        .unwrap();
        rx.recv().unwrap();
    }
    assert!(
        allocated(&tx) <= fixed + (64 << 10),
        "copied arrays take no block"
    );
    let loans: Vec<_> = (0..3)
        .map(|i| tx.loan::<u8>(&[10]).unwrap().fill(i))
        .collect();
    let three = allocated(&tx);
    assert!(three >= fixed + 3 * MIB && three <= fixed + 3 * MIB + (64 << 10));
    drop(loans);
    assert_eq!(tx.free_blocks().unwrap(), 64);
}
