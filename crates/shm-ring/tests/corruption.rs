//! Garbage written into a live channel by another process must give the reader an error,
//! never a panic, an out-of-bounds read or undefined behaviour.
//!
//! Every offset comes from the layout code (`shm_ring::channel_layout` for the default
//! configuration, whose `*_wire` fields name each header field where the code that writes it
//! defines it): the first ring record starts at `desc_slots` with its record header (n_slots,
//! kind, body_len, block), its message body follows (body header: magic, tag, n_records,
//! len, block_refs), then the body's first record header (len, n_fields, tag) and the first
//! field header (kind, name_len, ndim, dtype, loc, a, b), followed by the array's shape (one
//! u64 per dimension) and its name. Each test expects the specific complaint.
#![cfg(not(loom))]

mod common;

use common::{Peer, mem_path, named};
use shm_ring::{
    ChannelConfig, ChannelLayout, DecodeError, FieldError, Message, MessageBuilder, OpenError,
    Receiver, RecvError, RecvTimeoutError, SendError, Sender,
};

fn layout() -> ChannelLayout {
    shm_ring::channel_layout(&ChannelConfig::default()).unwrap()
}

/// Offset of the first record (its ring record header) in the descriptor ring.
fn record() -> u64 {
    layout().desc_slots as u64
}

/// Offset of the first record's message body.
fn body() -> u64 {
    record() + layout().record_header as u64
}

/// Offset of the first field header of the first message (the array "x" of [`send_one`]).
fn field() -> u64 {
    let w = layout().body_wire;
    body() + (w.header + w.record_header) as u64
}

/// Offset of the name of the first field (after the one-dimensional shape of "x").
fn field_name() -> u64 {
    let w = layout().body_wire;
    field() + (w.field_header + w.dim) as u64
}

/// Has another process write the bytes `hex` at `offset` of `tx`'s channel (through its own
/// file, opened by `/proc/<pid>/fd/<n>`).
fn corrupt(tx: &Sender, offset: u64, hex: &str) {
    let path = mem_path(tx);
    let (ok, out, err) = Peer::spawn(&["corrupt", &path, &offset.to_string(), hex])
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
    let (name, guard) = named("corrupt");
    let mut tx = Sender::<Message>::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    send_one(&mut tx, 1.0);
    for &(offset, hex) in pokes {
        corrupt(&tx, offset, hex);
    }
    match rx.recv_timeout(std::time::Duration::from_secs(2)) {
        Err(RecvTimeoutError::Failed(RecvError::Corrupt(why))) => {
            assert!(why.contains(expect), "{why:?} lacks {expect:?}")
        }
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
        record() + layout().record_wire.n_slots as u64,
        &le32(1000),
        true,
        "record of 1000 slots",
    );
}

#[test]
fn unknown_record_kind() {
    check(
        record() + layout().record_wire.kind as u64,
        &le32(99),
        true,
        "record kind 99",
    );
}

#[test]
fn inline_body_longer_than_record() {
    check(
        record() + layout().record_wire.body_len as u64,
        &le32(1 << 20),
        true,
        &format!(
            "record kind {}, {} slots, body 1048576 bytes",
            layout().record_wire.kind_inline,
            message_slots(&layout())
        ),
    );
}

#[test]
fn body_block_out_of_pool() {
    // A one-slot record whose 64-byte body is in block 4096 (of 16): only the block is wrong
    // (a block record of several slots is refused whatever its block: see the next test).
    let w = layout().record_wire;
    check_all(
        &[
            (record() + w.n_slots as u64, &le32(1)),
            (record() + w.kind as u64, &le32(w.kind_block)),
            (record() + w.body_len as u64, &le32(64)),
            (record() + w.block as u64, &le32(4096)),
        ],
        true,
        &format!(
            "record kind {}, 1 slots, body 64 bytes, block 4096",
            w.kind_block
        ),
    );
}

