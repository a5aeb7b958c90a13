//! Garbage written into a live channel by another process must give the reader an error,
//! never a panic, an out-of-bounds read or undefined behaviour.
//!
//! Offsets follow the layout in ARCHITECTURE.md for the default configuration:
//! descriptor ring header at 256 (tail at 256), first record at 768 (record header: n_slots,
//! kind, body_len, block as u32), its body at 784, the first field header at 816 (kind, name_len,
//! ndim, dtype, loc bytes; a u64 at 824; b u64 at 832; shape at 840); completion ring header at
//! 66304 and its slots at 66816.
#![cfg(not(loom))]

mod common;

use common::{Peer, ShmGuard, unique};
use shm_ring::{ChannelConfig, Error, MessageBuilder, Receiver, Sender};

fn corrupt(name: &str, offset: u64, hex: &str) {
    let (ok, out, err) = Peer::spawn(&["corrupt", name, &offset.to_string(), hex])
        .finish(std::time::Duration::from_secs(10));
    assert!(ok && out.contains("corrupted"), "peer failed: {err}");
}

/// No consumer ever attaches in some tests: the sender need not keep its name when dropped.
fn no_linger() -> ChannelConfig {
    ChannelConfig {
        linger: std::time::Duration::ZERO,
        ..ChannelConfig::default()
    }
}

fn send_one(tx: &mut Sender, v: f32) {
    let data = [v; 16];
    tx.send(
        MessageBuilder::new()
            .array_slice("x", &[16], &data)
            .unwrap()
            .meta_i64("n", 1),
    )
    .unwrap();
}

/// Sends one message, lets a peer overwrite `hex` at `offset`, and expects `recv` to fail
/// with `Corrupt`. If `recovers`, a following message is received intact.
fn check(offset: u64, hex: &str, recovers: bool) {
    let name = unique("corrupt");
    let guard = ShmGuard::new(&[&name]);
    let mut tx = Sender::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::open(&name).unwrap();
    send_one(&mut tx, 1.0);
    corrupt(&name, offset, hex);
    match rx.recv_timeout(std::time::Duration::from_secs(2)) {
        Err(Error::Corrupt(why)) => assert!(!why.is_empty()),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    if recovers {
        send_one(&mut tx, 2.0);
        let m = rx.recv_timeout(std::time::Duration::from_secs(2)).unwrap();
        assert_eq!(m.record(0).unwrap().array::<f32>("x").unwrap()[[3]], 2.0);
    }
    drop((tx, rx));
    guard.assert_gone();
}

fn le32(v: u32) -> String {
    v.to_le_bytes().iter().map(|b| format!("{b:02x}")).collect()
}
fn le64(v: u64) -> String {
    v.to_le_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn producer_index_beyond_capacity() {
    check(256, &le32(0x7fff_0000), false);
}

#[test]
fn record_longer_than_published() {
    check(768, &le32(1000), true);
}

#[test]
fn unknown_record_kind() {
    check(772, &le32(99), true);
}

#[test]
fn inline_body_longer_than_record() {
    check(776, &le32(1 << 20), true);
}

#[test]
fn body_block_out_of_pool() {
    // kind = block body, block index 4096 of 16.
    check(772, &(le32(3) + &le32(64) + &le32(4096)), true);
}

#[test]
fn bad_body_magic() {
    check(784, "deadbeef", true);
}

#[test]
fn body_length_beyond_record() {
    check(796, &le32(0xffff_fff0), true);
}

#[test]
fn unknown_dtype_code() {
    check(819, "c8", true);
}

#[test]
fn array_in_block_outside_pool() {
    // loc = block, a = block 9999.
    check(
        812,
        &("01000000".to_string() + "00000000" + &le64(9999)),
        true,
    );
}

#[test]
fn inline_offset_out_of_range() {
    check(824, &le64(u64::MAX - 7), true);
}

#[test]
fn shape_does_not_match_length() {
    check(840, &le64(1 << 40), true);
}

#[test]
fn absurd_number_of_dimensions() {
    check(818, "ff", true);
}

#[test]
fn field_name_not_utf8() {
    // The name "x" follows the 8-byte shape at 840.
    check(848, "ff", true);
}

#[test]
fn segment_magic_and_version_are_checked() {
    let name = unique("hdr");
    let guard = ShmGuard::new(&[&name]);
    let _tx = Sender::create(&name, &no_linger()).unwrap();
    corrupt(&name, 8, &le32(99));
    match Receiver::open(&name) {
        Err(Error::VersionMismatch {
            found: 99,
            expected,
        }) => assert_eq!(expected, 2),
        other => panic!("expected VersionMismatch, got {other:?}"),
    }
    corrupt(&name, 0, "0000000000000000");
    assert!(matches!(Receiver::open(&name), Err(Error::NotASegment(_))));
    drop(_tx);
    guard.assert_gone();
}

#[test]
fn channel_geometry_is_checked_against_the_segment() {
    let name = unique("geom");
    let guard = ShmGuard::new(&[&name]);
    let _tx = Sender::create(&name, &no_linger()).unwrap();
    corrupt(&name, 128, &le32(1 << 16)); // slots
    assert!(matches!(Receiver::open(&name), Err(Error::Corrupt(_))));
    corrupt(&name, 128, &le32(1024));
    corrupt(&name, 136, &le32(1 << 20)); // blocks
    assert!(matches!(Receiver::open(&name), Err(Error::Corrupt(_))));
    drop(_tx);
    guard.assert_gone();
}

#[test]
fn bogus_block_returned_by_consumer() {
    let name = unique("comp");
    let guard = ShmGuard::new(&[&name]);
    let mut tx = Sender::create(&name, &no_linger()).unwrap();
    // Completion slot 0 = block 5 (never sent), completion tail = 1.
    corrupt(&name, 66816, &le64(5));
    corrupt(&name, 66304, &le32(1));
    assert!(matches!(tx.free_blocks(), Err(Error::Corrupt(_))));
    drop(tx);
    guard.assert_gone();
}

#[test]
fn in_place_reads_validate_every_access() {
    let name = unique("inplace");
    let guard = ShmGuard::new(&[&name]);
    let mut tx = Sender::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::open(&name).unwrap();
    send_one(&mut tx, 1.0);
    corrupt(&name, 832, &le64(1 << 20)); // byte length of "x" far beyond its record
    let mut seen = None;
    rx.recv_batch(8, Some(std::time::Duration::from_secs(2)), |m| {
        seen = Some(
            m.record(0)
                .and_then(|r| r.array::<f32>("x").map(|a| a.len())),
        );
    })
    .ok();
    assert!(matches!(seen, Some(Err(Error::Corrupt(_)))), "got {seen:?}");
    drop((tx, rx));
    guard.assert_gone();
}
