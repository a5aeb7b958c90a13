//! The validation / test chain of the GluonTS loader as a step (`gluonts_eval`), composed from
//! `shmpipe-timeseries`' transformations (the training chain is that crate's own
//! `gluonts_train` step).
//!
//! Args: `{"freq", "context_length", "prediction_length", "batch_size", "mode":
//! "validation" | "test"}`. Inputs are raw JSON lines (the `gluonts_lines` source).

use shmpipe::{Item, Step, StepContext, StepError};
use shmpipe_timeseries::batch::Batcher;
use shmpipe_timeseries::entry::field;
use shmpipe_timeseries::features::time_features_for;
use shmpipe_timeseries::jsonl::parse_entry;
use shmpipe_timeseries::pipeline::{LINE_FIELD, LINE_NO_META, batch_to_item};
use shmpipe_timeseries::sampler::PredictionSplitSampler;
use shmpipe_timeseries::transform::{
    AddAgeFeature, AddObservedValuesIndicator, AddTimeFeatures, AsNumpyArray, InstanceSplitter,
    VstackFeatures,
};
use shmpipe_timeseries::{Chain, DataEntry, Freq};

/// Step name of the validation / test chain.
pub const STEP_EVAL: &str = "gluonts_eval";

/// Parse, DeepAR-style chain with a prediction-split sampler, batch.
pub struct EvalStep {
    freq: Freq,
    chain: Chain,
    is_train: bool,
    batcher: Batcher,
    windows: Vec<DataEntry>,
}

impl std::fmt::Debug for EvalStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvalStep")
            .field("is_train", &self.is_train)
            .finish_non_exhaustive()
    }
}

impl EvalStep {
    /// Builds the step from its arguments.
    pub fn from_context(cx: &StepContext<'_>) -> Result<EvalStep, StepError> {
        let a = cx.args;
        let freq: Freq = a["freq"]
            .as_str()
            .unwrap_or("h")
            .parse()
            .map_err(StepError::new)?;
        let ctx = a["context_length"].as_u64().unwrap_or(168) as usize;
        let pred = a["prediction_length"].as_u64().unwrap_or(24) as usize;
        let bs = a["batch_size"].as_u64().unwrap_or(32) as usize;
        // GluonTS: validation windows end `pred` before the end and are split as training
        // data (is_train = true); test windows end at the end, with `pred` future features.
        let (sampler, is_train) = match a["mode"].as_str() {
            Some("validation") => (PredictionSplitSampler::validation(0, pred), true),
            Some("test") => (PredictionSplitSampler::test(0), false),
            m => {
                return Err(StepError::new(format!(
                    "mode: validation or test, not {m:?}"
                )));
            }
        };
        let chain = Chain::new()
            .then(AsNumpyArray::new(field::TARGET, 1))
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
            .then(VstackFeatures::new(
                field::FEAT_TIME,
                &[field::FEAT_TIME, field::FEAT_AGE],
            ))
            .then(InstanceSplitter::new(
                field::TARGET,
                field::IS_PAD,
                Box::new(sampler),
                ctx,
                pred,
                &[field::FEAT_TIME, field::OBSERVED_VALUES],
            ));
        Ok(EvalStep {
            freq,
            chain,
            is_train,
            batcher: Batcher::new(bs),
            windows: Vec::new(),
        })
    }
}

impl Step for EvalStep {
    fn process(&mut self, mut item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        let lines = item
            .take_array::<u8>(LINE_FIELD)
            .ok_or_else(|| StepError::new("gluonts_eval reads raw lines (source gluonts_lines)"))?;
        let bytes = lines
            .as_slice()
            .ok_or_else(|| StepError::new("json_line is not contiguous"))?;
        let first = item.i64(LINE_NO_META).unwrap_or(1);
        for (no, line) in (first..).zip(bytes.split(|&b| b == b'\n')) {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let e = parse_entry(line, self.freq)
                .map_err(|e| StepError::new(format!("line {no}: {e}")))?;
            self.windows.clear();
            self.chain
                .apply(e, self.is_train, &mut self.windows)
                .map_err(StepError::new)?;
            for w in self.windows.drain(..) {
                if let Some(b) = self.batcher.push(w) {
                    out.push(batch_to_item(b.map_err(StepError::new)?));
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), StepError> {
        if let Some(b) = self.batcher.finish() {
            out.push(batch_to_item(b.map_err(StepError::new)?));
        }
        Ok(())
    }
}
