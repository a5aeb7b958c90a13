//! Transformations with GluonTS 0.17's semantics (`gluonts.transform`).
//!
//! Every step is a flat-map: one entry in, zero or more out. `is_train` plays
//! the role of GluonTS's flag: in inference mode (`false`) the features that must
//! cover the forecast horizon are `pred_length` longer than the target.

use std::fmt;
use std::sync::Arc;

use crate::entry::{DataEntry, FieldArray};
use crate::error::TransformError;
use crate::features::{TimeFeature, fill_time_features};
use crate::sampler::InstanceSampler;

mod chain;

pub use chain::Chain;

/// A flat-map over entries.
pub trait Transform: Send + fmt::Debug {
    /// The step's name (GluonTS's class name), used in errors.
    fn name(&self) -> &'static str;

    /// Transforms `entry`, pushing 0..n outputs to `out`.
    ///
    /// # Errors
    /// A [`TransformError`] naming the step and field.
    fn apply(
        &mut self,
        entry: DataEntry,
        is_train: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError>;

    /// Transforms a borrowed `entry`, as [`Transform::apply`] on a copy of it
    /// (the default). Steps that read only windows of the series (the fused
    /// chain) override it so that a dataset held in memory is not copied series
    /// by series on every pass.
    ///
    /// # Errors
    /// As [`Transform::apply`].
    fn apply_ref(
        &mut self,
        entry: &DataEntry,
        is_train: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        self.apply(entry.clone(), is_train, out)
    }

    /// Sets the seed of any random stream in the step (no-op by default).
    fn reseed(&mut self, _seed: u64) {}
}

fn get<'e>(
    e: &'e DataEntry,
    step: &'static str,
    name: &str,
) -> Result<&'e FieldArray, TransformError> {
    e.get(name).ok_or_else(|| TransformError::MissingField {
        step,
        field: name.to_owned(),
    })
}

/// Length of generated features: `T`, plus `pred_length` in inference mode.
fn feature_len(target: &FieldArray, pred_length: usize, is_train: bool) -> usize {
    target.time_len() + if is_train { 0 } else { pred_length }
}

/// Checks the number of dimensions of a field (`AsNumpyArray`; values are always `f32`).
///
/// # Examples
/// ```
/// use shmpipe_timeseries::{FieldArray, DataEntry, Transform, transform::AsNumpyArray};
/// let mut e = DataEntry::default();
/// e.insert("target", FieldArray::from_vec(vec![1.0]));
/// assert!(AsNumpyArray::new("target", 2).apply(e, true, &mut vec![]).is_err());
/// ```
#[derive(Clone, Debug)]
pub struct AsNumpyArray {
    /// The field.
    pub field: String,
    /// Required number of dimensions.
    pub expected_ndim: usize,
}

impl AsNumpyArray {
    /// Checks that `field` has `expected_ndim` dimensions.
    pub fn new(field: &str, expected_ndim: usize) -> Self {
        AsNumpyArray {
            field: field.to_owned(),
            expected_ndim,
        }
    }
}

impl Transform for AsNumpyArray {
    fn name(&self) -> &'static str {
        "AsNumpyArray"
    }

    fn apply(
        &mut self,
        entry: DataEntry,
        _: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        let got = get(&entry, self.name(), &self.field)?.ndim();
        if got != self.expected_ndim {
            return Err(TransformError::BadNdim {
                step: self.name(),
                field: self.field.clone(),
                expected: self.expected_ndim,
                got,
            });
        }
        out.push(entry);
        Ok(())
    }
}

/// Replaces NaNs in the target with 0 and adds a `1.0`/`0.0` observed mask of the
/// same shape (`AddObservedValuesIndicator` with `DummyValueImputation(0.0)`).
#[derive(Clone, Debug)]
pub struct AddObservedValuesIndicator {
    /// Field whose NaNs are replaced.
    pub target_field: String,
    /// Output field for the mask.
    pub output_field: Arc<str>,
}

impl AddObservedValuesIndicator {
    /// Mask of `target_field` written to `output_field`.
    pub fn new(target_field: &str, output_field: &str) -> Self {
        AddObservedValuesIndicator {
            target_field: target_field.to_owned(),
            output_field: output_field.into(),
        }
    }
}

