//! Reading one row of a GluonTS column: lists of numbers (flat, flattened with a
//! shape column, or nested), `start` timestamps and `item_id`s.

use std::borrow::Cow;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array as ArrowArray, RecordBatch};
use arrow_schema::{DataType, TimeUnit};

use crate::entry::{FieldArray, MAX_NDIM};
use crate::period::{DateTime, Freq, Period};

/// How many dimensions a known field's arrays have.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Dim {
    One,
    Two,
    Either,
}

/// The values child and the element range of row `r` of a list column; `None` for null.
fn list_row(
    col: &dyn ArrowArray,
    r: usize,
) -> Result<Option<(&dyn ArrowArray, usize, usize)>, String> {
    if r >= col.len() {
        return Err(format!("row {r} out of range"));
    }
    if col.is_null(r) {
        return Ok(None);
    }
    let range = |s: usize, e: usize| -> Result<(usize, usize), String> {
        if s > e {
            Err("decreasing list offsets".into())
        } else {
            Ok((s, e))
        }
    };
    let (values, (s, e)): (&dyn ArrowArray, _) = match col.data_type() {
        DataType::List(_) => {
            let l = col.as_list::<i32>();
            let o = l.value_offsets();
            (
                l.values().as_ref(),
                range(o[r] as usize, o[r + 1] as usize)?,
            )
        }
        DataType::LargeList(_) => {
            let l = col.as_list::<i64>();
            let o = l.value_offsets();
            (
                l.values().as_ref(),
                range(o[r] as usize, o[r + 1] as usize)?,
            )
        }
        DataType::FixedSizeList(_, n) => {
            let l = col.as_fixed_size_list();
            let n = *n as usize;
            let s = l.value_offset(r) as usize;
            (l.values().as_ref(), (s, s + n))
        }
        t => return Err(format!("expected a list column, found {t}")),
    };
    if e > values.len() {
        return Err("list offsets outside the values".into());
    }
    Ok(Some((values, s, e)))
}

/// Elements `s..e` of a numeric array as `f32` (borrowed for `float32` without nulls).
fn to_f32(values: &dyn ArrowArray, s: usize, e: usize) -> Result<Cow<'_, [f32]>, String> {
    let has_nulls = values
        .logical_nulls()
        .is_some_and(|n| n.slice(s, e - s).null_count() > 0);
    macro_rules! convert {
        ($t:ty) => {{
            let a = values.as_primitive::<$t>();
            let v = &a.values()[s..e];
            if has_nulls {
                (s..e)
                    .map(|i| {
                        if a.is_null(i) {
                            f32::NAN
                        } else {
                            a.value(i) as f32
                        }
                    })
                    .collect()
            } else {
                v.iter().map(|&x| x as f32).collect()
            }
        }};
    }
    Ok(match values.data_type() {
        DataType::Float32 if !has_nulls => {
            Cow::Borrowed(&values.as_primitive::<Float32Type>().values()[s..e])
        }
        DataType::Float32 => Cow::Owned(convert!(Float32Type)),
        DataType::Float64 => Cow::Owned(convert!(Float64Type)),
        DataType::Int8 => Cow::Owned(convert!(Int8Type)),
        DataType::Int16 => Cow::Owned(convert!(Int16Type)),
        DataType::Int32 => Cow::Owned(convert!(Int32Type)),
        DataType::Int64 => Cow::Owned(convert!(Int64Type)),
        DataType::UInt8 => Cow::Owned(convert!(UInt8Type)),
        DataType::UInt16 => Cow::Owned(convert!(UInt16Type)),
        DataType::UInt32 => Cow::Owned(convert!(UInt32Type)),
        DataType::UInt64 => Cow::Owned(convert!(UInt64Type)),
        t => return Err(format!("unsupported element type {t}")),
    })
}

/// Row `r` of a list column as flat `f32` values; `None` when the row is null.
pub(super) fn list_values(
    col: &dyn ArrowArray,
    r: usize,
) -> Result<Option<Cow<'_, [f32]>>, String> {
    match list_row(col, r)? {
        None => Ok(None),
        Some((values, s, e)) => {
            if matches!(
                values.data_type(),
                DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..)
            ) {
                // Nested rows, concatenated.
                let mut out = Vec::new();
                for k in s..e {
                    match list_values(values, k)? {
                        Some(row) => out.extend_from_slice(&row),
                        None => return Err("null row in a 2-D array".into()),
                    }
                }
                Ok(Some(Cow::Owned(out)))
            } else {
                to_f32(values, s, e).map(Some)
            }
        }
    }
}

