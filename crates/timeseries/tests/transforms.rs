//! Transformation behaviour the golden fixtures do not cover: errors, lead time,
//! the `(dim, time)` layout, custom padding, batching errors.

use shmpipe_timeseries::batch::stack;
use shmpipe_timeseries::sampler::{InstanceSampler, PredictionSplitSampler};
use shmpipe_timeseries::transform::{
    AddAgeFeature, AsNumpyArray, Chain, InstanceSplitter, RemoveFields, Transform, VstackFeatures,
};
use shmpipe_timeseries::{BatchError, DataEntry, FieldArray, Period, TransformError};

fn entry(target: FieldArray) -> DataEntry {
    let mut e = DataEntry::default();
    e.insert("target", target);
    e.start = Some(Period::parse("2021-01-01 00:00", "h".parse().unwrap()).unwrap());
    e
}

#[derive(Debug)]
struct At(Vec<usize>);

impl InstanceSampler for At {
    fn sample(&mut self, _len: usize, out: &mut Vec<usize>) -> bool {
        out.extend_from_slice(&self.0);
        true
    }
}

fn run(step: &mut dyn Transform, e: DataEntry) -> Result<Vec<DataEntry>, TransformError> {
    let mut out = Vec::new();
    step.apply(e, true, &mut out)?;
    Ok(out)
}

#[test]
fn errors_name_step_and_field() {
    let e = entry(FieldArray::new(&[2, 3], vec![0.0; 6]));
    let err = run(&mut AsNumpyArray::new("target", 1), e.clone()).unwrap_err();
    assert_eq!(
        err,
        TransformError::BadNdim {
            step: "AsNumpyArray",
            field: "target".into(),
            expected: 1,
            got: 2
        }
    );
    let err = run(&mut AsNumpyArray::new("missing", 1), e.clone()).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");

    let mut v = entry(FieldArray::from_vec(vec![1.0; 4]));
    v.insert("other", FieldArray::from_vec(vec![1.0; 5]));
    let err = run(&mut VstackFeatures::new("x", &["target", "other"]), v).unwrap_err();
    assert!(
        matches!(
            err,
            TransformError::LengthMismatch {
                expected: 4,
                got: 5,
                ..
            }
        ),
        "{err}"
    );

    let mut no_start = entry(FieldArray::from_vec(vec![1.0; 3]));
    no_start.start = None;
    let mut chain = Chain::new().then(shmpipe_timeseries::transform::AddTimeFeatures::new(
        "target",
        "time_feat",
        vec![shmpipe_timeseries::features::TimeFeature::HourOfDay],
        0,
    ));
    let err = chain.apply(no_start, true, &mut Vec::new()).unwrap_err();
    assert_eq!(
        err,
        TransformError::MissingStart {
            step: "AddTimeFeatures"
        }
    );

    let mut test_split = InstanceSplitter::new(
        "target",
        "is_pad",
        Box::new(PredictionSplitSampler::test(10)),
        4,
        2,
        &[],
    );
    let err = run(&mut test_split, entry(FieldArray::from_vec(vec![1.0; 3]))).unwrap_err();
    assert_eq!(
        err,
        TransformError::EmptyInterval {
            step: "InstanceSplitter",
            len: 3
        }
    );
}

#[test]
fn lead_time_dummy_value_and_dim_time_layout() {
    // Target (2, 8): row r, time t -> 10 r + t.
    let data: Vec<f32> = (0..2)
        .flat_map(|r| (0..8).map(move |t| (10 * r + t) as f32))
        .collect();
    let e = entry(FieldArray::new(&[2, 8], data));
    let mut s = InstanceSplitter::new("target", "is_pad", Box::new(At(vec![3])), 5, 2, &[])
        .with_lead_time(1)
        .with_dummy_value(-1.0)
        .with_output_ntc(false);
    let w = run(&mut s, e.clone()).unwrap().remove(0);
    let past = w.get("past_target").unwrap();
    assert_eq!(past.shape(), &[2, 5]);
    assert_eq!(
        past.data(),
        &[-1., -1., 0., 1., 2., -1., -1., 10., 11., 12.]
    );
    let fut = w.get("future_target").unwrap();
    assert_eq!(fut.shape(), &[2, 2]);
    assert_eq!(fut.data(), &[4., 5., 14., 15.]);
    assert_eq!(w.get("past_is_pad").unwrap().data(), &[1., 1., 0., 0., 0.]);
    assert_eq!(w.forecast_start, Some(e.start.unwrap() + 4));
    assert!(!w.contains("target"));

    // Default layout: (time, dim).
    let mut s = InstanceSplitter::new("target", "is_pad", Box::new(At(vec![7])), 2, 3, &[]);
    let w = run(&mut s, e).unwrap().remove(0);
    assert_eq!(w.get("past_target").unwrap().shape(), &[2, 2]);
    assert_eq!(w.get("past_target").unwrap().data(), &[5., 15., 6., 16.]);
    // Only one point left after 7: numpy slicing gives a short future.
    assert_eq!(w.get("future_target").unwrap().shape(), &[1, 2]);
}

