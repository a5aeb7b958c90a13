//! The pool's large size class (`ChannelConfig::large_pool`, issue 18): arrays, bodies and
//! loans of any size go zero-copy into extents of an area that costs address space only; the
//! pages an extent takes are reused while large items keep coming and given back after; and
//! every new value read from shared memory (the header's area size, extent indices in array
//! references, record headers and the completion ring) is validated like the rest.
#![cfg(not(loom))]

mod common;

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::{name_guard, named, poke, unique};
use shm_ring::{
    ChannelConfig, CreateError, Message, MessageBuilder, OpenError, Receiver, RecvError,
    RecvTimeoutError, SendError, Sender, Transfer,
};

const MIB: usize = 1 << 20;

fn cfg() -> ChannelConfig {
    ChannelConfig {
        large_pool: 1 << 30,
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    }
}

fn pair(cfg: &ChannelConfig) -> (Sender, Receiver) {
    let tx = Sender::<Message>::anonymous(cfg).unwrap();
    let rx = Receiver::<Message>::from_fd(tx.as_fd().try_clone_to_owned().unwrap()).unwrap();
    (tx, rx)
}

/// Bytes of memory the channel's segment holds (allocated pages of its file).
fn held(tx: &Sender) -> usize {
    tx.segment().file().metadata().unwrap().blocks() as usize * 512
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (i as u32 ^ seed) as f32).collect()
}

/// Sends `x` as array "x" and receives it within `limit` (its length checked), dropping the
/// message at once.
fn send_x_and_receive_it(tx: &mut Sender, rx: &mut Receiver, x: &[f32], limit: Duration) {
    tx.send(
        MessageBuilder::new()
            .array_slice("x", &[x.len()], x)
            .unwrap(),
    )
    .unwrap();
    let m = rx.recv_timeout(limit).unwrap();
    assert_eq!(
        m.record(0).unwrap().array::<f32>("x").unwrap().len(),
        x.len()
    );
}

#[test]
fn arrays_bodies_and_loans_larger_than_a_block_round_trip() {
    for transfer in [Transfer::default(), Transfer::ZeroCopy, Transfer::Copy] {
        let (mut tx, mut rx) = pair(&ChannelConfig { transfer, ..cfg() });
        // 3 MiB, 10 MiB, and a small one beside them (Copy: all in a body of its own extent).
        let (a, b, c) = (data(3 * MIB / 4, 1), data(5 * MIB / 2, 2), data(16, 3));
        tx.send(
            MessageBuilder::new()
                .array_slice("a", &[a.len()], &a)
                .unwrap()
                .array_slice("b", &[b.len() / 1024, 1024], &b)
                .unwrap()
                .array_slice("c", &[16], &c)
                .unwrap(),
        )
        .unwrap();
        let m = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let r = m.record(0).unwrap();
        assert_eq!(r.array::<f32>("a").unwrap().as_slice().unwrap(), &a[..]);
        let got_b = r.array::<f32>("b").unwrap();
        assert_eq!(got_b.shape(), &[b.len() / 1024, 1024]);
        assert_eq!(got_b.as_slice().unwrap(), &b[..]);
        assert_eq!(r.array::<f32>("c").unwrap().as_slice().unwrap(), &c[..]);
        let zero_copy = match transfer {
            Transfer::Copy => 0,
            Transfer::ZeroCopy => 3,
            _ => 2, // a and b (c is below the threshold)
        };
        assert_eq!(m.leased_blocks(), zero_copy, "{transfer:?}");
        drop(m);
        // A loan of 8 MiB, filled in place, and one dropped unsent (its extent comes back).
        let loan = tx.loan::<u32>(&[2 * MIB]).unwrap();
        drop(loan);
        let loan = tx.loan::<u32>(&[2 * MIB]).unwrap().write_with(|i| i as u32);
        tx.send(MessageBuilder::new().array_loan("l", loan))
            .unwrap();
        let m = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let l = m.record(0).unwrap().array::<u32>("l").unwrap().to_owned();
        assert!(l.iter().enumerate().all(|(i, &v)| v == i as u32));
        drop(m);
        assert_eq!(tx.trim_memory(Duration::ZERO).unwrap(), 0, "{transfer:?}");
    }
}