/// Row `r` of an array field, with its shape (from the shape column, from nesting, or 1-D).
pub(super) fn read_array(
    batch: &RecordBatch,
    col: usize,
    shape_col: Option<usize>,
    r: usize,
    dim: Dim,
) -> Result<Option<FieldArray>, String> {
    let column = batch.column(col).as_ref();
    let Some(data) = list_values(column, r)? else {
        return Ok(None);
    };
    let data = data.into_owned();
    let shape: Vec<usize> = if let Some(sc) = shape_col {
        match list_row(batch.column(sc).as_ref(), r)? {
            None => vec![data.len()],
            Some((v, s, e)) => {
                let dims = v
                    .as_primitive_opt::<Int64Type>()
                    .ok_or("shape column is not list<int64>")?;
                dims.values()[s..e]
                    .iter()
                    .map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d}")))
                    .collect::<Result<_, _>>()?
            }
        }
    } else if let Some((rows, s, e)) = nested_rows(column, r)? {
        let n = e - s;
        let t = data.len().checked_div(n).unwrap_or(0);
        for k in s..e {
            let (_, rs, re) = list_row(rows, k)?.ok_or("null row in a 2-D array")?;
            if re - rs != t {
                return Err("rows of different lengths".into());
            }
        }
        vec![n, t]
    } else {
        vec![data.len()]
    };
    if shape.len() > MAX_NDIM {
        return Err(format!("{} dimensions (at most {MAX_NDIM})", shape.len()));
    }
    if shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) != Some(data.len()) {
        return Err(format!(
            "shape {shape:?} does not match {} values",
            data.len()
        ));
    }
    let a = FieldArray::new(&shape, data);
    match dim {
        Dim::One if a.ndim() != 1 => Err("expected a 1-D array".into()),
        Dim::Two if a.ndim() != 2 => {
            if a.data().is_empty() {
                Ok(Some(FieldArray::zeros(&[0, 0])))
            } else {
                Err("expected a 2-D array".into())
            }
        }
        Dim::Either if a.ndim() > 2 => Err("expected a 1-D or 2-D array".into()),
        _ => Ok(Some(a)),
    }
}

/// The inner list array and row range when row `r` of `col` is a list of lists.
fn nested_rows(
    col: &dyn ArrowArray,
    r: usize,
) -> Result<Option<(&dyn ArrowArray, usize, usize)>, String> {
    match list_row(col, r)? {
        Some((v, s, e))
            if matches!(
                v.data_type(),
                DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..)
            ) =>
        {
            Ok(Some((v, s, e)))
        }
        _ => Ok(None),
    }
}

/// `start` of row `r`: a timestamp (any unit; naive or UTC), a date or a string.
pub(super) fn read_start(col: &dyn ArrowArray, r: usize, freq: Freq) -> Result<Period, String> {
    if r >= col.len() || col.is_null(r) {
        return Err("required field is null".into());
    }
    let secs = match col.data_type() {
        DataType::Timestamp(unit, tz) => {
            // Naive timestamps (GluonTS's) and UTC are wall-clock time; another zone
            // would need its offset rules to find the wall-clock period pandas uses.
            if let Some(tz) = tz
                .as_deref()
                .filter(|z| !matches!(*z, "UTC" | "Z" | "+00:00" | "Etc/UTC"))
            {
                return Err(format!("timestamps in time zone {tz:?} are not supported"));
            }
            use arrow_array::types::{
                TimestampMicrosecondType as Us, TimestampMillisecondType as Ms,
                TimestampNanosecondType as Ns, TimestampSecondType as S,
            };
            match unit {
                TimeUnit::Second => col.as_primitive::<S>().value(r),
                TimeUnit::Millisecond => col.as_primitive::<Ms>().value(r).div_euclid(1_000),
                TimeUnit::Microsecond => col.as_primitive::<Us>().value(r).div_euclid(1_000_000),
                TimeUnit::Nanosecond => col.as_primitive::<Ns>().value(r).div_euclid(1_000_000_000),
            }
        }
        DataType::Date32 => {
            i64::from(
                col.as_primitive::<arrow_array::types::Date32Type>()
                    .value(r),
            ) * 86_400
        }
        DataType::Date64 => col
            .as_primitive::<arrow_array::types::Date64Type>()
            .value(r)
            .div_euclid(1_000),
        DataType::Utf8 => {
            return Period::parse(col.as_string::<i32>().value(r), freq).map_err(|e| e.to_string());
        }
        DataType::LargeUtf8 => {
            return Period::parse(col.as_string::<i64>().value(r), freq).map_err(|e| e.to_string());
        }
        t => return Err(format!("unsupported type {t}")),
    };
    let t = DateTime {
        days: secs.div_euclid(86_400),
        secs: secs.rem_euclid(86_400) as u32,
    };
    Ok(Period::containing(t, freq))
}

/// `item_id` of row `r`: a string, or an integer kept as its decimal text.
pub(super) fn read_item_id(col: &dyn ArrowArray, r: usize) -> Result<Option<Arc<str>>, String> {
    if r >= col.len() || col.is_null(r) {
        return Ok(None);
    }
    Ok(Some(match col.data_type() {
        DataType::Utf8 => Arc::from(col.as_string::<i32>().value(r)),
        DataType::LargeUtf8 => Arc::from(col.as_string::<i64>().value(r)),
        DataType::Int64 => Arc::from(col.as_primitive::<Int64Type>().value(r).to_string()),
        DataType::Int32 => Arc::from(col.as_primitive::<Int32Type>().value(r).to_string()),
        DataType::UInt64 => Arc::from(col.as_primitive::<UInt64Type>().value(r).to_string()),
        t => return Err(format!("unsupported type {t}")),
    }))
}
