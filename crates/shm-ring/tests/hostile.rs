//! A peer that writes what it should not (trust-boundary issue): each test writes hostile
//! values into a live channel at offsets taken from the layout code and expects a specific
//! error, never a panic, a hang or a changed string under the reader.
#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::{Peer, named, poke};
use shm_ring::{
    ChannelConfig, ChannelLayout, DecodeError, EncodeError, FieldError, Message, MessageBuilder,
    OpenError, Receiver, RecvError, RecvTimeoutError, SendError, SendTimeoutError, Sender,
    Transfer, channel_layout,
};

fn cfg() -> ChannelConfig {
    ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    }
}

fn layout(c: &ChannelConfig) -> ChannelLayout {
    channel_layout(c).unwrap()
}

/// Offset of the first message body in the descriptor ring (the first record's body).
fn first_body(l: &ChannelLayout) -> usize {
    l.desc_slots + l.record_header
}

/// Offset of the first field header of the first message, from its body's start.
fn first_field(l: &ChannelLayout) -> usize {
    l.body_wire.header + l.body_wire.record_header
}

/// `n` rounded up to the encoding's alignment (names, strings and inline data are padded).
fn pad(l: &ChannelLayout, n: usize) -> usize {
    n.div_ceil(l.body_wire.align) * l.body_wire.align
}

#[test]
fn strings_read_in_place_do_not_change_under_the_reader() {
    let (name, guard) = named("str");
    let c = cfg();
    let l = layout(&c);
    let mut tx = Sender::<Message>::create(&name, &c).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    tx.send(MessageBuilder::new().meta_str("id", "hello"))
        .unwrap();
    // A metadata field has no shape: the string follows its field header and the name "id".
    let at = first_body(&l) + first_field(&l) + l.body_wire.field_header + "id".len();
    let mut seen = None;
    rx.recv_batch(1, Some(Duration::from_secs(2)), |m| {
        let r = m.record(0).unwrap();
        let id = r.meta_str("id").unwrap();
        assert_eq!(id, "hello");
        // The producer rewrites the string (invalid UTF-8) after it was validated.
        poke(&tx, at, &[0xff; 5]);
        seen = Some(id.to_string());
    })
    .unwrap();
    assert_eq!(
        seen.as_deref(),
        Some("hello"),
        "a validated &str changed under the reader"
    );
    drop((tx, rx));
    guard.assert_gone();
}

#[test]
fn a_rejected_opener_does_not_make_the_live_consumer_look_dead() {
    let (name, guard) = named("busy");
    let mut tx = Sender::<Message>::create(&name, &cfg()).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap(); // consumer A: this process
    // Make sure B starts in another clock tick than this process.
    std::thread::sleep(Duration::from_millis(50));
    let (ok, out, err) = Peer::spawn(&["open", &name]).finish(Duration::from_secs(10));
    assert!(ok, "opener failed: {err}");
    assert!(out.starts_with("busy "), "{out}");
    // The producer must still see A alive.
    tx.check_consumer().expect("consumer A declared dead");
    tx.send(MessageBuilder::new().meta_i64("n", 7)).unwrap();
    let m = rx.recv_timeout(Duration::from_secs(2)).unwrap();
    assert_eq!(m.record(0).unwrap().meta_i64("n"), Some(7));
    drop((m, tx, rx));
    guard.assert_gone();
}

