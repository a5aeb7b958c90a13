//! The data model: named `f32` arrays plus metadata, GluonTS's `DataEntry`.

use std::fmt;
use std::sync::Arc;

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::period::Period;

/// GluonTS's standard field names (`gluonts.dataset.field_names.FieldName`).
pub mod field {
    /// The series values.
    pub const TARGET: &str = "target";
    /// Static categorical features.
    pub const FEAT_STATIC_CAT: &str = "feat_static_cat";
    /// Static real features.
    pub const FEAT_STATIC_REAL: &str = "feat_static_real";
    /// Dynamic real features, shape `(num_features, T)`.
    pub const FEAT_DYNAMIC_REAL: &str = "feat_dynamic_real";
    /// Dynamic categorical features, shape `(num_features, T)`.
    pub const FEAT_DYNAMIC_CAT: &str = "feat_dynamic_cat";
    /// Dynamic real features known only in the past.
    pub const PAST_FEAT_DYNAMIC_REAL: &str = "past_feat_dynamic_real";
    /// Observed-values indicator written by `AddObservedValuesIndicator`.
    pub const OBSERVED_VALUES: &str = "observed_values";
    /// Padding indicator (`past_is_pad` after splitting).
    pub const IS_PAD: &str = "is_pad";
    /// Time features.
    pub const FEAT_TIME: &str = "time_feat";
    /// Age feature.
    pub const FEAT_AGE: &str = "feat_dynamic_age";
}

/// Largest number of dimensions a [`FieldArray`] can have.
pub const MAX_NDIM: usize = 4;

/// A dense row-major `f32` array of up to [`MAX_NDIM`] dimensions.
///
/// The last axis is the time axis for time-series fields. Categorical fields
/// (`feat_static_cat`) are stored as `f32` too (exact for integers below 2^24).
///
/// # Examples
/// ```
/// use shmpipe_timeseries::FieldArray;
/// let a = FieldArray::new(&[2, 3], vec![0., 1., 2., 3., 4., 5.]);
/// assert_eq!(a.shape(), &[2, 3]);
/// assert_eq!(a.view()[[1, 2]], 5.0);
/// ```
#[derive(Clone, PartialEq)]
pub struct FieldArray {
    /// Dimensions; only the first `ndim` are meaningful, the rest are 1.
    dims: [usize; MAX_NDIM],
    ndim: u8,
    /// Elements; `data.len()` is the product of the dimensions.
    data: Vec<f32>,
}

impl FieldArray {
    /// An array of the given shape over `data`.
    ///
    /// # Panics
    /// If `shape` has more than [`MAX_NDIM`] dimensions or its product is not `data.len()`.
    pub fn new(shape: &[usize], data: Vec<f32>) -> FieldArray {
        assert!(shape.len() <= MAX_NDIM, "at most {MAX_NDIM} dimensions");
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "shape {shape:?} does not match {} elements",
            data.len()
        );
        let mut dims = [1; MAX_NDIM];
        dims[..shape.len()].copy_from_slice(shape);
        FieldArray {
            dims,
            ndim: shape.len() as u8,
            data,
        }
    }

    /// A 1-D array.
    pub fn from_vec(data: Vec<f32>) -> FieldArray {
        FieldArray::new(&[data.len()], data)
    }

    /// An array of zeros.
    pub fn zeros(shape: &[usize]) -> FieldArray {
        FieldArray::new(shape, vec![0.0; shape.iter().product()])
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.dims[..self.ndim as usize]
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.ndim as usize
    }

    /// Length of the last (time) axis; 1 for a 0-D array.
    pub fn time_len(&self) -> usize {
        if self.ndim == 0 {
            1
        } else {
            self.dims[self.ndim as usize - 1]
        }
    }

    /// Number of rows when seen as `(rows, time_len)`.
    pub fn rows(&self) -> usize {
        self.shape()[..self.ndim().saturating_sub(1)]
            .iter()
            .product()
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The elements, row-major, mutable.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// The element buffer.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// Size of the elements in bytes.
    pub fn nbytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }

    /// An `ndarray` view.
    pub fn view(&self) -> ArrayViewD<'_, f32> {
        ArrayViewD::from_shape(IxDyn(self.shape()), &self.data)
            .expect("shape invariant: product of dims equals data.len()")
    }

    /// Converts into an owned `ndarray` array without copying.
    pub fn into_ndarray(self) -> ArrayD<f32> {
        let shape = self.shape().to_vec();
        ArrayD::from_shape_vec(IxDyn(&shape), self.data)
            .expect("shape invariant: product of dims equals data.len()")
    }

    /// Converts from an `ndarray` array (copies only if it is not in standard layout).
    ///
    /// # Panics
    /// If it has more than [`MAX_NDIM`] dimensions.
    pub fn from_ndarray(a: ArrayD<f32>) -> FieldArray {
        let shape = a.shape().to_vec();
        let data = if a.is_standard_layout() {
            a.into_raw_vec_and_offset().0
        } else {
            a.iter().copied().collect()
        };
        FieldArray::new(&shape, data)
    }
}

impl fmt::Debug for FieldArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FieldArray")
            .field("shape", &self.shape())
            .field("data", &self.data)
            .finish()
    }
}

/// One record: named arrays plus the metadata GluonTS keeps beside them.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::{FieldArray, DataEntry};
/// let mut e = DataEntry::default();
/// e.insert("target", FieldArray::from_vec(vec![1.0, 2.0]));
/// assert_eq!(e.get("target").unwrap().time_len(), 2);
/// assert!(e.remove("target").is_some());
/// assert!(e.get("target").is_none());
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DataEntry {
    /// `item_id` (numbers in the input are kept as their JSON text).
    pub item_id: Option<Arc<str>>,
    /// `start`, as a period of the dataset's frequency.
    pub start: Option<Period>,
    /// `forecast_start`, set by the instance splitter.
    pub forecast_start: Option<Period>,
    /// Named arrays, in insertion order.
    fields: Vec<(Arc<str>, FieldArray)>,
}

impl DataEntry {
    /// The array named `name`.
    pub fn get(&self, name: &str) -> Option<&FieldArray> {
        self.fields
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, a)| a)
    }

    /// The array named `name`, mutable.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut FieldArray> {
        self.fields
            .iter_mut()
            .find(|(n, _)| &**n == name)
            .map(|(_, a)| a)
    }

    /// Sets field `name`, replacing any previous value in place.
    pub fn insert(&mut self, name: impl Into<Arc<str>>, value: FieldArray) {
        let name = name.into();
        match self.fields.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.fields.push((name, value)),
        }
    }

    /// Removes and returns field `name`.
    pub fn remove(&mut self, name: &str) -> Option<FieldArray> {
        let i = self.fields.iter().position(|(n, _)| &**n == name)?;
        Some(self.fields.remove(i).1)
    }

    /// Whether field `name` is present.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The fields, in insertion order.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &FieldArray)> {
        self.fields.iter().map(|(n, a)| (&**n, a))
    }

    /// Number of fields.
    pub fn num_fields(&self) -> usize {
        self.fields.len()
    }

    /// Total size of the arrays in bytes.
    pub fn nbytes(&self) -> usize {
        self.fields.iter().map(|(_, a)| a.nbytes()).sum()
    }

    /// Takes the fields out, leaving the entry without arrays.
    pub fn take_fields(&mut self) -> Vec<(Arc<str>, FieldArray)> {
        std::mem::take(&mut self.fields)
    }
}
