//! The DeepAR-style training chain fused into one step that computes only the
//! windows it emits.
//!
//! [`crate::workload::deepar_chain`] follows GluonTS step by step: it imputes the
//! whole target, builds time and age features over the whole series, stacks them
//! and then slices a window of `context + prediction` points out of it. With one
//! window per series on average most of that work is thrown away. [`FusedDeepAr`]
//! asks the sampler for the split points first (the sampler only needs the
//! length), then computes the imputed target, the observed mask, the time
//! features and the age feature for the window ranges only. Its outputs are
//! identical to the step-by-step chain's, field order included (see the
//! `fused_equals_chain` test); the sampler consumes its random stream the same way.

use std::sync::Arc;

use crate::entry::{DataEntry, FieldArray, field};
use crate::error::TransformError;
use crate::features::{TimeFeature, fill_time_features_strided};
use crate::sampler::InstanceSampler;
use crate::transform::Transform;

/// `AsNumpyArray(target, 1)`, `AddObservedValuesIndicator`, `AddTimeFeatures`,
/// `AddAgeFeature(log_scale)`, `VstackFeatures(time_feat, [time_feat, age])` and
/// `InstanceSplitter(time_series_fields = [time_feat, observed_values])`, fused.
#[derive(Debug)]
pub struct FusedDeepAr {
    time_features: Vec<TimeFeature>,
    sampler: Box<dyn InstanceSampler>,
    past_length: usize,
    future_length: usize,
    pred_length: usize,
    /// `log10(2 + t)` for `t` in `0..age.len()`, grown on demand.
    age: Vec<f32>,
    points: Vec<usize>,
    names: [Arc<str>; 7],
}

impl FusedDeepAr {
    /// The fused chain; `pred_length` is both the future length and the extra
    /// feature length in inference mode, as in the DeepAR chain.
    pub fn new(
        time_features: Vec<TimeFeature>,
        sampler: Box<dyn InstanceSampler>,
        past_length: usize,
        pred_length: usize,
    ) -> Self {
        let n = |s: &str| -> Arc<str> { Arc::from(s) };
        FusedDeepAr {
            time_features,
            sampler,
            past_length,
            future_length: pred_length,
            pred_length,
            age: Vec::new(),
            points: Vec::new(),
            names: [
                n("past_time_feat"),
                n("future_time_feat"),
                n("past_observed_values"),
                n("future_observed_values"),
                n("past_target"),
                n("future_target"),
                n("past_is_pad"),
            ],
        }
    }

    fn grow_age(&mut self, len: usize) {
        for t in self.age.len()..len {
            self.age.push(f64::from(2.0f32 + t as f32).log10() as f32);
        }
    }

    /// `(pad, lo, hi)` of the past window at `idx` in a field of length `len`
    /// (numpy slice clipping, as in `InstanceSplitter`).
    fn past_range(&self, idx: usize, len: usize) -> (usize, usize, usize) {
        let pl = self.past_length;
        let pad = pl.saturating_sub(idx);
        let lo = idx.saturating_sub(pl).min(len);
        (pad, lo, idx.min(len))
    }

    fn future_range(&self, idx: usize, len: usize) -> (usize, usize) {
        (idx.min(len), (idx + self.future_length).min(len))
    }

    /// `(n, F + 1)` stacked time and age features of periods `lo..hi`, after `pad` zero rows.
    fn features(&self, start: crate::Period, pad: usize, lo: usize, hi: usize) -> FieldArray {
        let nf = self.time_features.len();
        let cols = nf + 1;
        let n = hi - lo;
        let mut out = vec![0.0f32; (pad + n) * cols];
        let body = &mut out[pad * cols..];
        fill_time_features_strided(
            start.shifted(lo as i64),
            n,
            &self.time_features,
            body,
            1,
            cols,
        );
        for (t, &age) in self.age[lo..hi].iter().enumerate() {
            body[t * cols + nf] = age;
        }
        FieldArray::new(&[pad + n, cols], out)
    }
}

/// `target[lo..hi]` with NaN -> 0 and its observed mask, after `pad` zeros each.
fn imputed(target: &[f32], pad: usize, lo: usize, hi: usize) -> (FieldArray, FieldArray) {
    let n = pad + hi - lo;
    let mut values = vec![0.0f32; n];
    let mut mask = vec![0.0f32; n];
    // Branch-free, so the loop vectorizes.
    for ((v, m), &x) in values[pad..]
        .iter_mut()
        .zip(&mut mask[pad..])
        .zip(&target[lo..hi])
    {
        let observed = !x.is_nan();
        *v = if observed { x } else { 0.0 };
        *m = if observed { 1.0 } else { 0.0 };
    }
    (FieldArray::from_vec(values), FieldArray::from_vec(mask))
}

