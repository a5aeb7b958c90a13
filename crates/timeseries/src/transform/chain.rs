//! [`Chain`]: transformations applied one after another.

use super::Transform;
use crate::entry::DataEntry;
use crate::error::TransformError;

/// Steps applied one after another (`Chain`, or `+` in GluonTS).
///
/// # Examples
/// ```
/// use shmpipe_timeseries::{Chain, DataEntry, FieldArray, Period};
/// use shmpipe_timeseries::transform::{AddObservedValuesIndicator, AsNumpyArray};
/// let mut chain = Chain::new()
///     .then(AsNumpyArray::new("target", 1))
///     .then(AddObservedValuesIndicator::new("target", "observed_values"));
/// let mut e = DataEntry::default();
/// e.insert("target", FieldArray::from_vec(vec![1.0, f32::NAN]));
/// let mut out = vec![];
/// chain.apply(e, true, &mut out).unwrap();
/// assert_eq!(out[0].get("target").unwrap().data(), &[1.0, 0.0]);
/// assert_eq!(out[0].get("observed_values").unwrap().data(), &[1.0, 0.0]);
/// ```
#[derive(Debug, Default)]
pub struct Chain {
    steps: Vec<Box<dyn Transform>>,
    scratch: Vec<Vec<DataEntry>>,
}

impl Chain {
    /// An empty chain (the identity).
    pub fn new() -> Self {
        Chain::default()
    }

    /// Appends a step.
    pub fn then(mut self, step: impl Transform + 'static) -> Self {
        self.steps.push(Box::new(step));
        self.scratch.push(Vec::new());
        self
    }

    /// Appends a boxed step.
    pub fn then_boxed(mut self, step: Box<dyn Transform>) -> Self {
        self.steps.push(step);
        self.scratch.push(Vec::new());
        self
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether the chain has no steps.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Reseeds every step (e.g. with a per-worker seed).
    pub fn reseed(&mut self, seed: u64) {
        for (i, s) in self.steps.iter_mut().enumerate() {
            s.reseed(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
    }

    /// Runs `entry` through all steps, pushing the outputs to `out`.
    ///
    /// # Errors
    /// The first step error.
    pub fn apply(
        &mut self,
        entry: DataEntry,
        is_train: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        if self.steps.is_empty() {
            out.push(entry);
            return Ok(());
        }
        let mut first = std::mem::take(&mut self.scratch[0]);
        first.clear();
        first.push(entry);
        self.run_from(0, first, is_train, out)
    }

    /// [`Chain::apply`] on a borrowed entry: the first step gets it by reference
    /// ([`Transform::apply_ref`]), so a fused chain copies only the windows.
    ///
    /// # Errors
    /// The first step error.
    pub fn apply_ref(
        &mut self,
        entry: &DataEntry,
        is_train: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        match self.steps.len() {
            0 => {
                out.push(entry.clone());
                Ok(())
            }
            1 => self.steps[0].apply_ref(entry, is_train, out),
            _ => {
                let mut next = std::mem::take(&mut self.scratch[1]);
                next.clear();
                self.steps[0].apply_ref(entry, is_train, &mut next)?;
                self.run_from(1, next, is_train, out)
            }
        }
    }

    /// Runs `cur` (the input of step `from`, taken from `scratch[from]`) through
    /// steps `from..`, pushing the outputs to `out`.
    fn run_from(
        &mut self,
        from: usize,
        mut cur: Vec<DataEntry>,
        is_train: bool,
        out: &mut Vec<DataEntry>,
    ) -> Result<(), TransformError> {
        // scratch[i] is step i's input buffer, reused across calls.
        let last = self.steps.len() - 1;
        for i in from..last {
            let mut next = std::mem::take(&mut self.scratch[i + 1]);
            next.clear();
            for e in cur.drain(..) {
                self.steps[i].apply(e, is_train, &mut next)?;
            }
            self.scratch[i] = cur;
            cur = next;
        }
        for e in cur.drain(..) {
            self.steps[last].apply(e, is_train, out)?;
        }
        self.scratch[last] = cur;
        Ok(())
    }
}
