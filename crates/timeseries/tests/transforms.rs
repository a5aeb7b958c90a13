//! Transformation behaviour the golden fixtures do not cover: errors, lead time,
//! the `(dim, time)` layout, custom padding, batching errors.

use shmpipe_timeseries::batch::stack;
use shmpipe_timeseries::sampler::{InstanceSampler, PredictionSplitSampler};
use shmpipe_timeseries::transform::{
    AddAgeFeature, AsNumpyArray, Chain, InstanceSplitter, RemoveFields, Transform, VstackFeatures,
};
use shmpipe_timeseries::{Array, BatchError, DataEntry, Period, TransformError};

fn entry(target: Array) -> DataEntry {
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
    let e = entry(Array::new(&[2, 3], vec![0.0; 6]));
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

    let mut v = entry(Array::from_vec(vec![1.0; 4]));
    v.insert("other", Array::from_vec(vec![1.0; 5]));
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

    let mut no_start = entry(Array::from_vec(vec![1.0; 3]));
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
    let err = run(&mut test_split, entry(Array::from_vec(vec![1.0; 3]))).unwrap_err();
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
    let e = entry(Array::new(&[2, 8], data));
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
    let e = entry(Array::from_vec(vec![0.0; 3]));
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
    let mut e = entry(Array::from_vec(vec![1.0, 2.0]));
    e.insert("x", Array::from_vec(vec![0.0]));
    let mut rm = RemoveFields {
        fields: vec!["x".into(), "absent".into()],
    };
    let e = run(&mut rm, e).unwrap().remove(0);
    assert!(!e.contains("x") && e.contains("target"));

    let other = entry(Array::from_vec(vec![1.0, 2.0, 3.0]));
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