impl Transform for AddObservedValuesIndicator {
    fn name(&self) -> &'static str {
        "AddObservedValuesIndicator"
    }

    fn apply(
        &mut self,
        mut entry: DataEntry,
        _: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        let step = self.name();
        let target =
            entry
                .get_mut(&self.target_field)
                .ok_or_else(|| TransformError::MissingField {
                    step,
                    field: self.target_field.clone(),
                })?;
        let shape = target.shape().to_vec();
        let mut mask = Vec::with_capacity(target.data().len());
        for v in target.data_mut() {
            let observed = !v.is_nan();
            mask.push(if observed { 1.0 } else { 0.0 });
            if !observed {
                *v = 0.0;
            }
        }
        entry.insert(self.output_field.clone(), FieldArray::new(&shape, mask));
        out.push(entry);
        Ok(())
    }
}

/// Adds `(num_features, T)` time features derived from `start` (`AddTimeFeatures`).
///
/// With no features (yearly data) GluonTS stores `None`; this stores a
/// `(0, T)` array, which stacks to the same result in [`VstackFeatures`].
///
/// # Examples
/// ```
/// use shmpipe_timeseries::{FieldArray, DataEntry, Period, Transform};
/// use shmpipe_timeseries::{features::time_features_for, transform::AddTimeFeatures};
/// let freq = "h".parse().unwrap();
/// let mut e = DataEntry::default();
/// e.insert("target", FieldArray::from_vec(vec![0.0; 3]));
/// e.start = Some(Period::parse("2021-01-01 22:00", freq).unwrap());
/// let mut step = AddTimeFeatures::new("target", "time_feat", time_features_for(freq), 2);
/// let mut out = vec![];
/// step.apply(e, false, &mut out).unwrap(); // inference: 3 + 2 periods
/// let f = out[0].get("time_feat").unwrap();
/// assert_eq!(f.shape(), &[4, 5]);
/// assert_eq!(&f.data()[..3], &[22.0 / 23.0 - 0.5, 0.5, -0.5]); // hour_of_day: 22, 23, 0
/// ```
#[derive(Clone, Debug)]
pub struct AddTimeFeatures {
    /// Field whose length is used.
    pub target_field: String,
    /// Output field.
    pub output_field: Arc<str>,
    /// Features, in order.
    pub time_features: Vec<TimeFeature>,
    /// Extra length in inference mode.
    pub pred_length: usize,
}

impl AddTimeFeatures {
    /// Features `time_features` over the target's time axis.
    pub fn new(
        target_field: &str,
        output_field: &str,
        time_features: Vec<TimeFeature>,
        pred_length: usize,
    ) -> Self {
        AddTimeFeatures {
            target_field: target_field.to_owned(),
            output_field: output_field.into(),
            time_features,
            pred_length,
        }
    }
}

impl Transform for AddTimeFeatures {
    fn name(&self) -> &'static str {
        "AddTimeFeatures"
    }

    fn apply(
        &mut self,
        mut entry: DataEntry,
        is_train: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        let step = self.name();
        let len = feature_len(
            get(&entry, step, &self.target_field)?,
            self.pred_length,
            is_train,
        );
        let start = entry.start.ok_or(TransformError::MissingStart { step })?;
        let nf = self.time_features.len();
        let mut data = vec![0.0; nf * len];
        fill_time_features(start, len, &self.time_features, &mut data);
        entry.insert(self.output_field.clone(), FieldArray::new(&[nf, len], data));
        out.push(entry);
        Ok(())
    }
}

/// Adds a `(1, T)` age feature: `log10(2 + t)`, or `t` without log scale (`AddAgeFeature`).
///
/// `log10` is computed in `f64` and rounded once (the correctly rounded `f32`);
/// GluonTS uses numpy's `float32` `log10`, so values may differ by up to 2 ULP.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::{FieldArray, DataEntry, Transform, transform::AddAgeFeature};
/// let mut e = DataEntry::default();
/// e.insert("target", FieldArray::from_vec(vec![0.0; 2]));
/// let mut out = vec![];
/// AddAgeFeature::new("target", "age", 0, true).apply(e, true, &mut out).unwrap();
/// let age = out[0].get("age").unwrap().data();
/// assert!((age[0] - 2f32.log10()).abs() < 1e-7 && (age[1] - 3f32.log10()).abs() < 1e-7);
/// ```
#[derive(Clone, Debug)]
pub struct AddAgeFeature {
    /// Field whose length is used.
    pub target_field: String,
    /// Output field.
    pub output_field: Arc<str>,
    /// Extra length in inference mode.
    pub pred_length: usize,
    /// `log10(2 + t)` when true, `t` otherwise.
    pub log_scale: bool,
    /// Values computed so far (they depend only on `t`).
    cache: Vec<f32>,
}

