//! Every dtype crosses a pipeline unchanged (issue 9: f16, bf16 and bool were lost), through
//! both transports and every transfer mode (zero-copy arrays included).

mod common;

use common::ShmGuard;
use shmpipe::half::{bf16, f16};
use shmpipe::ndarray::{Array1, Array2};
use shmpipe::{DType, Item, Pipeline, Registry, Transfer, map};

fn registry() -> Registry {
    // Forwards every array unread, and adds one derived from the bool mask: the worker reads
    // each dtype as well as passing it on.
    Registry::new().step("count_mask", |_cx| {
        Ok(map(|it: Item| {
            let n = it
                .get("mask")
                .map_or(0, |m| m.bytes().iter().filter(|&&b| b == 1).count());
            Ok(it.with_meta("true_count", n as i64))
        }))
    })
}

fn item(i: usize, len: usize) -> Item {
    Item::new()
        .with_meta("i", i as i64)
        .with(
            "h",
            Array1::from_shape_fn(len, |j| f16::from_f32((i + j) as f32 * 0.5)),
        )
        .with(
            "b",
            Array1::from_shape_fn(len, |j| bf16::from_f32(-((i * j) as f32))),
        )
        .with(
            "mask",
            Array1::from_shape_fn(len, |j| (i + j).is_multiple_of(3)),
        )
        .with(
            "u",
            Array2::from_shape_fn((2, len), |(r, j)| u64::MAX - (r * len + j + i) as u64),
        )
}

#[test]
fn f16_bf16_bool_and_u64_arrays_cross_unchanged() {
    let reg = registry();
    shmpipe::init(&reg);
    for socket in [false, true] {
        for (transfer, len) in [
            (Transfer::Copy, 16),
            (Transfer::ZeroCopy, 16),
            (Transfer::Adaptive { threshold: 4096 }, 4096),
        ] {
            let p = Pipeline::builder(&reg)
                .step("count_mask")
                .workers(2)
                .socket_transport(socket)
                .transfer(transfer)
                .start()
                .unwrap();
            let _g = ShmGuard::containing(p.id().to_owned());
            let mut out = p.run((0..50).map(|i| item(i, len))).unwrap();
            out.sort_by_key(|it| it.i64("i"));
            assert_eq!(out.len(), 50, "socket {socket} {transfer:?}");
            for (i, got) in out.iter_mut().enumerate() {
                let want = item(i, len);
                let trues = want
                    .get("mask")
                    .unwrap()
                    .bytes()
                    .iter()
                    .filter(|&&b| b == 1)
                    .count();
                assert_eq!(got.remove_meta("true_count"), Some((trues as i64).into()));
                assert_eq!(*got, want, "socket {socket} {transfer:?} item {i}");
                let dtypes: Vec<DType> = got.arrays().map(|(_, a)| a.dtype()).collect();
                assert_eq!(dtypes, [DType::F16, DType::BF16, DType::Bool, DType::U64]);
            }
        }
    }
}

#[test]
fn array_mut_edits_heap_arrays_in_place_keeping_their_shape() {
    let mut it = Item::new()
        .with("h", Array1::from(vec![f16::from_f32(1.0), f16::ZERO]))
        .with(
            "x",
            Array2::from_shape_vec((2, 2), vec![1u16, 2, 3, 4]).unwrap(),
        );
    it.array_mut::<f16>("h").unwrap()[1] = f16::from_f32(-2.0);
    it.array_mut::<u16>("x").unwrap()[[1, 0]] = 9;
    assert!(it.array_mut::<u8>("x").is_none(), "u16 is not u8");
    let h = it.array::<f16>("h").unwrap();
    assert_eq!(
        h.as_slice(),
        Some(&[f16::from_f32(1.0), f16::from_f32(-2.0)][..])
    );
    let x = it.array::<u16>("x").unwrap();
    assert_eq!(
        (x.shape(), x.as_slice()),
        (&[2, 2][..], Some(&[1, 2, 9, 4][..]))
    );
}
