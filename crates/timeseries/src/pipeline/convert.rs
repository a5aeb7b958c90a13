//! Entries, windows and batches as pipeline items, and groups of series packed into one
//! record.

use shmpipe::ndarray::Array1;
use shmpipe::{Item, Meta, StepError};

use super::names::{
    FORECAST_START_FIELD, FORECAST_START_META, GROUP_META, ITEM_ID_META, ITEM_IDS_META,
    START_FIELD, START_META,
};
use crate::batch::Batch;
use crate::entry::{DataEntry, FieldArray};
use crate::period::{Freq, Period};

/// Converts an entry into a pipeline item (arrays moved, not copied).
pub fn entry_to_item(mut e: DataEntry) -> Item {
    let mut item = Item::new();
    for (name, a) in e.take_fields() {
        item.insert(&name, shmpipe::Array::F32(a.into_ndarray()));
    }
    if let Some(id) = &e.item_id {
        item.insert_meta(ITEM_ID_META, &**id);
    }
    if let Some(s) = e.start {
        item.insert_meta(START_META, s.ordinal);
    }
    if let Some(s) = e.forecast_start {
        item.insert_meta(FORECAST_START_META, s.ordinal);
    }
    item
}

/// Converts a pipeline item back into an entry of frequency `freq`.
///
/// # Errors
/// If an array is not `f32` or has more than [`crate::entry::MAX_NDIM`] dimensions.
pub fn item_to_entry(mut item: Item, freq: Freq) -> Result<DataEntry, StepError> {
    let mut e = DataEntry::default();
    let names: Vec<String> = item.arrays().map(|(n, _)| n.to_owned()).collect();
    for n in names {
        let a = item
            .remove(&n)
            .and_then(|a| a.into_typed::<f32>().ok())
            .ok_or_else(|| StepError::new(format!("array {n:?} is not f32")))?;
        if a.ndim() > crate::entry::MAX_NDIM {
            return Err(StepError::new(format!(
                "array {n:?} has too many dimensions"
            )));
        }
        e.insert(n, FieldArray::from_ndarray(a));
    }
    if let Some(Meta::Str(id)) = item.meta(ITEM_ID_META) {
        e.item_id = Some(id.as_str().into());
    }
    if let Some(ordinal) = item.i64(START_META) {
        e.start = Some(Period { freq, ordinal });
    }
    if let Some(ordinal) = item.i64(FORECAST_START_META) {
        e.forecast_start = Some(Period { freq, ordinal });
    }
    Ok(e)
}

/// Converts a batch into one item: every stacked array, the `forecast_start` and `start`
/// ordinals (`i64::MIN` for none), and the item ids as a JSON list (`null` for none).
pub fn batch_to_item(b: Batch) -> Item {
    let ordinals = |ps: &[Option<Period>]| -> Array1<i64> {
        ps.iter()
            .map(|p| p.map_or(i64::MIN, |p| p.ordinal))
            .collect()
    };
    let ids: Vec<Option<&str>> = b.item_ids.iter().map(|i| i.as_deref()).collect();
    let ids = serde_json::to_string(&ids).unwrap_or_default();
    let mut item = Item::new()
        .with(FORECAST_START_FIELD, ordinals(&b.forecast_starts))
        .with(START_FIELD, ordinals(&b.starts))
        .with_meta(ITEM_IDS_META, ids);
    for (name, a) in b.into_fields() {
        item.insert(&name, shmpipe::Array::F32(a.into_ndarray()));
    }
    item
}

/// Rows in a batch item (length of its `forecast_start` array).
pub fn batch_rows(item: &Item) -> usize {
    item.get(FORECAST_START_FIELD)
        .and_then(|a| a.shape().first().copied())
        .unwrap_or(0)
}

/// Packs entries into one record: series `j`'s fields and metadata named `"{j}/{name}"`.
pub fn group_items(entries: Vec<Item>) -> Item {
    let mut g = Item::new().with_meta(GROUP_META, entries.len() as i64);
    for (j, mut it) in entries.into_iter().enumerate() {
        let names: Vec<String> = it.arrays().map(|(n, _)| n.to_owned()).collect();
        for n in names {
            if let Some(a) = it.remove(&n) {
                g.insert(&format!("{j}/{n}"), a);
            }
        }
        for (n, m) in it.metas() {
            g.insert_meta(&format!("{j}/{n}"), m.clone());
        }
    }
    g
}

/// Unpacks a record made by [`group_items`] into `n` entries.
///
/// # Errors
/// A malformed name or a non-`f32` array.
pub fn split_group(mut item: Item, n: usize, freq: Freq) -> Result<Vec<DataEntry>, StepError> {
    let mut parts: Vec<Item> = (0..n).map(|_| Item::new()).collect();
    let index = |name: &str| -> Result<(usize, String), StepError> {
        let (j, rest) = name
            .split_once('/')
            .ok_or_else(|| StepError::new(format!("ungrouped field {name:?}")))?;
        let j: usize = j
            .parse()
            .ok()
            .filter(|&j| j < n)
            .ok_or_else(|| StepError::new(format!("bad group index in {name:?}")))?;
        Ok((j, rest.to_owned()))
    };
    let names: Vec<String> = item.arrays().map(|(n, _)| n.to_owned()).collect();
    for name in names {
        let (j, field) = index(&name)?;
        if let Some(a) = item.remove(&name) {
            parts[j].insert(&field, a);
        }
    }
    for (name, m) in item.metas() {
        if name == GROUP_META {
            continue;
        }
        let (j, field) = index(name)?;
        parts[j].insert_meta(&field, m.clone());
    }
    parts.into_iter().map(|p| item_to_entry(p, freq)).collect()
}
