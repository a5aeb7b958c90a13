//! The fused chain gives exactly the step-by-step chain's windows and batches.

use proptest::prelude::*;
use shmpipe_timeseries::batch::stack;
use shmpipe_timeseries::workload::{ChainConfig, Split, deepar_chain, deepar_chain_fused};
use shmpipe_timeseries::{DataEntry, FieldArray, Period};

fn entry(values: &[Option<f32>], start: i64, freq: &str, with_static: bool) -> DataEntry {
    let mut e = DataEntry::default();
    e.insert(
        "target",
        FieldArray::from_vec(values.iter().map(|v| v.unwrap_or(f32::NAN)).collect()),
    );
    if with_static {
        e.insert("feat_static_cat", FieldArray::from_vec(vec![3.0]));
    }
    e.item_id = Some("s".into());
    e.start = Some(Period {
        freq: freq.parse().unwrap(),
        ordinal: start,
    });
    e
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn fused_equals_chain(
        series in prop::collection::vec(
            (prop::collection::vec(prop::option::weighted(0.9, -1e3f32..1e3), 0..120), 0i64..500_000, any::<bool>()),
            1..12),
        freq in prop::sample::select(vec!["h", "D", "W", "M", "15min", "2h"]),
        context in 1usize..40,
        prediction in 1usize..12,
        num_instances in 0.5f64..4.0,
        is_train in any::<bool>(),
        seed in any::<u64>(),
        split in prop::sample::select(vec![Split::Train, Split::Validation, Split::Test]),
        min_past in 0usize..8,
        min_future in prop::option::of(0usize..8),
    ) {
        let cfg = ChainConfig {
            freq: freq.parse().unwrap(),
            context_length: context,
            prediction_length: prediction,
            num_instances,
            fused: false,
            split,
            min_past,
            min_future,
            mean_window: None,
        };
        let mut a = deepar_chain(&cfg, seed);
        let mut b = deepar_chain_fused(&cfg, seed);
        // The same chains on borrowed entries (`apply_ref`: the fused step reads
        // the target in place, the step-by-step chain copies it).
        let mut c = deepar_chain_fused(&cfg, seed);
        let mut d = deepar_chain(&cfg, seed);
        let (mut wa, mut wb, mut wc, mut wd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (values, start, st) in &series {
            let e = entry(values, *start, freq, *st);
            // The test split's sampler fails on a series shorter than `min_past`.
            let rc = c.apply_ref(&e, is_train, &mut wc);
            let rd = d.apply_ref(&e, is_train, &mut wd);
            let ra = a.apply(e.clone(), is_train, &mut wa);
            let rb = b.apply(e, is_train, &mut wb);
            prop_assert_eq!(ra.is_ok(), rb.is_ok());
            prop_assert_eq!(ra.is_ok(), rc.is_ok());
            prop_assert_eq!(ra.is_ok(), rd.is_ok());
        }
        prop_assert_eq!(wa.len(), wb.len());
        for (x, y) in wa.iter().zip(&wb) {
            prop_assert_eq!(x, y);
        }
        prop_assert_eq!(&wb, &wc);
        prop_assert_eq!(&wa, &wd);
        // Stack runs of windows with the same fields, as a batcher would.
        let same: Vec<DataEntry> = wa.iter().filter(|w| !w.contains("feat_static_cat")).cloned().collect();
        let same_b: Vec<DataEntry> = wb.iter().filter(|w| !w.contains("feat_static_cat")).cloned().collect();
        if !same.is_empty() && is_train {
            // Windows of different lengths (a `min_future` below the prediction
            // length) do not stack, for either chain.
            match (stack(&same), stack(&same_b)) {
                (Ok(x), Ok(y)) => prop_assert_eq!(x, y),
                (x, y) => prop_assert!(x.is_err() && y.is_err()),
            }
        }
    }
}
