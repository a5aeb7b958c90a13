//! Garbage written into a live channel by another process must give the reader an error,
//! never a panic, an out-of-bounds read or undefined behaviour.
//!
//! Offsets come from the layout code (`shm_ring::channel_layout`) for the default
//! configuration: the first record's header (n_slots, kind, body_len, block as u32) at
//! `desc_slots`, its body after it, the body's first record header (record_len, n_fields as u32)
//! after the body header, then the first field header (kind, name_len, ndim, dtype, loc bytes;
//! `a` u64 at +8; `b` u64 at +16; shape at +24; name after the shape). Each test expects the
//! specific complaint.
#![cfg(not(loom))]

mod common;

use common::{Peer, shm_guard, unique};
use shm_ring::{ChannelConfig, ChannelLayout, Error, MessageBuilder, Receiver, Sender};

fn layout() -> ChannelLayout {
    shm_ring::channel_layout(&ChannelConfig::default()).unwrap()
}

/// Offset of the first record's message body.
fn body() -> u64 {
    let l = layout();
    (l.desc_slots + l.record_header) as u64
}

/// Offset of the first field header of the first message.
fn field() -> u64 {
    let l = layout();
    body() + (l.body_header + l.body_record_header) as u64
}

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
fn check(offset: u64, hex: &str, recovers: bool, expect: &str) {
    check_all(&[(offset, hex)], recovers, expect)
}

/// As [`check`], with several writes.
fn check_all(pokes: &[(u64, &str)], recovers: bool, expect: &str) {
    let name = unique("corrupt");
    let guard = shm_guard(&[&name]);
    let mut tx = Sender::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::open(&name).unwrap();
    send_one(&mut tx, 1.0);
    for &(offset, hex) in pokes {
        corrupt(&name, offset, hex);
    }
    match rx.recv_timeout(std::time::Duration::from_secs(2)) {
        Err(Error::Corrupt(why)) => assert!(why.contains(expect), "{why:?} lacks {expect:?}"),
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
    check(
        layout().desc_ring as u64,
        &le32(0x7fff_0000),
        false,
        "ring indices",
    );
}

#[test]
fn record_longer_than_published() {
    check(
        layout().desc_slots as u64,
        &le32(1000),
        true,
        "record of 1000 slots",
    );
}

#[test]
fn unknown_record_kind() {
    check(
        layout().desc_slots as u64 + 4,
        &le32(99),
        true,
        "record kind 99",
    );
}

#[test]
fn inline_body_longer_than_record() {
    check(
        layout().desc_slots as u64 + 8,
        &le32(1 << 20),
        true,
        "body 1048576 bytes",
    );
}

#[test]
fn body_block_out_of_pool() {
    // kind = block body, block index 4096 of 16.
    check(
        layout().desc_slots as u64 + 4,
        &(le32(3) + &le32(64) + &le32(4096)),
        true,
        "block 4096",
    );
}

#[test]
fn bad_body_magic() {
    check(body(), "deadbeef", true, "magic");
}

#[test]
fn body_length_beyond_record() {
    check(body() + 12, &le32(0xffff_fff0), true, "claims");
}

#[test]
fn unknown_dtype_code() {
    check(field() + 3, "c8", true, "dtype code 200");
}

#[test]
fn array_in_block_outside_pool() {
    // loc = block, a = block 9999.
    check_all(
        &[(field() + 4, "01"), (field() + 8, &le64(9999))],
        true,
        "array in block 9999",
    );
}

#[test]
fn inline_offset_out_of_range() {
    check(field() + 8, &le64(u64::MAX - 7), true, "outside its record");
}

#[test]
fn shape_does_not_match_length() {
    check(field() + 24, &le64(1 << 40), true, "does not match");
}

#[test]
fn absurd_number_of_dimensions() {
    check(field() + 2, "ff", true, "overruns its record");
}

#[test]
fn field_name_not_utf8() {
    // The name "x" follows the 8-byte shape at 840.
    check(field() + 32, "ff", true, "not UTF-8");
}

#[test]
fn segment_magic_and_version_are_checked() {
    let name = unique("hdr");
    let guard = shm_guard(&[&name]);
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
    let guard = shm_guard(&[&name]);
    let _tx = Sender::create(&name, &no_linger()).unwrap();
    let g = layout().geometry as u64;
    corrupt(&name, g, &le32(1 << 16)); // slots
    assert!(matches!(Receiver::open(&name), Err(Error::Corrupt(_))));
    corrupt(&name, g, &le32(1024));
    corrupt(&name, g + 8, &le32(1 << 20)); // blocks
    assert!(matches!(Receiver::open(&name), Err(Error::Corrupt(_))));
    drop(_tx);
    guard.assert_gone();
}

#[test]
fn bogus_block_returned_by_consumer() {
    let name = unique("comp");
    let guard = shm_guard(&[&name]);
    let mut tx = Sender::create(&name, &no_linger()).unwrap();
    // Completion slot 0 = block 5 (never sent), completion tail = 1.
    let l = shm_ring::channel_layout(&no_linger()).unwrap();
    corrupt(&name, l.comp_slots as u64, &le64(5));
    corrupt(&name, l.comp_ring as u64, &le32(1));
    match tx.free_blocks() {
        Err(Error::Corrupt(why)) => {
            assert!(why.contains("block 5, which is not in flight"), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop(tx);
    guard.assert_gone();
}

#[test]
fn in_place_reads_validate_every_access() {
    let name = unique("inplace");
    let guard = shm_guard(&[&name]);
    let mut tx = Sender::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::open(&name).unwrap();
    send_one(&mut tx, 1.0);
    corrupt(&name, field() + 16, &le64(1 << 20)); // byte length of "x" far beyond its record
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
