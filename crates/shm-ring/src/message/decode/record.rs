//! Reading a record: arrays (as ndarray views, slices, raw bytes or checked bools) and
//! metadata, looked up by name.

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use super::*;
use crate::{DecodeError, FieldError};

/// A failed validation met while reading a field, as a [`FieldError`].
#[cold]
fn corrupt_field(e: Error) -> FieldError {
    FieldError::Corrupt(DecodeError::from_internal(e))
}

/// `Err` unless array `a` holds elements of type `expected`.
fn check_dtype(a: &ArrayInfo<'_>, expected: DType) -> Result<(), FieldError> {
    if a.dtype == expected {
        return Ok(());
    }
    Err(FieldError::WrongDType {
        name: a.name.to_string(),
        found: a.dtype,
        expected,
    })
}

/// The elements of array `a`, if its data is aligned for `T`.
fn cast<'a, T: Element>(a: &ArrayInfo<'a>) -> Result<&'a [T], FieldError> {
    bytemuck::try_cast_slice(a.bytes).map_err(|_| FieldError::Misaligned {
        name: a.name.to_string(),
        dtype: a.dtype,
    })
}

impl<'a> RecordView<'a> {
    /// All fields, in the order they were added.
    pub fn fields(&self) -> Fields<'a> {
        Fields {
            rec: *self,
            pos: self.start,
            left: self.fields,
        }
    }

    /// The record's tag ([`MessageBuilder::record_tag`](crate::MessageBuilder::record_tag); 0
    /// unless the sender set one).
    pub fn tag(&self) -> u64 {
        self.tag
    }

    fn find(&self, name: &str) -> Result<FieldRef<'a>, FieldError> {
        let mut fields = self.fields();
        while let Some(f) = fields.find(name) {
            let f = f.map_err(FieldError::Corrupt)?;
            if f.name() == name {
                // A second field of that name would make two lookups disagree (one field's
                // dtype, another's bytes): refuse the record.
                if fields.left > 0 {
                    rest_has(fields, name).map_err(corrupt_field)?;
                }
                return Ok(f);
            }
        }
        Err(self.no_such_field(name))
    }

    #[cold]
    fn no_such_field(&self, name: &str) -> FieldError {
        FieldError::NoSuchField {
            name: name.to_string(),
            known: self
                .fields()
                .filter_map(|f| f.ok().map(|f| f.name().to_string()))
                .collect(),
        }
    }

    /// The elements of array `name` in row-major order, without building an ndarray view
    /// (the fastest access; the shape is in [`RecordView::array_info`]).
    ///
    /// Zero-copy, as [`RecordView::array`]: a hostile producer can change the values while
    /// you read them, never the length or where they lie.
    ///
    /// # Errors
    /// As [`RecordView::array`].
    pub fn slice<T: Element>(&self, name: &str) -> Result<&'a [T], FieldError> {
        let a = self.array_info(name)?;
        check_dtype(&a, T::DTYPE)?;
        cast(&a)
    }

    /// The array `name` and its description.
    ///
    /// # Errors
    /// [`FieldError::NoSuchField`], [`FieldError::NotAnArray`], [`FieldError::Corrupt`].
    pub fn array_info(&self, name: &str) -> Result<ArrayInfo<'a>, FieldError> {
        match self.find(name)? {
            FieldRef::Array(a) => Ok(a),
            FieldRef::Meta(..) => Err(FieldError::NotAnArray {
                name: name.to_string(),
            }),
        }
    }

    /// The array `name` as an ndarray view.
    ///
    /// The view is zero-copy over shared memory for arrays in a pool block (and for in-place
    /// reads, [`crate::Receiver::recv_batch`]): a hostile producer can change the values while
    /// you read them, never the shape or bounds (validated on a private copy). Copy the view
    /// (`to_owned()`) before trusting values you check.
    ///
    /// # Errors
    /// As [`RecordView::array_info`]; [`FieldError::WrongDType`] for another element type
    /// than `T`, [`FieldError::Misaligned`] for data not aligned for `T`.
    pub fn array<T: Element>(&self, name: &str) -> Result<ArrayViewD<'a, T>, FieldError> {
        let a = self.array_info(name)?;
        check_dtype(&a, T::DTYPE)?;
        let data: &'a [T] = cast(&a)?;
        ArrayViewD::from_shape(IxDyn(&a.shape), data)
            .map_err(|e| corrupt_field(corrupt(format!("array '{name}': {e}"))))
    }

    /// The boolean array `name`, checked (every byte must be 0 or 1) and copied.
    ///
    /// # Errors
    /// As [`RecordView::array`]; [`FieldError::NotABool`] for a byte other than 0 or 1.
    pub fn array_bool(&self, name: &str) -> Result<ArrayD<bool>, FieldError> {
        let a = self.array_info(name)?;
        check_dtype(&a, DType::Bool)?;
        let v = a
            .bytes
            .iter()
            .map(|&x| match x {
                0 => Ok(false),
                1 => Ok(true),
                byte => Err(FieldError::NotABool {
                    name: name.to_string(),
                    byte,
                }),
            })
            .collect::<Result<Vec<bool>, FieldError>>()?;
        ArrayD::from_shape_vec(IxDyn(&a.shape), v)
            .map_err(|e| corrupt_field(corrupt(format!("array '{name}': {e}"))))
    }

    /// The raw bytes of array `name` (any dtype).
    ///
    /// # Errors
    /// As [`RecordView::array_info`].
    pub fn array_bytes(&self, name: &str) -> Result<&'a [u8], FieldError> {
        Ok(self.array_info(name)?.bytes)
    }

    /// The metadata value `name`, if present and valid.
    pub fn meta(&self, name: &str) -> Option<MetaValue<'a>> {
        match self.find(name) {
            Ok(FieldRef::Meta(_, v)) => Some(v),
            _ => None,
        }
    }

    /// The integer metadata `name`.
    pub fn meta_i64(&self, name: &str) -> Option<i64> {
        match self.meta(name)? {
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The float metadata `name`.
    pub fn meta_f64(&self, name: &str) -> Option<f64> {
        match self.meta(name)? {
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string metadata `name`.
    pub fn meta_str(&self, name: &str) -> Option<&'a str> {
        match self.meta(name)? {
            MetaValue::Str(Cow::Borrowed(s)) => Some(s),
            _ => None,
        }
    }
}