#[test]
fn age_feature_linear_and_inference_length() {
    let e = entry(FieldArray::from_vec(vec![0.0; 3]));
    let mut age = AddAgeFeature::new("target", "age", 2, false);
    let mut out = Vec::new();
    age.apply(e.clone(), false, &mut out).unwrap();
    assert_eq!(out[0].get("age").unwrap().data(), &[0., 1., 2., 3., 4.]);
    let mut age = AddAgeFeature::new("target", "age", 2, true);
    let w = run(&mut age, e).unwrap().remove(0);
    let a = w.get("age").unwrap();
    assert_eq!(a.shape(), &[1, 3]);
    assert!((a.data()[2] - 4f32.log10()).abs() < 1e-7);
}

#[test]
fn remove_fields_and_batch_mismatch() {
    let mut e = entry(FieldArray::from_vec(vec![1.0, 2.0]));
    e.insert("x", FieldArray::from_vec(vec![0.0]));
    let mut rm = RemoveFields {
        fields: vec!["x".into(), "absent".into()],
    };
    let e = run(&mut rm, e).unwrap().remove(0);
    assert!(!e.contains("x") && e.contains("target"));

    let other = entry(FieldArray::from_vec(vec![1.0, 2.0, 3.0]));
    assert_eq!(
        stack(&[e.clone(), other]).unwrap_err(),
        BatchError::Mismatch {
            field: "target".into(),
            index: 1
        }
    );
    assert_eq!(stack(&[]).unwrap_err(), BatchError::Empty);
    let b = stack(&[e.clone(), e]).unwrap();
    assert_eq!(b.starts.len(), 2);
    assert_eq!(b.get("target").unwrap().shape(), &[2, 2]);
}

mod splits {
    //! The convenience API's three loaders: `ChainConfig::split` with GluonTS's
    //! defaults for `min_past`/`min_future`, as DeepAR's estimator builds them.
    use std::sync::Arc;

    use shmpipe_timeseries::sampler::{ExpectedNumInstanceSampler, PredictionSplitSampler};
    use shmpipe_timeseries::transform::Chain;
    use shmpipe_timeseries::workload::{
        ChainConfig, Split, WorkloadConfig, WorkloadSource, run_in_process, training_chain,
    };
    use shmpipe_timeseries::{DataEntry, Period, synth};

    fn entries() -> Vec<DataEntry> {
        let g = synth::GenConfig {
            num_series: 40,
            min_len: 1,
            max_len: 120,
            missing_prob: 0.1,
            ..Default::default()
        };
        shmpipe_timeseries::jsonl::parse_lines(&synth::to_bytes(&g), g.freq).unwrap()
    }

    fn windows(chain: &mut Chain, is_train: bool) -> Vec<DataEntry> {
        let mut out = Vec::new();
        for e in entries() {
            chain.apply(e, is_train, &mut out).unwrap();
        }
        out
    }

    fn cfg(split: Split, fused: bool) -> ChainConfig {
        ChainConfig {
            context_length: 10,
            prediction_length: 6,
            split,
            fused,
            ..ChainConfig::default()
        }
    }

    #[test]
    fn defaults_are_gluonts_deepar_samplers() {
        let c = cfg(Split::Train, true);
        assert_eq!((c.min_past, c.min_future()), (0, 6));
        assert_eq!(cfg(Split::Validation, true).min_future(), 6);
        assert_eq!(cfg(Split::Test, true).min_future(), 0);
        assert!(c.is_train() && cfg(Split::Validation, true).is_train());
        assert!(!cfg(Split::Test, true).is_train());
    }

