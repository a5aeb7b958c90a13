//! The GluonTS golden cases' transformation chain and splitter, as the fixture script
//! (`tools/gluonts_fixtures.py`) builds them: shared by the JSON and the Arrow golden tests.
#![allow(dead_code)]

use serde_json::Value;
use shmpipe_timeseries::features::time_features_for;
use shmpipe_timeseries::sampler::{InstanceSampler, PredictionSplitSampler};
use shmpipe_timeseries::transform::{
    AddAgeFeature, AddObservedValuesIndicator, AddTimeFeatures, AsNumpyArray, Chain,
    InstanceSplitter, VstackFeatures,
};
use shmpipe_timeseries::{DataEntry, Freq, field, jsonl};

/// The entries of a golden case: its `"lines"`, parsed as a JSON-lines file.
pub fn json_entries(case: &Value, freq: Freq) -> Vec<DataEntry> {
    let lines: String = case["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| format!("{}\n", l.as_str().unwrap()))
        .collect();
    jsonl::parse_lines(lines.as_bytes(), freq).unwrap()
}

/// The strings of a JSON array of strings (panics on anything else: the fixtures are ours).
pub fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// Returns the given points that fit the series, like the fixture script's sampler.
#[derive(Debug)]
struct FixedSampler(Vec<usize>);

impl InstanceSampler for FixedSampler {
    fn sample(&mut self, len: usize, out: &mut Vec<usize>) -> bool {
        out.extend(self.0.iter().copied().filter(|&p| p <= len));
        true
    }
}

pub fn map_chain(case: &Value, freq: Freq) -> Chain {
    let pred = case["pred_length"].as_u64().unwrap() as usize;
    let ndim = case["target_ndim"].as_u64().unwrap() as usize;
    let inputs: Vec<&str> = strs(&case["vstack_inputs"]);
    Chain::new()
        .then(AsNumpyArray::new(field::TARGET, ndim))
        .then(AddObservedValuesIndicator::new(
            field::TARGET,
            field::OBSERVED_VALUES,
        ))
        .then(AddTimeFeatures::new(
            field::TARGET,
            field::FEAT_TIME,
            time_features_for(freq),
            pred,
        ))
        .then(AddAgeFeature::new(
            field::TARGET,
            field::FEAT_AGE,
            pred,
            true,
        ))
        .then(VstackFeatures::new(field::FEAT_TIME, &inputs))
}

pub fn splitter(case: &Value) -> InstanceSplitter {
    let s = &case["sampler"];
    let sampler: Box<dyn InstanceSampler> = match s["kind"].as_str().unwrap() {
        "validation" => Box::new(PredictionSplitSampler::validation(
            s["min_past"].as_u64().unwrap() as usize,
            s["min_future"].as_u64().unwrap() as usize,
        )),
        "test" => Box::new(PredictionSplitSampler::test(
            s["min_past"].as_u64().unwrap() as usize,
        )),
        "fixed" => Box::new(FixedSampler(
            s["points"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_u64().unwrap() as usize)
                .collect(),
        )),
        k => panic!("unknown sampler {k}"),
    };
    InstanceSplitter::new(
        field::TARGET,
        field::IS_PAD,
        sampler,
        case["past_length"].as_u64().unwrap() as usize,
        case["future_length"].as_u64().unwrap() as usize,
        &[field::FEAT_TIME, field::OBSERVED_VALUES],
    )
}

/// Whether two entries are the same: start, item id, forecast start, and every field with
/// the same name, shape and bits.
pub fn same(a: &DataEntry, b: &DataEntry) -> bool {
    a.start == b.start
        && a.item_id == b.item_id
        && a.forecast_start == b.forecast_start
        && a.fields().count() == b.fields().count()
        && a.fields().zip(b.fields()).all(|((n, x), (m, y))| {
            n == m
                && x.shape() == y.shape()
                && x.data()
                    .iter()
                    .zip(y.data())
                    .all(|(p, q)| p.to_bits() == q.to_bits())
        })
}

/// A DeepAR-style chain (context 12, prediction 4) whose sampler takes every admissible point
/// (`num_instances` far above the series lengths), so the number of windows is exact.
pub fn exhaustive_chain() -> shmpipe_timeseries::workload::ChainConfig {
    shmpipe_timeseries::workload::ChainConfig {
        context_length: 12,
        prediction_length: 4,
        num_instances: 1e6,
        ..shmpipe_timeseries::workload::ChainConfig::default()
    }
}