impl AddAgeFeature {
    /// Age over the target's time axis.
    pub fn new(
        target_field: &str,
        output_field: &str,
        pred_length: usize,
        log_scale: bool,
    ) -> Self {
        AddAgeFeature {
            target_field: target_field.to_owned(),
            output_field: output_field.into(),
            pred_length,
            log_scale,
            cache: Vec::new(),
        }
    }
}

impl Transform for AddAgeFeature {
    fn name(&self) -> &'static str {
        "AddAgeFeature"
    }

    fn apply(
        &mut self,
        mut entry: DataEntry,
        is_train: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        let len = feature_len(
            get(&entry, self.name(), &self.target_field)?,
            self.pred_length,
            is_train,
        );
        for t in self.cache.len()..len {
            // GluonTS: log10(2.0 + arange(len, dtype=float32)) in numpy's float32 log10,
            // not always correctly rounded; this is (within 2 ULP of it, see docs).
            let x = 2.0f32 + t as f32;
            self.cache.push(if self.log_scale {
                f64::from(x).log10() as f32
            } else {
                t as f32
            });
        }
        let data = self.cache[..len].to_vec();
        entry.insert(self.output_field.clone(), FieldArray::new(&[1, len], data));
        out.push(entry);
        Ok(())
    }
}

/// Stacks fields into one `(rows, T)` array (`VstackFeatures`, `np.vstack`):
/// 1-D inputs become one row, 2-D inputs contribute their rows.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::{FieldArray, DataEntry, Transform, transform::VstackFeatures};
/// let mut e = DataEntry::default();
/// e.insert("a", FieldArray::new(&[2, 2], vec![1., 2., 3., 4.]));
/// e.insert("b", FieldArray::from_vec(vec![5., 6.]));
/// let mut out = vec![];
/// VstackFeatures::new("a", &["a", "b"]).apply(e, true, &mut out).unwrap();
/// let a = out[0].get("a").unwrap();
/// assert_eq!((a.shape(), a.data()), (&[3, 2][..], &[1., 2., 3., 4., 5., 6.][..]));
/// assert!(!out[0].contains("b"));
/// ```
#[derive(Clone, Debug)]
pub struct VstackFeatures {
    /// Output field.
    pub output_field: Arc<str>,
    /// Input fields, in order.
    pub input_fields: Vec<String>,
    /// Whether inputs other than the output are removed.
    pub drop_inputs: bool,
}

impl VstackFeatures {
    /// Stack `input_fields` into `output_field`, dropping the inputs.
    pub fn new(output_field: &str, input_fields: &[&str]) -> Self {
        VstackFeatures {
            output_field: output_field.into(),
            input_fields: input_fields.iter().map(|s| (*s).to_owned()).collect(),
            drop_inputs: true,
        }
    }
}

impl Transform for VstackFeatures {
    fn name(&self) -> &'static str {
        "VstackFeatures"
    }

    fn apply(
        &mut self,
        mut entry: DataEntry,
        _: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        let step = self.name();
        let mut len = None;
        let mut rows = 0;
        for name in &self.input_fields {
            let a = get(&entry, step, name)?;
            if a.ndim() > 2 || a.ndim() == 0 {
                return Err(TransformError::BadNdim {
                    step,
                    field: name.clone(),
                    expected: 2,
                    got: a.ndim(),
                });
            }
            match len {
                None => len = Some(a.time_len()),
                Some(l) if l != a.time_len() => {
                    return Err(TransformError::LengthMismatch {
                        step,
                        field: name.clone(),
                        expected: l,
                        got: a.time_len(),
                    });
                }
                Some(_) => {}
            }
            rows += a.rows();
        }
        let len = len.unwrap_or(0);
        let mut data = Vec::with_capacity(rows * len);
        for name in &self.input_fields {
            data.extend_from_slice(get(&entry, step, name)?.data());
        }
        if self.drop_inputs {
            for name in &self.input_fields {
                if **name != *self.output_field {
                    entry.remove(name);
                }
            }
        }
        entry.insert(
            self.output_field.clone(),
            FieldArray::new(&[rows, len], data),
        );
        out.push(entry);
        Ok(())
    }
}

/// Removes fields (`RemoveFields`); absent fields are ignored.
#[derive(Clone, Debug)]
pub struct RemoveFields {
    /// Fields to remove.
    pub fields: Vec<String>,
}

