//! Batching: stack the fields of `batch_size` entries into `(batch, ...)` arrays,
//! like GluonTS's `batchify` / `Stack` (metadata become per-row lists).

use std::sync::Arc;

use crate::entry::{DataEntry, FieldArray};
use crate::error::BatchError;
use crate::period::Period;

/// Stacked entries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// Number of rows.
    pub len: usize,
    /// `item_id` of each row.
    pub item_ids: Vec<Option<Arc<str>>>,
    /// `start` of each row.
    pub starts: Vec<Option<Period>>,
    /// `forecast_start` of each row.
    pub forecast_starts: Vec<Option<Period>>,
    /// Stacked arrays, shape `(len, ...)`, in the first entry's field order.
    fields: Vec<(Arc<str>, FieldArray)>,
}

impl Batch {
    /// The stacked array `name`.
    pub fn get(&self, name: &str) -> Option<&FieldArray> {
        self.fields
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, a)| a)
    }

    /// The stacked arrays.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &FieldArray)> {
        self.fields.iter().map(|(n, a)| (&**n, a))
    }

    /// Moves the stacked arrays out.
    pub fn into_fields(self) -> Vec<(Arc<str>, FieldArray)> {
        self.fields
    }

    /// Total size of the arrays in bytes.
    pub fn nbytes(&self) -> usize {
        self.fields.iter().map(|(_, a)| a.nbytes()).sum()
    }
}

/// Stacks all fields of `entries` (every entry must have the first entry's
/// fields with the same shapes; extra fields in later entries are ignored).
///
/// # Errors
/// [`BatchError::Empty`] or [`BatchError::Mismatch`].
///
/// # Examples
/// ```
/// use shmpipe_timeseries::{batch::stack, FieldArray, DataEntry};
/// let mk = |v: f32| { let mut e = DataEntry::default(); e.insert("x", FieldArray::from_vec(vec![v, v])); e };
/// let b = stack(&[mk(1.0), mk(2.0)]).unwrap();
/// assert_eq!(b.get("x").unwrap().shape(), &[2, 2]);
/// assert_eq!(b.get("x").unwrap().data(), &[1.0, 1.0, 2.0, 2.0]);
/// ```
pub fn stack(entries: &[DataEntry]) -> Result<Batch, BatchError> {
    let first = entries.first().ok_or(BatchError::Empty)?;
    let n = entries.len();
    let mut fields = Vec::with_capacity(first.num_fields());
    for (name, a0) in first.fields() {
        let mut shape = Vec::with_capacity(a0.ndim() + 1);
        shape.push(n);
        shape.extend_from_slice(a0.shape());
        let mut data = Vec::with_capacity(n * a0.data().len());
        for (index, e) in entries.iter().enumerate() {
            match e.get(name) {
                Some(a) if a.shape() == a0.shape() => data.extend_from_slice(a.data()),
                _ => {
                    return Err(BatchError::Mismatch {
                        field: name.to_owned(),
                        index,
                    });
                }
            }
        }
        fields.push((Arc::<str>::from(name), FieldArray::new(&shape, data)));
    }
    Ok(Batch {
        len: n,
        item_ids: entries.iter().map(|e| e.item_id.clone()).collect(),
        starts: entries.iter().map(|e| e.start).collect(),
        forecast_starts: entries.iter().map(|e| e.forecast_start).collect(),
        fields,
    })
}

/// Collects entries and emits a [`Batch`] every `batch_size` entries.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::{batch::Batcher, FieldArray, DataEntry};
/// let mut b = Batcher::new(2);
/// let mut e = DataEntry::default();
/// e.insert("x", FieldArray::from_vec(vec![1.0]));
/// assert!(b.push(e.clone()).is_none());
/// assert_eq!(b.push(e.clone()).unwrap().unwrap().len, 2);
/// b.push(e);
/// assert_eq!(b.finish().unwrap().unwrap().len, 1);
/// ```
#[derive(Debug)]
pub struct Batcher {
    batch_size: usize,
    pending: Vec<DataEntry>,
}

impl Batcher {
    /// A batcher of `batch_size` (at least 1) rows. Room for at most 1024 of them is taken
    /// up front, the rest as entries arrive: `batch_size` is a user's number.
    pub fn new(batch_size: usize) -> Batcher {
        let batch_size = batch_size.max(1);
        Batcher {
            batch_size,
            pending: Vec::with_capacity(batch_size.min(1024)),
        }
    }

    /// Adds an entry; returns a batch when `batch_size` entries are pending.
    pub fn push(&mut self, e: DataEntry) -> Option<Result<Batch, BatchError>> {
        self.pending.push(e);
        if self.pending.len() == self.batch_size {
            let r = stack(&self.pending);
            self.pending.clear();
            Some(r)
        } else {
            None
        }
    }

    /// The last, partial batch, if any entries are pending.
    pub fn finish(&mut self) -> Option<Result<Batch, BatchError>> {
        if self.pending.is_empty() {
            return None;
        }
        let r = stack(&self.pending);
        self.pending.clear();
        Some(r)
    }

    /// Number of pending entries.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review 18, hole 1: `Batcher::new` reserved room for `batch_size` entries up front, so
    /// a user's `batch_size` of 2^40 aborted the worker on the failed allocation.
    #[test]
    fn a_huge_batch_size_reserves_nothing_up_front() {
        let mut b = Batcher::new(1 << 40);
        let mut e = DataEntry::default();
        e.insert("x", FieldArray::from_vec(vec![1.0]));
        assert!(b.push(e).is_none());
        assert_eq!(b.finish().unwrap().unwrap().len, 1);
    }
}
