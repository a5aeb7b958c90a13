//! Property tests of the message encoding: random dtypes, shapes and metadata round-trip;
//! random bytes never make the decoder panic.
#![cfg(not(loom))]

use proptest::prelude::*;
use shm_ring::{DType, FieldRef, MessageBuilder, MessageView, MetaValue};

#[derive(Debug, Clone)]
enum Field {
    Array(DType, Vec<usize>, Vec<u8>),
    I64(i64),
    F64(f64),
    Str(String),
}

fn field() -> impl Strategy<Value = Field> {
    prop_oneof![
        (0usize..13, prop::collection::vec(0usize..5, 0..4)).prop_flat_map(|(d, shape)| {
            let dtype = DType::ALL[d];
            let n: usize = shape.iter().product::<usize>() * dtype.size();
            prop::collection::vec(any::<u8>(), n..=n).prop_map(move |bytes| {
                let bytes = if dtype == DType::Bool {
                    bytes.iter().map(|b| b & 1).collect()
                } else {
                    bytes
                };
                Field::Array(dtype, shape.clone(), bytes)
            })
        }),
        any::<i64>().prop_map(Field::I64),
        any::<f64>()
            .prop_filter("not NaN", |x| !x.is_nan())
            .prop_map(Field::F64),
        "[a-zA-Z0-9 _-]{0,40}".prop_map(Field::Str),
    ]
}

fn message() -> impl Strategy<Value = (u32, Vec<Vec<Field>>)> {
    (
        any::<u32>(),
        prop::collection::vec(prop::collection::vec(field(), 0..6), 1..4),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn round_trip((tag, records) in message()) {
        let names: Vec<Vec<String>> = records
            .iter()
            .map(|r| (0..r.len()).map(|i| format!("f{i}")).collect())
            .collect();
        let mut b = MessageBuilder::new().tag(tag);
        for (ri, rec) in records.iter().enumerate() {
            if ri > 0 {
                b = b.next_record();
            }
            for (fi, f) in rec.iter().enumerate() {
                let name = names[ri][fi].as_str();
                b = match f {
                    Field::Array(d, shape, bytes) => b.array_raw(name, *d, shape, bytes).unwrap(),
                    Field::I64(v) => b.meta_i64(name, *v),
                    Field::F64(v) => b.meta_f64(name, *v),
                    Field::Str(s) => b.meta_str(name, s.as_str()),
                };
            }
        }
        let (buf, len) = b.encode_inline().unwrap();
        let body = &bytemuck::cast_slice::<u64, u8>(&buf)[..len];
        let m = MessageView::decode(body).unwrap();
        prop_assert_eq!(m.tag(), tag);
        prop_assert_eq!(m.len(), records.len());
        for (ri, rec) in records.iter().enumerate() {
            let r = m.record(ri).unwrap();
            prop_assert_eq!(r.fields().count(), rec.len());
            for (fi, f) in rec.iter().enumerate() {
                let name = names[ri][fi].as_str();
                match f {
                    Field::Array(d, shape, bytes) => {
                        let a = r.array_info(name).unwrap();
                        prop_assert_eq!(a.dtype, *d);
                        prop_assert_eq!(a.shape.as_slice(), shape.as_slice());
                        prop_assert_eq!(a.bytes, bytes.as_slice());
                        if *d == DType::F32 {
                            let v = r.array::<f32>(name).unwrap();
                            prop_assert_eq!(v.shape(), shape.as_slice());
                        }
                        if *d == DType::Bool {
                            let v = r.array_bool(name).unwrap();
                            prop_assert_eq!(v.len(), bytes.len());
                        }
                    }
                    Field::I64(v) => prop_assert_eq!(r.meta_i64(name), Some(*v)),
                    Field::F64(v) => prop_assert_eq!(r.meta_f64(name), Some(*v)),
                    Field::Str(s) => prop_assert_eq!(r.meta(name), Some(MetaValue::Str(s.as_str().into()))),
                }
            }
        }
    }

    #[test]
    fn garbage_never_panics(mut bytes in prop::collection::vec(any::<u8>(), 0..512), keep_header in any::<bool>()) {
        if keep_header && bytes.len() >= 16 {
            bytes[0..4].copy_from_slice(b"SRB1");
            let len = bytes.len() as u32;
            bytes[12..16].copy_from_slice(&len.to_le_bytes());
        }
        let mut aligned = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..bytes.len()].copy_from_slice(&bytes);
        let body = &bytemuck::cast_slice::<u64, u8>(&aligned)[..bytes.len()];
        if let Ok(m) = MessageView::decode(body) {
            for r in m.records().flatten() {
                for f in r.fields() {
                    let _ = f;
                }
                let _ = r.array::<f32>("x");
            }
        }
    }

    #[test]
    fn single_byte_flips_are_caught_or_harmless(flip_at in 0usize..200, bit in 0u8..8) {
        let data: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let b = MessageBuilder::new()
            .meta_str("id", "abc")
            .array_slice("x", &[4, 4], &data)
            .unwrap();
        let (mut buf, len) = b.encode_inline().unwrap();
        let bytes = bytemuck::cast_slice_mut::<u64, u8>(&mut buf);
        let at = flip_at % len;
        bytes[at] ^= 1 << bit;
        let body = &bytemuck::cast_slice::<u64, u8>(&buf)[..len];
        // Either an error, or a message whose arrays are all within the body.
        if let Ok(m) = MessageView::decode(body) {
            for r in m.records().flatten() {
                for f in r.fields().flatten() {
                    let FieldRef::Array(a) = f else { continue };
                    let start = a.bytes.as_ptr() as usize - body.as_ptr() as usize;
                    prop_assert!(start + a.bytes.len() <= len);
                }
            }
        }
    }
}

#[test]
fn record_tags_round_trip_and_default_to_zero() {
    let x = [1.0f32, 2.0];
    let m = MessageBuilder::new()
        .record_tag(7)
        .array_slice("x", &[2], &x)
        .expect("shape matches")
        .record_tag(u64::MAX) // the last call for a record wins
        .next_record()
        .meta_i64("n", 1)
        .next_record()
        .record_tag(1 << 40);
    let (words, len) = m.encode_inline().expect("encode");
    let body = &bytemuck::cast_slice::<u64, u8>(&words)[..len];
    let view = MessageView::decode(body).expect("decode");
    let tags: Vec<u64> = view.records().map(|r| r.expect("record").tag()).collect();
    assert_eq!(tags, [u64::MAX, 0, 1 << 40]);
}
