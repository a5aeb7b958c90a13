//! Hostile schema bytes: a channel's schema region (and the header word that sizes it) is read
//! once at open into a private copy and validated; every kind of damage is its own error, and
//! nothing of a bad schema is used. Offsets come from the layout code
//! (`shm_ring::typed_channel_layout`), never hard-coded.
#![cfg(not(loom))]

mod common;

use std::time::Duration;

use common::{named, poke};
use shm_ring::{ChannelConfig, ChannelLayout, OpenError, Receiver, SchemaError, Sender};

fn no_linger() -> ChannelConfig {
    ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    }
}

type V = [f32; 16];

/// Creates a typed `[f32; 16]` channel, applies `pokes` (offsets from its layout) and returns
/// what opening it gives.
fn open_typed_after(pokes: impl Fn(&ChannelLayout) -> Vec<(usize, Vec<u8>)>) -> OpenError {
    let (name, guard) = named("schema-typed");
    let l = shm_ring::typed_channel_layout::<V>(&no_linger()).unwrap();
    let tx = Sender::<V>::create(&name, &no_linger()).unwrap();
    for (at, bytes) in pokes(&l) {
        poke(&tx, at, &bytes);
    }
    let err = Receiver::<V>::open(&name).expect_err("a damaged schema was accepted");
    drop(tx);
    guard.assert_gone();
    err
}

fn value_entry(l: &ChannelLayout) -> usize {
    l.schema + l.schema_wire.entries
}

#[test]
fn an_intact_typed_schema_opens() {
    let l = shm_ring::typed_channel_layout::<V>(&no_linger()).unwrap();
    assert!(l.schema_len > 16 && l.schema + l.schema_len <= l.pool);
    let (name, guard) = named("schema-ok");
    let tx = Sender::<V>::create(&name, &no_linger()).unwrap();
    let rx = Receiver::<V>::open(&name).unwrap();
    drop((tx, rx));
    guard.assert_gone();
}

#[test]
fn bad_magic() {
    let e = open_typed_after(|l| vec![(l.schema + l.schema_wire.magic, b"XXXX".to_vec())]);
    assert!(
        matches!(e, OpenError::Schema(SchemaError::BadMagic { found }) if found == u32::from_le_bytes(*b"XXXX")),
        "{e:?}"
    );
}

#[test]
fn unknown_kind() {
    let e =
        open_typed_after(|l| vec![(l.schema + l.schema_wire.kind, 9u32.to_le_bytes().to_vec())]);
    assert!(
        matches!(e, OpenError::Schema(SchemaError::UnknownKind(9))),
        "{e:?}"
    );
}

#[test]
fn stated_length_differs_from_the_region() {
    let e = open_typed_after(|l| {
        let n = (l.schema_len as u32 + 1).to_le_bytes().to_vec();
        vec![(l.schema + l.schema_wire.len, n)]
    });
    assert!(
        matches!(e, OpenError::Schema(SchemaError::LengthMismatch { .. })),
        "{e:?}"
    );
}

#[test]
fn a_typed_schema_with_two_entries() {
    let e =
        open_typed_after(|l| vec![(l.schema + l.schema_wire.count, 2u32.to_le_bytes().to_vec())]);
    assert!(
        matches!(&e, OpenError::Schema(SchemaError::Inconsistent(w)) if w.contains("2 entries")),
        "{e:?}"
    );
}

#[test]
fn unknown_dtype_code() {
    let e = open_typed_after(|l| vec![(value_entry(l) + l.schema_wire.value_dtype, vec![99])]);
    assert!(
        matches!(
            e,
            OpenError::Schema(SchemaError::BadDType { field: 0, code: 99 })
        ),
        "{e:?}"
    );
}

#[test]
fn rank_over_the_limit() {
    let e = open_typed_after(|l| vec![(value_entry(l) + l.schema_wire.value_rank, vec![200])]);
    assert!(
        matches!(
            e,
            OpenError::Schema(SchemaError::BadRank {
                field: 0,
                rank: 200
            })
        ),
        "{e:?}"
    );
}

#[test]
fn size_contradicting_dtype_and_shape() {
    let e = open_typed_after(|l| {
        vec![(
            value_entry(l) + l.schema_wire.value_size,
            128u32.to_le_bytes().to_vec(),
        )]
    });
    assert!(
        matches!(&e, OpenError::Schema(SchemaError::Inconsistent(w)) if w.contains("128 bytes")),
        "{e:?}"
    );
}

#[test]
fn alignment_not_a_power_of_two() {
    let e = open_typed_after(|l| {
        vec![(
            value_entry(l) + l.schema_wire.value_align,
            3u32.to_le_bytes().to_vec(),
        )]
    });
    assert!(
        matches!(&e, OpenError::Schema(SchemaError::Inconsistent(w)) if w.contains("alignment 3")),
        "{e:?}"
    );
}

#[test]
fn name_running_past_the_end() {
    let e = open_typed_after(|l| {
        vec![(
            value_entry(l) + l.schema_wire.value_name_len,
            u16::MAX.to_le_bytes().to_vec(),
        )]
    });
    assert!(
        matches!(e, OpenError::Schema(SchemaError::Truncated { .. })),
        "{e:?}"
    );
}

#[test]
fn name_not_utf8() {
    let e = open_typed_after(|l| {
        // The type name follows the one dimension of the value entry.
        vec![(value_entry(l) + l.schema_wire.value_dims + 4, vec![0xff])]
    });
    assert!(
        matches!(e, OpenError::Schema(SchemaError::BadName { field: 0, .. })),
        "{e:?}"
    );
}

#[test]
fn schema_length_word_damage() {
    // A region that no longer fits the segment: the geometry check.
    for len in [1u32 << 20, u32::MAX] {
        let e = open_typed_after(|l| vec![(l.schema_len_word, len.to_le_bytes().to_vec())]);
        assert!(
            matches!(&e, OpenError::Corrupt(w) if w.contains(&format!("{len} B of schema"))),
            "{len}: {e:?}"
        );
    }
    // One that still fits: the schema's own length disagrees.
    let e = open_typed_after(|l| {
        let n = (l.schema_len as u32 - 1).to_le_bytes().to_vec();
        vec![(l.schema_len_word, n)]
    });
    assert!(
        matches!(e, OpenError::Schema(SchemaError::LengthMismatch { .. })),
        "{e:?}"
    );
    // No schema at all: then it is not a typed channel.
    let e = open_typed_after(|l| vec![(l.schema_len_word, 0u32.to_le_bytes().to_vec())]);
    assert!(
        matches!(
            e,
            OpenError::Schema(SchemaError::Mismatch { .. }) | OpenError::Corrupt(_)
        ),
        "{e:?}"
    );
}