#[test]
fn many_large_arrays_in_one_message_travel() {
    // More large arrays than a message may take extents for: the rest are copied into the
    // body, which then travels in an extent of its own.
    let (mut tx, mut rx) = pair(&cfg());
    let arrays: Vec<Vec<f32>> = (0..40).map(|i| data(MIB / 2 + i, i as u32)).collect();
    let names: Vec<String> = (0..40).map(|i| format!("a{i}")).collect();
    let mut b = MessageBuilder::new();
    for (n, a) in names.iter().zip(&arrays) {
        b = b.array_slice(n.as_str(), &[a.len()], a).unwrap();
    }
    tx.send(b).unwrap();
    let m = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let r = m.record(0).unwrap();
    for (n, a) in names.iter().zip(&arrays) {
        assert_eq!(
            r.array::<f32>(n).unwrap().as_slice().unwrap(),
            &a[..],
            "{n}"
        );
    }
    assert!(m.leased_blocks() < 40, "{} extents", m.leased_blocks());
}

#[test]
fn memory_follows_large_items_and_is_given_back_after() {
    let (mut tx, mut rx) = pair(&cfg());
    let base = held(&tx);
    assert!(base < 2 * MIB, "an idle channel holds {base} bytes");
    // Sixty 12 MiB items, each read and dropped before the next: the same reserved pages
    // serve them all.
    let x = data(3 * MIB, 7);
    let mut peak = 0;
    for _ in 0..60 {
        send_x_and_receive_it(&mut tx, &mut rx, &x, Duration::from_secs(5));
        peak = peak.max(held(&tx));
    }
    assert!(
        peak <= base + 2 * 12 * MIB + MIB,
        "reused pages: peak {peak} bytes for 12 MiB items"
    );
    // Nothing large for a while: small sends give the pages back.
    std::thread::sleep(shm_ring::LARGE_KEEP + Duration::from_millis(100));
    tx.send(MessageBuilder::new().meta_i64("n", 1)).unwrap();
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let after = held(&tx);
    assert!(
        after <= base + MIB,
        "{after} bytes held after ({base} before)"
    );
    // A held item keeps its pages; trimming gives back the rest at once.
    tx.send(
        MessageBuilder::new()
            .array_slice("x", &[x.len()], &x)
            .unwrap(),
    )
    .unwrap();
    let m = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(tx.trim_memory(Duration::ZERO).unwrap() >= 12 * MIB);
    assert!(held(&tx) >= base + 12 * MIB);
    drop(m);
    assert_eq!(tx.trim_memory(Duration::ZERO).unwrap(), 0);
    assert!(held(&tx) <= base + MIB);
}

#[test]
fn a_producer_far_ahead_waits_for_extents_and_never_loses_one() {
    let (mut tx, mut rx) = pair(&cfg());
    let n = 150usize;
    let reader = std::thread::spawn(move || {
        let mut sum = 0u64;
        for i in 0..n {
            let m = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            let x = m.record(0).unwrap().array::<u32>("x").unwrap().to_owned();
            assert_eq!(x.len(), MIB / 2 + i % 7);
            sum += u64::from(x[0]);
        }
        sum
    });
    for i in 0..n {
        let x = vec![i as u32; MIB / 2 + i % 7];
        tx.send(
            MessageBuilder::new()
                .array_slice("x", &[x.len()], &x)
                .unwrap(),
        )
        .unwrap();
    }
    assert_eq!(reader.join().unwrap(), (0..n as u64).sum::<u64>());
}

#[test]
fn without_a_large_pool_the_error_names_the_settings() {
    let (mut tx, _rx) = pair(&ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    });
    let x = data(MIB / 2, 1); // 2 MiB
    let e = tx
        .send(
            MessageBuilder::new()
                .array_slice("x", &[x.len()], &x)
                .unwrap(),
        )
        .unwrap_err();
    let s = e.to_string();
    assert!(matches!(e, SendError::TooLarge { .. }), "{e:?}");
    assert!(
        s.contains("ChannelConfig::block_size") && s.contains("ChannelConfig::large_pool"),
        "{s}"
    );
    let e = tx.loan::<f32>(&[MIB]).unwrap_err().to_string();
    assert!(e.contains("ChannelConfig::large_pool"), "{e}");
    // An area too small for the array names it.
    let (mut tx, _rx) = pair(&ChannelConfig {
        large_pool: MIB,
        ..cfg()
    });
    let e = tx
        .send(
            MessageBuilder::new()
                .array_slice("x", &[x.len()], &x)
                .unwrap(),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("set ChannelConfig::large_pool to at least"),
        "{e}"
    );
}