#[test]
fn block_record_of_several_slots() {
    // The inline message's record (several slots) relabelled as a body in block 0 (which
    // exists): a block record is one slot.
    let l = layout();
    let w = l.record_wire;
    check_all(
        &[
            (record() + w.kind as u64, &le32(w.kind_block)),
            (record() + w.body_len as u64, &le32(64)),
            (record() + w.block as u64, &le32(0)),
        ],
        true,
        &format!(
            "record kind {}, {} slots, body 64 bytes, block 0",
            w.kind_block,
            message_slots(&l)
        ),
    );
}

#[test]
fn bad_body_magic() {
    check(
        body() + layout().body_wire.magic as u64,
        "deadbeef",
        true,
        "message magic 0xefbeadde",
    );
}

#[test]
fn body_length_beyond_record() {
    check(
        body() + layout().body_wire.len as u64,
        &le32(0xffff_fff0),
        true,
        "message claims 4294967280 bytes",
    );
}

#[test]
fn unknown_dtype_code() {
    check(
        field() + layout().body_wire.field_dtype as u64,
        "c8",
        true,
        "array 'x': dtype code 200",
    );
}

#[test]
fn array_in_block_outside_pool() {
    // loc = block, a = block 9999.
    let w = layout().body_wire;
    check_all(
        &[
            (
                field() + w.field_loc as u64,
                &format!("{:02x}", w.loc_block),
            ),
            (field() + w.field_a as u64, &le64(9999)),
        ],
        true,
        "array in block 9999",
    );
}

#[test]
fn inline_offset_out_of_range() {
    check(
        field() + layout().body_wire.field_a as u64,
        &le64(u64::MAX - 7),
        true,
        "array 'x': inline data at 18446744073709551608 (+64) outside its record",
    );
}

#[test]
fn shape_does_not_match_length() {
    // The first (only) dimension of "x", right after its field header.
    check(
        field() + layout().body_wire.field_header as u64,
        &le64(1 << 40),
        true,
        "array 'x': shape [1099511627776] of f32 does not match 64 bytes",
    );
}

#[test]
fn absurd_number_of_dimensions() {
    check(
        field() + layout().body_wire.field_ndim as u64,
        "ff",
        true,
        &format!("field at {} overruns its record", field() - body()),
    );
}

#[test]
fn field_name_not_utf8() {
    let at = field() - body();
    check(
        field_name(),
        "ff",
        true,
        &format!("field name at {at} is not UTF-8"),
    );
}

#[test]
fn segment_magic_and_version_are_checked() {
    let (name, guard) = named("hdr");
    let tx = Sender::<Message>::create(&name, &no_linger()).unwrap();
    let w = layout().segment_wire;
    corrupt(&tx, w.version as u64, &le32(99));
    match Receiver::<Message>::open(&name) {
        Err(OpenError::VersionMismatch {
            found: 99,
            expected,
        }) => assert_eq!(expected, w.layout_version),
        other => panic!("expected VersionMismatch, got {other:?}"),
    }
    corrupt(&tx, w.magic as u64, "0000000000000000");
    match Receiver::<Message>::open(&name) {
        Err(OpenError::NotASegment(why)) => {
            assert!(why.contains("(magic 0x0)"), "{why}");
            assert!(
                why.contains(&format!("channel '{name}', served by pid ")),
                "{why}"
            );
        }
        other => panic!("expected NotASegment, got {other:?}"),
    }
    drop(tx);
    guard.assert_gone();
}