/// Fields the step-by-step chain writes and then consumes: dropped from the input.
const DROPPED: [&str; 3] = [field::OBSERVED_VALUES, field::FEAT_TIME, field::FEAT_AGE];

impl FusedDeepAr {
    /// The windows of `target`; every window carries a copy of `rest` (the
    /// entry without its target and without [`DROPPED`]).
    fn windows(
        &mut self,
        target: &FieldArray,
        mut entry: DataEntry,
        is_train: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        if target.ndim() != 1 {
            return Err(TransformError::BadNdim {
                step: "AsNumpyArray",
                field: field::TARGET.into(),
                expected: 1,
                got: target.ndim(),
            });
        }
        let start = entry.start.ok_or(TransformError::MissingStart {
            step: "AddTimeFeatures",
        })?;
        let len = target.time_len();
        let feat_len = len + if is_train { 0 } else { self.pred_length };
        self.grow_age(feat_len);
        let mut points = std::mem::take(&mut self.points);
        points.clear();
        if !self.sampler.sample(len, &mut points) {
            return Err(TransformError::EmptyInterval {
                step: "InstanceSplitter",
                len,
            });
        }
        let n = points.len();
        for (k, &idx) in points.iter().enumerate() {
            let mut w = if k + 1 == n {
                std::mem::take(&mut entry)
            } else {
                entry.clone()
            };
            let (pad, lo, hi) = self.past_range(idx, feat_len);
            let past_feat = self.features(start, pad, lo, hi);
            let (f_lo, f_hi) = self.future_range(idx, feat_len);
            let future_feat = self.features(start, 0, f_lo, f_hi);
            let (pad, lo, hi) = self.past_range(idx, len);
            let (past_t, past_o) = imputed(target.data(), pad, lo, hi);
            let (f_lo, f_hi) = self.future_range(idx, len);
            let (fut_t, fut_o) = imputed(target.data(), 0, f_lo, f_hi);
            let mut is_pad = vec![0.0; self.past_length];
            is_pad[..self.past_length.saturating_sub(idx)].fill(1.0);
            let [n0, n1, n2, n3, n4, n5, n6] = &self.names;
            w.insert(n0.clone(), past_feat);
            w.insert(n1.clone(), future_feat);
            w.insert(n2.clone(), past_o);
            w.insert(n3.clone(), fut_o);
            w.insert(n4.clone(), past_t);
            w.insert(n5.clone(), fut_t);
            w.insert(n6.clone(), FieldArray::from_vec(is_pad));
            w.forecast_start = Some(start.shifted(idx as i64));
            out.push(w);
        }
        self.points = points;
        Ok(())
    }
}

impl Transform for FusedDeepAr {
    fn name(&self) -> &'static str {
        "FusedDeepAr"
    }

    fn apply(
        &mut self,
        mut entry: DataEntry,
        is_train: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        let target = entry
            .remove(field::TARGET)
            .ok_or_else(|| TransformError::MissingField {
                step: "AsNumpyArray",
                field: field::TARGET.into(),
            })?;
        // Fields the step-by-step chain writes and then consumes.
        for f in DROPPED {
            entry.remove(f);
        }
        self.windows(&target, entry, is_train, out)
    }

    /// Reads the target in place and copies only the other (small) fields: no
    /// work proportional to the series length except the sampler's, which is
    /// proportional to the windows drawn.
    fn apply_ref(
        &mut self,
        entry: &DataEntry,
        is_train: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        let target = entry
            .get(field::TARGET)
            .ok_or_else(|| TransformError::MissingField {
                step: "AsNumpyArray",
                field: field::TARGET.into(),
            })?;
        let mut rest = DataEntry::default();
        rest.item_id = entry.item_id.clone();
        rest.start = entry.start;
        rest.forecast_start = entry.forecast_start;
        for (name, a) in entry.fields() {
            if name != field::TARGET && !DROPPED.contains(&name) {
                rest.insert(name, a.clone());
            }
        }
        self.windows(target, rest, is_train, out)
    }

    fn reseed(&mut self, seed: u64) {
        self.sampler.reseed(seed);
    }
}