impl Transform for RemoveFields {
    fn name(&self) -> &'static str {
        "RemoveFields"
    }

    fn apply(
        &mut self,
        mut entry: DataEntry,
        _: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        for f in &self.fields {
            entry.remove(f);
        }
        out.push(entry);
        Ok(())
    }
}

/// Slices windows at the points chosen by a sampler (`InstanceSplitter`).
///
/// For each split point `i`, the target and every field in `time_series_fields`
/// are replaced by `past_<f> = f[..., i - past_length .. i]` (left-padded with
/// `dummy_value` when `i < past_length`) and `future_<f> = f[..., i + lead_time ..
/// i + lead_time + future_length]` (numpy slicing: shorter near the end), both
/// transposed to `(time, dim)` when `output_ntc`. `past_<is_pad_field>` (length
/// `past_length`, `1.0` on padded points) and `forecast_start = start + i +
/// lead_time` are added; other fields are copied into every window.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::{FieldArray, DataEntry, Period, Transform};
/// use shmpipe_timeseries::{sampler::PredictionSplitSampler, transform::InstanceSplitter};
/// let mut e = DataEntry::default();
/// e.insert("target", FieldArray::from_vec(vec![1., 2., 3., 4., 5.]));
/// e.start = Some(Period::parse("2021-01-01", "D".parse().unwrap()).unwrap());
/// let sampler = Box::new(PredictionSplitSampler::validation(0, 2)); // split at 5 - 2 = 3
/// let mut s = InstanceSplitter::new("target", "is_pad", sampler, 4, 2, &[]);
/// let mut out = vec![];
/// s.apply(e, true, &mut out).unwrap();
/// let w = &out[0];
/// assert_eq!(w.get("past_target").unwrap().data(), &[0., 1., 2., 3.]);
/// assert_eq!(w.get("past_is_pad").unwrap().data(), &[1., 0., 0., 0.]);
/// assert_eq!(w.get("future_target").unwrap().data(), &[4., 5.]);
/// assert_eq!(w.forecast_start.unwrap().to_string(), "2021-01-04 00:00:00");
/// ```
#[derive(Debug)]
pub struct InstanceSplitter {
    /// Target field.
    pub target_field: String,
    /// Other fields split like the target.
    pub time_series_fields: Vec<String>,
    /// Padding indicator name (output `past_<is_pad_field>`).
    pub is_pad_field: String,
    /// The sampler.
    pub sampler: Box<dyn InstanceSampler>,
    /// Points before the split.
    pub past_length: usize,
    /// Points after the split.
    pub future_length: usize,
    /// Gap between past and future.
    pub lead_time: usize,
    /// Whether windows are transposed to `(time, dim)`.
    pub output_ntc: bool,
    /// Padding value.
    pub dummy_value: f32,
    /// `(field, past_<field>, future_<field>)`, target last.
    names: Vec<(String, Arc<str>, Arc<str>)>,
    is_pad_name: Arc<str>,
    points: Vec<usize>,
}

impl InstanceSplitter {
    /// A splitter with `lead_time = 0`, `output_ntc = true`, `dummy_value = 0`.
    pub fn new(
        target_field: &str,
        is_pad_field: &str,
        sampler: Box<dyn InstanceSampler>,
        past_length: usize,
        future_length: usize,
        time_series_fields: &[&str],
    ) -> Self {
        let mut s = InstanceSplitter {
            target_field: target_field.to_owned(),
            time_series_fields: time_series_fields.iter().map(|s| (*s).to_owned()).collect(),
            is_pad_field: is_pad_field.to_owned(),
            sampler,
            past_length,
            future_length,
            lead_time: 0,
            output_ntc: true,
            dummy_value: 0.0,
            names: Vec::new(),
            is_pad_name: "".into(),
            points: Vec::new(),
        };
        s.refresh_names();
        s
    }

    /// Sets the lead time.
    pub fn with_lead_time(mut self, lead_time: usize) -> Self {
        self.lead_time = lead_time;
        self
    }

    /// Sets the padding value.
    pub fn with_dummy_value(mut self, v: f32) -> Self {
        self.dummy_value = v;
        self
    }

    /// Sets the output layout.
    pub fn with_output_ntc(mut self, ntc: bool) -> Self {
        self.output_ntc = ntc;
        self
    }