    #[test]
    fn validation_and_test_splits_equal_the_step_by_step_chain() {
        use shmpipe_timeseries::features::time_features_for;
        use shmpipe_timeseries::fused::FusedDeepAr;
        for (split, sampler_is_train) in [(Split::Validation, true), (Split::Test, false)] {
            for fused in [true, false] {
                let c = cfg(split, fused);
                let sampler = match split {
                    Split::Validation => PredictionSplitSampler::validation(0, 6),
                    _ => PredictionSplitSampler::test(0),
                };
                let mut reference = Chain::new().then(FusedDeepAr::new(
                    time_features_for(c.freq),
                    Box::new(sampler),
                    10,
                    6,
                ));
                let got = windows(&mut training_chain(&c, 1), c.is_train());
                let want = windows(&mut reference, sampler_is_train);
                assert_eq!(got, want, "{split:?} fused={fused}");
            }
        }
    }

    #[test]
    fn one_window_per_series_at_the_split_point() {
        let es = entries();
        let test = windows(&mut training_chain(&cfg(Split::Test, true), 1), false);
        assert_eq!(test.len(), es.len(), "TestSplitSampler: every series");
        for (w, e) in test.iter().zip(&es) {
            let len = e.get("target").unwrap().time_len() as i64;
            assert_eq!(w.forecast_start, Some(e.start.unwrap().shifted(len)));
            assert_eq!(w.get("future_time_feat").unwrap().shape()[0], 6);
        }
        let val = windows(&mut training_chain(&cfg(Split::Validation, true), 1), true);
        let long: Vec<&DataEntry> = es
            .iter()
            .filter(|e| e.get("target").unwrap().time_len() >= 6)
            .collect();
        assert_eq!(
            val.len(),
            long.len(),
            "ValidationSplitSampler skips short series"
        );
        for (w, e) in val.iter().zip(long) {
            let len = e.get("target").unwrap().time_len() as i64;
            let start: Period = e.start.unwrap();
            assert_eq!(w.forecast_start, Some(start.shifted(len - 6)));
            assert_eq!(w.get("future_target").unwrap().shape()[0], 6);
        }
        // min_past and min_future are honoured by the training sampler too.
        let mut c = cfg(Split::Train, true);
        c.min_past = 30;
        c.min_future = Some(10);
        c.num_instances = 1e6; // every admissible point
        let mut reference = Chain::new().then(shmpipe_timeseries::fused::FusedDeepAr::new(
            shmpipe_timeseries::features::time_features_for(c.freq),
            Box::new(ExpectedNumInstanceSampler::new(1e6, 30, 10, 1)),
            10,
            6,
        ));
        let got = windows(&mut training_chain(&c, 1), true);
        assert_eq!(got, windows(&mut reference, true));
        let admissible: usize = es
            .iter()
            .map(|e| (e.get("target").unwrap().time_len() + 1).saturating_sub(40))
            .sum();
        assert_eq!(got.len(), admissible);
    }

    #[test]
    fn the_workload_runs_each_split() {
        let es = Arc::new(entries());
        let run = |split| {
            let cfg = WorkloadConfig {
                source: WorkloadSource::Memory(es.clone()),
                chain: cfg(split, true),
                batch_size: 8,
                epochs: 1,
                workers: 1,
                emitters: 1,
                group_bytes: 1 << 10,
                seed: 0,
            };
            run_in_process(&cfg, |_| {}).unwrap().windows
        };
        assert_eq!(run(Split::Test), es.len() as u64);
        assert!(run(Split::Validation) < es.len() as u64);
    }

    /// The pipeline's workers get the chain as step arguments.
    #[test]
    fn step_args_round_trip() {
        let c = ChainConfig {
            split: Split::Validation,
            min_past: 3,
            min_future: Some(2),
            num_instances: 2.5,
            ..cfg(Split::Test, false)
        };
        let d = ChainConfig::from_args(&c.to_args()).unwrap();
        assert_eq!(format!("{c:?}"), format!("{d:?}"));
        let e = ChainConfig::from_args(&serde_json::json!({"split": "valid"})).unwrap_err();
        assert!(e.contains("\"validation\""), "{e}");
        let d = ChainConfig::from_args(&serde_json::json!({})).unwrap();
        assert_eq!(format!("{d:?}"), format!("{:?}", ChainConfig::default()));
    }
}