#[test]
fn a_garbage_consumer_pid_does_not_disable_death_detection() {
    let (name, guard) = named("garbage-pid");
    let c = ChannelConfig { slots: 2, ..cfg() };
    let l = layout(&c);
    let mut tx = Sender::<Message>::create(&name, &c).unwrap();
    // "pid 1" with a start time that is not init's (the claim keeps its low 32 bits).
    let init = shmpipe_test_kit::proc::stat(1).expect("/proc/1/stat must be readable here");
    let not_init = (init.start_time as u32).wrapping_add(1);
    poke(
        &tx,
        l.channel_wire.consumer,
        &((1u64 << 32) | u64::from(not_init)).to_le_bytes(),
    );
    let t0 = Instant::now();
    let mut result = Ok(());
    let mut sent = 0;
    for i in 0..4 {
        result = tx.send_timeout(
            MessageBuilder::new().meta_i64("n", i),
            Duration::from_secs(3),
        );
        if result.is_err() {
            break;
        }
        sent += 1;
    }
    // Init is alive but started at another time: the claim names a process that is gone, so
    // the consumer is dead. (`Corrupt` is only for a claim that names no pid, or this very
    // process without a receiver.) A 2-slot ring inlines at most a quarter of its 128 bytes,
    // so each message sent went out in a pool block: every one of them comes back.
    match result {
        Err(SendTimeoutError::Failed(SendError::PeerDied { pid: 1, reclaimed }, _)) => {
            assert!(sent > 0, "no message went out before the ring filled");
            assert_eq!(reclaimed, sent, "blocks taken back");
        }
        other => panic!("expected PeerDied for a garbage consumer, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    drop(tx);
    guard.assert_gone();
}

#[test]
fn a_sender_whose_consumer_never_attaches_gets_an_error() {
    let (name, guard) = named("no-consumer");
    let c = ChannelConfig {
        slots: 2,
        attach_timeout: Duration::from_millis(300),
        ..cfg()
    };
    let mut tx = Sender::<Message>::create(&name, &c).unwrap();
    let t0 = Instant::now();
    let mut result = Ok(());
    for i in 0..4 {
        result = tx.send_timeout(
            MessageBuilder::new().meta_i64("n", i),
            Duration::from_secs(5),
        );
        if result.is_err() {
            break;
        }
    }
    let e = result.unwrap_err();
    assert!(
        matches!(e, SendTimeoutError::Failed(SendError::NoConsumer { .. }, _)),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("ChannelConfig::attach_timeout"),
        "{e}"
    );
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    drop(tx);
    guard.assert_gone();
}

#[test]
fn blocks_of_a_skipped_corrupt_record_come_back() {
    let (name, guard) = named("skip-blocks");
    let c = ChannelConfig {
        blocks: 1,
        block_size: 4096,
        transfer: Transfer::ZeroCopy,
        ..cfg()
    };
    let l = layout(&c);
    let mut tx = Sender::<Message>::create(&name, &c).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    let data = [1.5f32; 16];
    tx.send(
        MessageBuilder::new()
            .array_slice("x", &[16], &data)
            .unwrap(),
    )
    .unwrap();
    // The record header's slot count: far more than published, so the consumer must skip.
    poke(
        &tx,
        l.desc_slots + l.record_wire.n_slots,
        &1000u32.to_le_bytes(),
    );
    match rx.recv_timeout(Duration::from_secs(2)) {
        Err(RecvTimeoutError::Failed(RecvError::Corrupt(why))) => {
            assert!(why.starts_with("record of 1000 slots ("), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // The only block went out with the skipped record: it must come back.
    for i in 0..4 {
        tx.send_timeout(
            MessageBuilder::new()
                .array_slice("x", &[16], &data)
                .unwrap(),
            Duration::from_secs(2),
        )
        .unwrap_or_else(|e| panic!("send {i}: {e:?}"));
        let m = rx.recv_timeout(Duration::from_secs(2)).unwrap();
        assert_eq!(m.record(0).unwrap().array::<f32>("x").unwrap()[[3]], 1.5);
    }
    drop((tx, rx));
    guard.assert_gone();
}

#[test]
fn a_hostile_completion_head_is_an_error_not_a_panic() {
    let (name, guard) = named("comp-head");
    let c = ChannelConfig {
        transfer: Transfer::ZeroCopy,
        ..cfg()
    };
    let l = layout(&c);
    let mut tx = Sender::<Message>::create(&name, &c).unwrap();
    poke(&tx, l.comp_head, &0x7fff_0000u32.to_le_bytes());
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    let data = [2.5f32; 16];
    for _ in 0..2 {
        tx.send(
            MessageBuilder::new()
                .array_slice("x", &[16], &data)
                .unwrap(),
        )
        .unwrap();
    }
    let m = rx.recv_timeout(Duration::from_secs(2)).unwrap();
    drop(m); // hands its block back through the poisoned completion ring
    match rx.recv_timeout(Duration::from_secs(2)) {
        Err(RecvTimeoutError::Failed(RecvError::Corrupt(why))) => assert!(
            why.contains("completion") && why.contains("ring indices"),
            "{why}"
        ),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop((tx, rx));
    guard.assert_gone();
}

#[test]
fn a_hostile_geometry_is_an_error_not_a_panic() {
    let (name, guard) = named("geometry");
    let c = cfg();
    let l = layout(&c);
    let tx = Sender::<Message>::create(&name, &c).unwrap();
    // blocks = 0 (so the block size is not range-checked) and a block size near u64::MAX.
    poke(&tx, l.channel_wire.blocks, &0u32.to_le_bytes());
    poke(
        &tx,
        l.channel_wire.block_size,
        &(u64::MAX - 62).to_le_bytes(),
    );
    match Receiver::<Message>::open(&name) {
        // Without blocks the layout normalises the block size: the stored one cannot match.
        Err(OpenError::Corrupt(why)) => {
            assert!(why.starts_with("channel geometry ("), "{why}");
            assert!(
                why.contains(", 0 blocks x 18446744073709551553 B,"),
                "{why}"
            );
            assert!(why.contains("does not match a segment of"), "{why}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop(tx);
    guard.assert_gone();
}

#[test]
fn configurations_whose_lengths_do_not_fit_the_encoding_are_refused() {
    let ok = |c: ChannelConfig| channel_layout(&c).is_ok();
    let blocks = |block_size: usize| ChannelConfig {
        blocks: 1,
        block_size,
        ..ChannelConfig::default()
    };
    assert!(ok(blocks((1 << 32) - 64)));
    assert!(
        !ok(blocks(1 << 32)),
        "a block whose body length overflows u32"
    );
    let ring = |slot_size: u32| ChannelConfig {
        slots: 1 << 20,
        slot_size,
        ..ChannelConfig::default()
    };
    assert!(ok(ring(4096)));
    assert!(
        !ok(ring(8192)),
        "a ring whose inline body length overflows u32"
    );
}

#[test]
fn duplicate_field_names_are_refused_by_the_sender() {
    let (name, guard) = named("dup-send");
    let mut tx = Sender::<Message>::create(&name, &cfg()).unwrap();
    let data = [1f32; 4];
    let msg = MessageBuilder::new()
        .meta_i64("x", 1)
        .array_slice("x", &[4], &data)
        .unwrap();
    match tx.send(msg) {
        Err(SendError::Encode(EncodeError::DuplicateField { name, record: 0 })) => {
            assert_eq!(name, "x")
        }
        other => panic!("expected DuplicateField, got {other:?}"),
    }
    // The same name in two records is fine.
    tx.send(
        MessageBuilder::new()
            .meta_i64("x", 1)
            .next_record()
            .meta_i64("x", 2),
    )
    .unwrap();
    drop(tx);
    guard.assert_gone();
}

#[test]
fn duplicate_field_names_are_refused_by_the_receiver() {
    let (name, guard) = named("dup-recv");
    let c = cfg();
    let l = layout(&c);
    let mut tx = Sender::<Message>::create(&name, &c).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    let a = [1f64; 2];
    let b = [2f32; 4];
    let msg = MessageBuilder::new()
        .array_slice("xa", &[2], &a)
        .unwrap()
        .array_slice("xb", &[4], &b)
        .unwrap();
    tx.send(msg).unwrap();
    // Field 1: header, one dim, name "xa" padded, its f64 data; then field 2's header, one
    // dim, and its name: rename "xb" to "xa".
    let w = l.body_wire;
    let f2 = first_field(&l) + w.field_header + w.dim + pad(&l, 2) + pad(&l, a.len() * 8);
    let b_of_xb = f2 + w.field_header + w.dim + "xb".find('b').unwrap();
    poke(&tx, first_body(&l) + b_of_xb, b"a");
    match rx.recv_timeout(Duration::from_secs(2)) {
        Err(RecvTimeoutError::Failed(RecvError::Corrupt(why))) => {
            assert!(
                why.contains("field 'xa' appears twice in one record"),
                "{why}"
            )
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // The same through an in-place read. The first message took these slots; the second
    // (the same message) follows them.
    let len = first_field(&l)
        + 2 * (w.field_header + w.dim + pad(&l, 2))
        + pad(&l, a.len() * 8)
        + pad(&l, b.len() * 4);
    let n_slots = (l.record_header + len).div_ceil(l.slot_size);
    tx.send(
        MessageBuilder::new()
            .array_slice("xa", &[2], &a)
            .unwrap()
            .array_slice("xb", &[4], &b)
            .unwrap(),
    )
    .unwrap();
    let second_body = l.desc_slots + n_slots * l.slot_size + l.record_header;
    poke(&tx, second_body + b_of_xb, b"a");
    let mut seen = None;
    let got = rx.recv_batch(1, Some(Duration::from_secs(2)), |m| {
        seen = Some(m.record(0).and_then(|r| r.array::<f32>("xa").map(|_| ())));
    });
    // A message that names no pool block is handed over after its body header is checked; the
    // lookup finds the first "xa", then refuses the record for the second one.
    assert_eq!(got.ok(), Some(1));
    match seen {
        Some(Err(FieldError::Corrupt(DecodeError::Malformed(why)))) => {
            assert!(
                why.contains("field 'xa' appears twice in one record"),
                "{why}"
            )
        }
        other => panic!("in-place read of a duplicated name: {other:?}"),
    }
    drop((tx, rx));
    guard.assert_gone();
}