/// `Receiver::open` refusing a channel whose geometry does not match its segment, with the
/// geometry it read.
fn expect_geometry(name: &str, what: &str) {
    match Receiver::<Message>::open(name) {
        Err(OpenError::Corrupt(why)) => {
            assert!(why.starts_with("channel geometry ("), "{why}");
            assert!(why.contains(what), "{why:?} lacks {what:?}");
            assert!(why.contains("does not match a segment of"), "{why}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn channel_geometry_is_checked_against_the_segment() {
    let (name, guard) = named("geom");
    let tx = Sender::<Message>::create(&name, &no_linger()).unwrap();
    let l = layout();
    let w = l.channel_wire;
    corrupt(&tx, w.slots as u64, &le32(1 << 16));
    expect_geometry(&name, "(65536 slots x 64 B,");
    corrupt(&tx, w.slots as u64, &le32(l.slots as u32));
    corrupt(&tx, w.blocks as u64, &le32(1 << 20));
    expect_geometry(&name, "1024 slots x 64 B, 1048576 blocks x");
    drop(tx);
    guard.assert_gone();
}

#[test]
fn bogus_block_returned_by_consumer() {
    let (name, guard) = named("comp");
    let mut tx = Sender::<Message>::create(&name, &no_linger()).unwrap();
    // Completion slot 0 = block 5 (never sent), completion tail = 1.
    let l = shm_ring::channel_layout(&no_linger()).unwrap();
    corrupt(&tx, l.comp_slots as u64, &le64(5));
    corrupt(&tx, l.comp_ring as u64, &le32(1));
    match tx.free_blocks() {
        Err(SendError::Corrupt(why)) => {
            assert!(why.contains("block 5, which is not in flight"), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop(tx);
    guard.assert_gone();
}

/// An in-place read (`recv_batch`) validates every access on its own copy of the headers:
/// a byte length far beyond the record is refused by the shape check, and when the shape is
/// made to agree with it, by the bounds check.
#[test]
fn in_place_reads_validate_every_access() {
    let (name, guard) = named("inplace");
    let mut tx = Sender::<Message>::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    let l = layout();
    let w = l.body_wire;
    // `send_one`'s message fills this many slots; the second one starts right after it.
    let mut at = 0u64;
    let cases: [(&[(usize, u64)], &str); 2] = [
        (
            &[(w.field_b, 1 << 20)],
            "array 'x': shape [16] of f32 does not match 1048576 bytes",
        ),
        (
            &[(w.field_b, 1 << 20), (w.field_header, 1 << 18)],
            "array 'x': inline data at",
        ),
    ];
    for (pokes, expect) in cases {
        send_one(&mut tx, 1.0);
        for &(off, v) in pokes {
            corrupt(&tx, field() + at + off as u64, &le64(v));
        }
        let mut seen = None;
        let got = rx.recv_batch(8, Some(std::time::Duration::from_secs(2)), |m| {
            seen = Some(
                m.record(0)
                    .and_then(|r| r.array::<f32>("x").map(|a| a.len())),
            );
        });
        // The body header is fine and the message names no block: the batch hands it over,
        // and the field is refused at the access.
        assert_eq!(got.ok(), Some(1), "{expect}");
        match seen {
            Some(Err(FieldError::Corrupt(DecodeError::Malformed(why)))) => {
                assert!(why.contains(expect), "{why:?}: {expect:?}")
            }
            other => panic!("expected Corrupt({expect:?}), got {other:?}"),
        }
        at += message_slots(&l) * l.slot_size as u64;
    }
    drop((tx, rx));
    guard.assert_gone();
}

/// Slots taken by `send_one`'s message: record header, body header, record header, the array
/// "x" (field header, one dimension, name, 64 data bytes), the metadata "n" (field header,
/// name).
fn message_slots(l: &ChannelLayout) -> u64 {
    let w = l.body_wire;
    let pad = |n: usize| n.div_ceil(w.align) * w.align;
    let x = w.field_header + w.dim + pad(1) + pad(16 * 4);
    let n = w.field_header + pad(1);
    let bytes = l.record_header + w.header + w.record_header + x + n;
    bytes.div_ceil(l.slot_size) as u64
}

/// Reads `n` bytes at `offset` of a channel's memory (`f`: a descriptor of its memfd).
fn peek(f: &std::fs::File, offset: usize, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    std::os::unix::fs::FileExt::read_exact_at(f, &mut v, offset as u64).unwrap();
    v
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The offsets every test here pokes at are where the code writes each field: read back from
/// a live channel (segment header, channel header, ring record header) and from the message
/// encoder (body, record and field headers).
#[test]
fn exported_offsets_are_where_the_code_writes() {
    let (name, guard) = named("wire");
    let cfg = no_linger();
    let l = shm_ring::channel_layout(&cfg).unwrap();
    let mut tx = Sender::<Message>::create(&name, &cfg).unwrap();
    let mem = tx.segment().file().try_clone().unwrap();
    check_segment_header(&mem, &l);
    check_channel_header(&mem, &l, &cfg);
    let rx = Receiver::<Message>::open(&name).unwrap();
    check_attached_consumer(&mem, &l);
    let first_slots = check_inline_message(&mut tx, &mem, &l);
    check_block_message(&mut tx, &mem, &l, &cfg, first_slots);
    drop(rx);
    assert_eq!(word(&mem, l.channel_wire.consumer_closed), 1);
    drop(tx);
    guard.assert_gone();
}

/// The u32 at `at` of a channel's memory.
fn word(mem: &std::fs::File, at: usize) -> u32 {
    u32_at(&peek(mem, at, 4), 0)
}

/// The segment header names the channel, its creator and its size, and says it is ready.
fn check_segment_header(mem: &std::fs::File, l: &ChannelLayout) {
    let s = l.segment_wire;
    let h = peek(mem, 0, s.header);
    assert_eq!(&h[s.magic..s.magic + 8], b"SHMPIPE\0");
    assert_eq!(u32_at(&h, s.version), s.layout_version);
    assert_ne!(u32_at(&h, s.kind), 0, "kind");
    assert_eq!(u32_at(&h, s.creator_pid), std::process::id());
    let start = shmpipe_test_kit::proc::stat(std::process::id()).unwrap();
    assert_eq!(u64_at(&h, s.creator_start), start.start_time);
    assert_eq!(u64_at(&h, s.size), l.total as u64);
    assert_ne!(u32_at(&h, s.ready), 0, "ready");
}

/// The channel header holds the configured geometry, no schema, and (before a consumer
/// attaches) the layout's own offsets for its words.
fn check_channel_header(mem: &std::fs::File, l: &ChannelLayout, cfg: &ChannelConfig) {
    let c = l.channel_wire;
    assert_eq!(word(mem, c.slots), cfg.slots);
    assert_eq!(word(mem, c.slot_size), cfg.slot_size);
    assert_eq!(word(mem, c.blocks), cfg.blocks);
    assert!(word(mem, c.comp_slots).is_power_of_two());
    assert_eq!(u64_at(&peek(mem, c.block_size, 8), 0), l.block_size as u64);
    assert_eq!(word(mem, c.schema_len), 0);
    assert_eq!(c.schema_len, l.schema_len_word);
    assert_eq!(c.consumer, l.consumer);
    assert_eq!(c.slots, l.geometry);
}

/// Once our receiver attached, the consumer word holds our pid and neither side is closed.
fn check_attached_consumer(mem: &std::fs::File, l: &ChannelLayout) {
    let c = l.channel_wire;
    assert_eq!(
        u64_at(&peek(mem, c.consumer, 8), 0) >> 32,
        u64::from(std::process::id())
    );
    assert_eq!(word(mem, c.consumer_closed), 0);
    assert_eq!(word(mem, c.producer_closed), 0);
}

/// Sends one message inline in the ring and checks its record header, then that the body is
/// the encoder's bytes with each header field where the layout says. Returns the slots the
/// message took.
fn check_inline_message(tx: &mut Sender, mem: &std::fs::File, l: &ChannelLayout) -> usize {
    let data = [0.5f32; 3];
    let msg = || {
        MessageBuilder::new()
            .tag(0x0102_0304)
            .record_tag(0x1122_3344_5566_7788)
            .array_slice("abc", &[3], &data)
            .unwrap()
    };
    tx.send(msg()).unwrap();
    let r = l.record_wire;
    let rec = peek(mem, l.desc_slots, l.record_header);
    let (encoded, len) = msg().encode_inline().unwrap();
    assert_eq!(u32_at(&rec, r.kind), r.kind_inline);
    assert_eq!(u32_at(&rec, r.body_len) as usize, len);
    assert_eq!(
        u32_at(&rec, r.n_slots) as usize,
        (l.record_header + len).div_ceil(l.slot_size)
    );
    let body = peek(mem, l.desc_slots + l.record_header, len);
    let mine: Vec<u8> = encoded.iter().flat_map(|w| w.to_le_bytes()).collect();
    assert_eq!(body, mine[..len], "the ring holds the encoder's bytes");
    check_inline_body(&body, l, len);
    u32_at(&rec, r.n_slots) as usize
}

/// The body of [`check_inline_message`]'s message (`len` bytes): body header, record header,
/// the field header of "abc", its shape, name and inline data.
fn check_inline_body(body: &[u8], l: &ChannelLayout, len: usize) {
    let w = l.body_wire;
    assert_eq!(&body[w.magic..w.magic + 4], b"SRB2");
    assert_eq!(u32_at(body, w.tag), 0x0102_0304);
    assert_eq!(u32_at(body, w.n_records), 1);
    assert_eq!(u32_at(body, w.len) as usize, len);
    assert_eq!(u32_at(body, w.block_refs), 0);
    let rec0 = w.header;
    assert_eq!(u32_at(body, rec0 + w.record_len) as usize, len - w.header);
    assert_eq!(u32_at(body, rec0 + w.record_fields), 1);
    assert_eq!(u64_at(body, rec0 + w.record_tag), 0x1122_3344_5566_7788);
    let f = rec0 + w.record_header;
    assert_eq!(body[f + w.field_name_len], 3);
    assert_eq!(body[f + w.field_ndim], 1);
    assert_eq!(body[f + w.field_dtype], shm_ring::DType::F32 as u8);
    assert_eq!(body[f + w.field_loc], w.loc_inline);
    assert_eq!(u64_at(body, f + w.field_b), 12);
    assert_eq!(u64_at(body, f + w.field_header), 3, "shape");
    let name_at = f + w.field_header + w.dim;
    assert_eq!(&body[name_at..name_at + 3], b"abc");
    let pad = |n: usize| n.div_ceil(w.align) * w.align;
    let data_at = name_at + pad(3);
    assert_eq!(u64_at(body, f + w.field_a) as usize, data_at);
    assert_eq!(&body[data_at..data_at + 4], &0.5f32.to_le_bytes());
    assert_eq!(data_at + pad(12), len, "the body ends with the padded data");
}

/// Sends a zero-copy array (after the first message, `first_slots` slots): its field says
/// "in a block", and a names the block.
fn check_block_message(
    tx: &mut Sender,
    mem: &std::fs::File,
    l: &ChannelLayout,
    cfg: &ChannelConfig,
    first_slots: usize,
) {
    let r = l.record_wire;
    let w = l.body_wire;
    let loaned = tx.loan::<f32>(&[4]).unwrap().write_with(|i| i as f32);
    tx.send(MessageBuilder::new().array_loan("z", loaned))
        .unwrap();
    let second = l.desc_slots + first_slots * l.slot_size;
    let rec = peek(mem, second, l.record_header);
    assert_eq!(u32_at(&rec, r.kind), r.kind_inline);
    let body = peek(
        mem,
        second + l.record_header,
        u32_at(&rec, r.body_len) as usize,
    );
    assert_eq!(u32_at(&body, w.block_refs), 1);
    let f = w.header + w.record_header;
    assert_eq!(body[f + w.field_loc], w.loc_block);
    assert!(u64_at(&body, f + w.field_a) < u64::from(cfg.blocks));
    assert_eq!(u64_at(&body, f + w.field_b), 16);
}
