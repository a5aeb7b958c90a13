//! Fuzzing the record/body decoder with a fixed case budget (CI-sized): arbitrary bytes, and
//! valid encodings with structured mutations (overwritten words, flipped bits, truncation,
//! grown lengths), through both read paths: the owned decode and the in-place path (header
//! copy + parse + every accessor). No input may panic; valid encodings must decode.
#![cfg(not(loom))]

use proptest::prelude::*;
use shm_ring::read_in_place;
use shm_ring::{DType, MessageBuilder, MessageView};

/// A valid body: `records` records of `fields` fields (arrays of all dtypes and metadata),
/// with arrays large enough that some bodies take the header-copy path (> 4 KiB).
fn valid_body(seed: u64, records: usize, fields: usize, big: bool) -> Vec<u8> {
    let mut data: Vec<Vec<u8>> = Vec::new();
    let mut shapes = Vec::new();
    for i in 0..records * fields {
        let dtype = DType::ALL[(seed as usize + i) % DType::ALL.len()];
        let n = if big && i % 3 == 0 {
            1500
        } else {
            (seed as usize + 3 * i) % 9
        };
        shapes.push((dtype, n));
        data.push(
            (0..n * dtype.size())
                .map(|k| {
                    if dtype == DType::Bool {
                        (k % 2) as u8
                    } else {
                        k as u8
                    }
                })
                .collect(),
        );
    }
    let mut b = MessageBuilder::new().tag(seed as u32);
    for r in 0..records {
        if r > 0 {
            b = b.next_record();
        }
        for f in 0..fields {
            let i = r * fields + f;
            let (dtype, n) = shapes[i];
            b = match i % 4 {
                0 => b.meta_i64(format!("m{f}"), i as i64),
                1 => b.meta_str(format!("m{f}"), "x".repeat(i % 50)),
                _ => b.array_raw(format!("a{f}"), dtype, &[n], &data[i]).unwrap(),
            };
        }
    }
    let (buf, len) = b.encode_inline().unwrap();
    bytemuck::cast_slice::<u64, u8>(&buf)[..len].to_vec()
}

#[derive(Debug, Clone)]
enum Mutation {
    Byte(usize, u8),
    Flip(usize, u8),
    Word(usize, u64),
    Truncate(usize),
    Extend(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Byte(a, b)),
        (any::<usize>(), 0u8..8).prop_map(|(a, b)| Mutation::Flip(a, b)),
        (
            any::<usize>(),
            prop_oneof![Just(0u64), Just(u64::MAX), Just(1 << 32), any::<u64>()]
        )
            .prop_map(|(a, w)| Mutation::Word(a, w)),
        any::<usize>().prop_map(Mutation::Truncate),
        (0usize..64).prop_map(Mutation::Extend),
    ]
}

fn apply(body: &mut Vec<u8>, m: &Mutation) {
    let n = body.len().max(1);
    match *m {
        Mutation::Byte(a, b) if !body.is_empty() => body[a % n] = b,
        Mutation::Flip(a, bit) if !body.is_empty() => body[a % n] ^= 1 << bit,
        Mutation::Word(a, w) if body.len() >= 8 => {
            let at = (a % (body.len() - 7)) & !3;
            body[at..at + 8].copy_from_slice(&w.to_le_bytes());
        }
        Mutation::Truncate(a) => body.truncate(a % n),
        Mutation::Extend(k) => body.extend(std::iter::repeat_n(0xa5, k)),
        _ => {}
    }
}

fn read_all(body: &[u8]) {
    // Owned path: the body is private; then the in-place path.
    if let Ok(v) = MessageView::decode(body) {
        for r in v.records().flatten() {
            for f in r.fields().flatten() {
                let _ = r.array_bytes(f.name());
                let _ = r.meta(f.name());
            }
        }
    }
    let _ = read_in_place(body);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 15000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..600)) {
        read_all(&body);
    }

    #[test]
    fn valid_encodings_decode_and_mutations_never_panic(
        seed in any::<u64>(),
        records in 1usize..4,
        fields in 0usize..6,
        big in any::<bool>(),
        muts in prop::collection::vec(mutation(), 0..6),
    ) {
        let mut body = valid_body(seed, records, fields, big);
        let n = read_in_place(&body).unwrap();
        prop_assert_eq!(n, records * fields);
        prop_assert!(MessageView::decode(&body).is_ok());
        for m in &muts {
            apply(&mut body, m);
            read_all(&body);
        }
    }
}
