//! Committed shared memory grows with the pool blocks really used, not with the pool's size:
//! a channel commits its header and rings at creation, and each block's pages as far as the
//! block is used (then reuses warm blocks first).
#![cfg(not(loom))]

mod common;

use std::os::unix::fs::MetadataExt;

use common::named;
use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, Sender, Transfer};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// Bytes the file system has allocated to the channel's segment.
fn allocated(tx: &Sender) -> u64 {
    tx.segment().file().metadata().unwrap().blocks() * 512
}

/// For a zero-copy channel: each block commits the most bytes it ever held (page-rounded),
/// never-used blocks are taken last (warm blocks reused first), every block comes back.
fn grows_with_blocks_in_flight(mut tx: Sender, mut rx: Receiver, cfg: &ChannelConfig) {
    let layout = shm_ring::channel_layout(cfg).unwrap();
    let fixed = layout.pool as u64; // segment header, channel header, both rings
    assert!(layout.total as u64 >= 64 * MIB);
    let at_start = allocated(&tx);
    assert!(
        at_start <= fixed + PAGE,
        "a fresh channel with a {} MiB pool commits {at_start} bytes; its header and rings \
         take {fixed}",
        layout.total as u64 / MIB
    );
    // Small zero-copy arrays sent and received one at a time: one block, one page of it.
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
    assert_eq!(
        one,
        at_start + PAGE,
        "one 64-byte array at a time in flight"
    );
    // Five loans of 1 MiB held at once: the warm block grows to a whole block, four new ones.
    let loans: Vec<_> = (0..5)
        .map(|i| tx.loan::<u8>(&[MIB as usize]).unwrap().fill(i))
        .collect();
    let five = allocated(&tx);
    assert_eq!(five, at_start + 5 * MIB, "5 blocks of 1 MiB loaned");
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
    // Eight 4000-byte arrays in flight together: the five warm blocks, then three new ones
    // committed one page each.
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
    assert_eq!(
        allocated(&tx),
        five + 3 * PAGE,
        "8 blocks in flight, 3 of them new"
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
    let (name, guard) = named("lazy");
    let cfg = ChannelConfig {
        transfer: Transfer::Copy,
        ..config()
    };
    let tx = Sender::<Message>::create(&name, &cfg).unwrap();
    let rx = Receiver::<Message>::open(&name).unwrap();
    only_loans_take_blocks_when_arrays_are_copied(tx, rx, &cfg);
    guard.assert_gone();
}

#[test]
fn anonymous_channel_commits_blocks_as_they_are_first_used() {
    let cfg = config();
    let tx = Sender::<Message>::anonymous(&cfg).unwrap();
    let fd = std::os::fd::AsFd::as_fd(&tx).try_clone_to_owned().unwrap();
    let rx = Receiver::<Message>::from_fd(fd).unwrap();
    grows_with_blocks_in_flight(tx, rx, &cfg);
}

/// For a channel that copies arrays into the message (`Transfer::Copy`): sending commits no
/// block, a body too large for the ring commits the pages it fills, and small loans one page
/// of a block each.
fn only_loans_take_blocks_when_arrays_are_copied(tx: Sender, rx: Receiver, cfg: &ChannelConfig) {
    let layout = shm_ring::channel_layout(cfg).unwrap();
    let fixed = layout.pool as u64;
    let (mut tx, mut rx) = (tx, rx);
    let at_start = allocated(&tx);
    assert!(at_start <= fixed + PAGE);
    for i in 0..100 {
        tx.send(
            MessageBuilder::new()
                .array_slice("x", &[1000], &[i as f32; 1000])
                .unwrap(),
        )
        .unwrap();
        rx.recv().unwrap();
    }
    assert_eq!(allocated(&tx), at_start, "copied arrays take no block");
    // A body too large for the ring (over a quarter of it) travels in a block: its pages only.
    let big = vec![1f32; 6000];
    tx.send(
        MessageBuilder::new()
            .array_slice("x", &[6000], &big)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(rx.recv().unwrap().leased_blocks(), 0);
    let grown = allocated(&tx) - at_start;
    assert!(
        (24_000..=28 * 1024).contains(&grown),
        "a 24 kB body in a block committed {grown} bytes"
    );
    // Three small loans: the warm block (already holding more), then two new pages.
    let at_start = allocated(&tx);
    let loans: Vec<_> = (0..3)
        .map(|i| tx.loan::<u8>(&[10]).unwrap().fill(i))
        .collect();
    assert_eq!(allocated(&tx), at_start + 2 * PAGE);
    drop(loans);
    assert_eq!(tx.free_blocks().unwrap(), 64);
}