#[test]
fn large_pool_settings_are_checked() {
    for large_pool in [1, 4095, (1 << 40) + 4096] {
        let r = Sender::<Message>::anonymous(&ChannelConfig {
            large_pool,
            ..cfg()
        });
        assert!(
            matches!(r, Err(CreateError::InvalidArgument(_))),
            "{large_pool}"
        );
    }
    let r = Sender::<Message>::anonymous(&ChannelConfig { blocks: 0, ..cfg() });
    assert!(matches!(r, Err(CreateError::InvalidArgument(_))));
}

// ----- hostile peers: every new value read from shared memory is validated

fn le32(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn le64(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

#[test]
fn the_header_area_size_is_checked_against_the_segment() {
    let (name, guard) = named("large-hdr");
    let c = cfg();
    let tx = Sender::<Message>::create(&name, &c).unwrap();
    let l = shm_ring::channel_layout(&c).unwrap();
    assert_eq!(l.large_len, 1 << 30);
    for v in [0u64, 4096, 1 << 31, u64::MAX, (1 << 30) + 1] {
        poke(&tx, l.channel_wire.large_pool, &le64(v));
        match Receiver::<Message>::open(&name) {
            Err(OpenError::Corrupt(why)) => assert!(why.contains("large pool"), "{v}: {why}"),
            other => panic!("{v}: expected Corrupt, got {other:?}"),
        }
    }
    poke(&tx, l.channel_wire.large_pool, &le64(1 << 30));
    let rx = Receiver::<Message>::open(&name).unwrap();
    drop((tx, rx));
    guard.assert_gone();
}

/// A named channel with a large pool, holding one message whose 2 MiB array lies in the
/// first extent (block index `blocks`).
fn named_with_extent(tag: &str) -> (String, Sender, Receiver, shm_ring::ChannelLayout) {
    named_with_half_mib_array(tag, &cfg())
}

/// A named channel of config `c` (and its layout) into which one message with a 2 MiB array
/// "x" (`data(MIB / 2, 1)`) has been sent.
fn named_with_half_mib_array(
    tag: &str,
    c: &ChannelConfig,
) -> (String, Sender, Receiver, shm_ring::ChannelLayout) {
    let name = unique(tag);
    let mut tx = Sender::<Message>::create(&name, c).unwrap();
    let rx = Receiver::<Message>::open(&name).unwrap();
    let l = shm_ring::channel_layout(c).unwrap();
    let x = data(MIB / 2, 1);
    tx.send(
        MessageBuilder::new()
            .array_slice("x", &[x.len()], &x)
            .unwrap(),
    )
    .unwrap();
    (name, tx, rx, l)
}

#[test]
fn an_array_reference_past_the_large_area_is_corrupt() {
    let l = shm_ring::channel_layout(&cfg()).unwrap();
    let pages = (l.large_len / 4096) as u64;
    let blocks = u64::from(cfg().blocks);
    // The array's block index: the extent just past the end, the last page (its 2 MiB run
    // past the end), an index whose byte offset overflows.
    for idx in [blocks + pages, blocks + pages - 1, u64::MAX] {
        let (name, tx, mut rx, l) = named_with_extent("large-ref");
        let guard = name_guard(&[&name]);
        let w = l.body_wire;
        let field = l.desc_slots + l.record_header + w.header + w.record_header;
        poke(&tx, field + w.field_a, &le64(idx));
        match rx.recv_timeout(Duration::from_secs(2)) {
            Err(RecvTimeoutError::Failed(RecvError::Corrupt(why))) => {
                assert!(why.contains(&format!("array in block {idx}")), "{why}")
            }
            other => panic!("{idx}: expected Corrupt, got {other:?}"),
        }
        drop((tx, rx));
        guard.assert_gone();
    }
}

#[test]
fn a_record_body_past_the_large_area_is_corrupt() {
    let c = ChannelConfig {
        transfer: Transfer::Copy,
        ..cfg()
    };
    // A 2 MiB body (Copy: the array is in it) lies in the first extent.
    let (name, mut tx, mut rx, l) = named_with_half_mib_array("large-rec", &c);
    let guard = name_guard(&[&name]);
    let x = data(MIB / 2, 1);
    let w = l.record_wire;
    let pages = (l.large_len / 4096) as u32;
    let blocks = c.blocks;
    // The body's extent moved to the last page: its 2 MiB would run past the area.
    poke(&tx, l.desc_slots + w.block, &le32(blocks + pages - 1));
    match rx.recv_timeout(Duration::from_secs(2)) {
        Err(RecvTimeoutError::Failed(RecvError::Corrupt(why))) => assert!(
            why.contains(&format!("block {}", blocks + pages - 1)),
            "{why}"
        ),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // The extent came back through the "dropped" note: the channel goes on.
    send_x_and_receive_it(&mut tx, &mut rx, &x, Duration::from_secs(2));
    assert_eq!(tx.trim_memory(Duration::ZERO).unwrap(), 0, "no extent lost");
    drop((tx, rx));
    guard.assert_gone();
}

#[test]
fn a_consumer_returning_an_extent_not_in_flight_is_corrupt() {
    let (name, guard) = named("large-comp");
    let c = cfg();
    let mut tx = Sender::<Message>::create(&name, &c).unwrap();
    let l = shm_ring::channel_layout(&c).unwrap();
    // Completion slot 0 = the first extent (never sent), completion tail = 1.
    poke(&tx, l.comp_slots, &le64(u64::from(c.blocks)));
    poke(&tx, l.comp_ring, &le32(1));
    let x = data(MIB / 2, 1);
    match tx.send(
        MessageBuilder::new()
            .array_slice("x", &[x.len()], &x)
            .unwrap(),
    ) {
        Err(SendError::Corrupt(why)) => assert!(why.contains("not in flight"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop(tx);
    guard.assert_gone();
}

#[test]
fn a_producer_ahead_of_its_consumer_holds_at_most_large_in_flight() {
    let (mut tx, mut rx) = pair(&cfg());
    let x = data(MIB, 1); // 4 MiB items
    let mut sent = 0;
    loop {
        let m = MessageBuilder::new()
            .array_slice("x", &[x.len()], &x)
            .unwrap();
        match tx.try_send(m) {
            Ok(()) => sent += 1,
            Err(shm_ring::TrySendError::Full(_)) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(sent <= 64, "never full");
    }
    assert_eq!(
        sent,
        shm_ring::LARGE_IN_FLIGHT / (4 * MIB),
        "4 MiB items in flight"
    );
    assert!(
        held(&tx) <= shm_ring::LARGE_IN_FLIGHT + 2 * MIB,
        "{}",
        held(&tx)
    );
    // One item larger than the whole budget goes alone, once the consumer keeps at most half.
    for _ in 0..sent {
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
    }
    let huge = data(20 * MIB, 2); // 80 MiB
    fn m(a: &[f32]) -> MessageBuilder<'_> {
        MessageBuilder::new()
            .array_slice("h", &[a.len()], a)
            .unwrap()
    }
    tx.send(m(&huge)).unwrap();
    assert!(matches!(
        tx.try_send(m(&huge)),
        Err(shm_ring::TrySendError::Full(_))
    ));
    let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(first.leased_large_bytes() >= 80 * MIB);
    drop(first);
    tx.send(m(&huge)).unwrap();
    let second = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(
        second.record(0).unwrap().array::<f32>("h").unwrap().len(),
        huge.len()
    );
}

/// A named channel (a sealed memfd the consumer gets from the rendezvous socket) carries its
/// large area to a consumer in another process: 12 MiB arrays in extents, read in place there.
#[test]
fn a_named_channel_carries_large_items_to_another_process() {
    let (name, guard) = named("large-named");
    let mut tx = Sender::<Message>::create(&name, &cfg()).unwrap();
    let peer = common::Peer::spawn(&["sink", &name]);
    let len = 3 * MIB;
    let mut want = 0f64;
    for k in 1..=5u32 {
        // Integers below 2^24 in every partial sum: the peer's f32 sum is exact.
        let x = vec![k as f32; len];
        want += f64::from(k) * len as f64;
        tx.send(MessageBuilder::new().array_slice("x", &[len], &x).unwrap())
            .unwrap();
    }
    tx.send(
        MessageBuilder::new()
            .array_slice("x", &[4], &[1f32; 4])
            .unwrap(),
    )
    .unwrap();
    drop(tx);
    let (ok, out, err) = peer.finish(Duration::from_secs(60));
    assert!(ok, "peer failed: {err}");
    assert_eq!(out.trim(), format!("sink 6 {}", want + 4.0), "{err}");
    guard.assert_gone();
}