    fn refresh_names(&mut self) {
        let mut fields = self.time_series_fields.clone();
        fields.push(self.target_field.clone());
        self.names = fields
            .into_iter()
            .map(|f| {
                let past = Arc::from(format!("past_{f}"));
                let future = Arc::from(format!("future_{f}"));
                (f, past, future)
            })
            .collect();
        self.is_pad_name = Arc::from(format!("past_{}", self.is_pad_field));
    }

    /// Past and future windows of `a` at split point `idx`.
    fn split(
        &self,
        a: &FieldArray,
        idx: usize,
    ) -> Result<(FieldArray, FieldArray), TransformError> {
        let nd = a.ndim();
        if nd == 0 || nd > 2 {
            return Err(TransformError::BadNdim {
                step: "InstanceSplitter",
                field: self.target_field.clone(),
                expected: 2,
                got: nd,
            });
        }
        let (rows, len) = (a.rows(), a.time_len());
        let pl = self.past_length;
        // Past: `pad` dummies then `a[.., lo..hi]` (numpy clipping of the slice).
        let (pad, lo, hi) = if idx >= pl {
            (0, (idx - pl).min(len), idx.min(len))
        } else {
            (pl - idx, 0, idx.min(len))
        };
        let past_len = pad + (hi - lo);
        let f_lo = (idx + self.lead_time).min(len);
        let f_hi = (idx + self.lead_time + self.future_length).min(len);
        let fut_len = f_hi - f_lo;
        let src = a.data();
        let transpose = self.output_ntc && nd == 2;
        let mut past = vec![self.dummy_value; rows * past_len];
        let mut fut = vec![0.0; rows * fut_len];
        for r in 0..rows {
            let row = &src[r * len..(r + 1) * len];
            if transpose {
                for (t, &v) in row[lo..hi].iter().enumerate() {
                    past[(pad + t) * rows + r] = v;
                }
                for (t, &v) in row[f_lo..f_hi].iter().enumerate() {
                    fut[t * rows + r] = v;
                }
            } else {
                past[r * past_len + pad..(r + 1) * past_len].copy_from_slice(&row[lo..hi]);
                fut[r * fut_len..(r + 1) * fut_len].copy_from_slice(&row[f_lo..f_hi]);
            }
        }
        Ok(if nd == 1 {
            (
                FieldArray::new(&[past_len], past),
                FieldArray::new(&[fut_len], fut),
            )
        } else if transpose {
            (
                FieldArray::new(&[past_len, rows], past),
                FieldArray::new(&[fut_len, rows], fut),
            )
        } else {
            (
                FieldArray::new(&[rows, past_len], past),
                FieldArray::new(&[rows, fut_len], fut),
            )
        })
    }
}

impl Transform for InstanceSplitter {
    fn name(&self) -> &'static str {
        "InstanceSplitter"
    }

    fn apply(
        &mut self,
        mut entry: DataEntry,
        _: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        let step = self.name();
        let len = get(&entry, step, &self.target_field)?.time_len();
        let mut points = std::mem::take(&mut self.points);
        points.clear();
        if !self.sampler.sample(len, &mut points) {
            return Err(TransformError::EmptyInterval { step, len });
        }
        let start = entry.start;
        // Take the split fields out; the rest is copied into each window.
        let mut series = Vec::with_capacity(self.names.len());
        for (f, _, _) in &self.names {
            let a = entry
                .remove(f)
                .ok_or_else(|| TransformError::MissingField {
                    step,
                    field: f.clone(),
                })?;
            series.push(a);
        }
        let n = points.len();
        for (k, &idx) in points.iter().enumerate() {
            let mut w = if k + 1 == n {
                std::mem::take(&mut entry)
            } else {
                entry.clone()
            };
            for ((_, past_name, fut_name), a) in self.names.iter().zip(&series) {
                let (past, fut) = self.split(a, idx)?;
                w.insert(past_name.clone(), past);
                w.insert(fut_name.clone(), fut);
            }
            let mut pad = vec![0.0; self.past_length];
            let pad_len = self.past_length.saturating_sub(idx);
            pad[..pad_len].fill(1.0);
            w.insert(self.is_pad_name.clone(), FieldArray::from_vec(pad));
            w.forecast_start = start.map(|s| s.shifted((idx + self.lead_time) as i64));
            out.push(w);
        }
        self.points = points;
        Ok(())
    }

    fn reseed(&mut self, seed: u64) {
        self.sampler.reseed(seed);
    }
}
