//! `Sender.send_many`: many records per message.
//!
//! A Python call costs about a microsecond; a 16-float record costs shm-ring a few hundred
//! nanoseconds. So records travel as one message of many records (a Rust receiver sees them
//! as such: `Message::records()`), built from stacked numpy arrays: one Python call for
//! a whole batch. Like `send`, it reads numpy memory only with the GIL held: messages that
//! must wait are built from private copies.

use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use shm_ring::{DType, MessageBuilder, MetaValue, TrySendError};

use super::closed;
use super::errors::ring_err;
use super::outgoing::{meta_value, numpy};
use super::sender::Sender;
use crate::dtype;

/// Bytes of a record's header, a field's header, and a message body's header in shm-ring's
/// encoding (`message/encode.rs`): used to cut a batch into messages that fit.
const RECORD_HEADER: usize = 16;
const FIELD_HEADER: usize = 24;
const BODY_HEADER: usize = 24;

fn pad8(n: usize) -> usize {
    n.next_multiple_of(8)
}

/// One stacked array of a batch to send: record `i` holds row `i`.
struct Column<'a> {
    name: String,
    dt: DType,
    row_shape: Vec<usize>,
    row_bytes: usize,
    bytes: &'a [u8],
}

impl Sender {
    /// The body of `Sender.send_many` (the Python method lives with the others in
    /// sender.rs; this file holds the batch encoding).
    pub(super) fn send_many_records(
        &self,
        py: Python<'_>,
        arrays: &Bound<'_, PyDict>,
        meta: Option<&Bound<'_, PyDict>>,
        end: Option<Instant>,
    ) -> PyResult<usize> {
        send_many(self, py, arrays, meta, end)
    }
}

/// Sends the records `arrays[k][i]` / `meta[k][i]` (see `Sender.send_many`).
fn send_many(
    tx: &Sender,
    py: Python<'_>,
    arrays: &Bound<'_, PyDict>,
    meta: Option<&Bound<'_, PyDict>>,
    end: Option<Instant>,
) -> PyResult<usize> {
    let mut keep = Vec::with_capacity(arrays.len());
    let mut n: Option<usize> = None;
    let mut len_of = |what: &str, len: usize| -> PyResult<()> {
        match n {
            Some(m) if m != len => Err(PyValueError::new_err(format!(
                "send_many: {what} has {len} records, another column {m}: every array's first \
                 dimension and every metadata list must have the same length"
            ))),
            _ => {
                n = Some(len);
                Ok(())
            }
        }
    };
    for (k, v) in arrays.iter() {
        let name: String = k.extract()?;
        let arr = numpy(py)?.call_method1("ascontiguousarray", (v,))?;
        let a = arr.cast::<numpy::PyUntypedArray>()?;
        // SAFETY: `arr` is kept in `keep` for this call and read only with the GIL held.
        let (dt, shape, bytes) = unsafe { dtype::raw_parts(a)? };
        let Some((&rows, row_shape)) = shape.split_first() else {
            return Err(PyValueError::new_err(format!(
                "send_many: array {name:?} is 0-d: give arrays of records (first dimension)"
            )));
        };
        len_of(&format!("array {name:?}"), rows)?;
        let row_bytes = row_shape.iter().product::<usize>() * dt.size();
        // SAFETY: as above; the slice never outlives `keep`, which outlives every message.
        let bytes = unsafe { std::mem::transmute::<&[u8], &'static [u8]>(bytes) };
        keep.push((arr, name, dt, row_shape.to_vec(), row_bytes, bytes));
    }
    let mut metas: Vec<(String, Vec<MetaValue<'static>>)> = Vec::new();
    for (k, v) in meta.into_iter().flat_map(|m| m.iter()) {
        let name: String = k.extract()?;
        let vals = v
            .try_iter()?
            .map(|x| meta_value(&x?))
            .collect::<PyResult<Vec<_>>>()?;
        len_of(&format!("metadata {name:?}"), vals.len())?;
        metas.push((name, vals));
    }
    let n = n.unwrap_or(0);
    let cols: Vec<Column<'_>> = keep
        .iter()
        .map(|(_, name, dt, row_shape, row_bytes, bytes)| Column {
            name: name.clone(),
            dt: *dt,
            row_shape: row_shape.clone(),
            row_bytes: *row_bytes,
            bytes,
        })
        .collect();
    let mut at = 0;
    while at < n {
        let upto = chunk_end(tx, &cols, &metas, at, n);
        let msg = build(&cols, &metas, at, upto).map_err(|e| ring_err(py, e))?;
        if !try_send_now(tx, py, msg)? {
            // No room: what is left waits, owned (numpy memory is read with the GIL held
            // only), re-read now from the arrays as they are.
            return send_rest_owned(tx, py, &keep, &metas, at, n, end).map(|()| n);
        }
        at = upto;
    }
    Ok(n)
}

/// The record after the last one of the message that starts at record `at`: as many as fit
/// one message body (a pool block, or the descriptor ring without a pool), and at most half
/// the pool's blocks for rows that go zero-copy.
fn chunk_end(
    tx: &Sender,
    cols: &[Column<'_>],
    metas: &[(String, Vec<MetaValue<'static>>)],
    at: usize,
    n: usize,
) -> usize {
    let cfg = tx.cfg();
    let budget = if cfg.blocks > 0 {
        cfg.block_size.min(1 << 20)
    } else {
        (cfg.slots as usize * cfg.slot_size as usize / 4).saturating_sub(RECORD_HEADER)
    }
    .saturating_sub(BODY_HEADER);
    let zero_copy = cols
        .iter()
        .filter(|c| cfg.blocks > 0 && cfg.transfer.zero_copy(c.row_bytes))
        .count();
    let max_records = (cfg.blocks as usize / 2)
        .checked_div(zero_copy)
        .map_or(usize::MAX, |m| m.max(1));
    let fixed: usize = RECORD_HEADER
        + cols
            .iter()
            .map(|c| {
                let data = if cfg.blocks > 0 && cfg.transfer.zero_copy(c.row_bytes) {
                    0
                } else {
                    pad8(c.row_bytes)
                };
                FIELD_HEADER + 8 * c.row_shape.len() + pad8(c.name.len()) + data
            })
            .sum::<usize>();
    let mut used = 0;
    let mut i = at;
    while i < n && i - at < max_records {
        let size = fixed
            + metas
                .iter()
                .map(|(name, v)| {
                    let s = match &v[i] {
                        MetaValue::Str(s) => s.len(),
                        _ => 0,
                    };
                    FIELD_HEADER + pad8(name.len() + s)
                })
                .sum::<usize>();
        if i > at && used + size > budget {
            break;
        }
        used += size;
        i += 1;
    }
    i
}

/// The message of records `from..to`, borrowing names, shapes, rows and strings.
fn build<'a>(
    cols: &'a [Column<'a>],
    metas: &'a [(String, Vec<MetaValue<'static>>)],
    from: usize,
    to: usize,
) -> Result<MessageBuilder<'a>, shm_ring::Error> {
    let mut b = MessageBuilder::new();
    for r in from..to {
        if r > from {
            b.push_next_record();
        }
        for c in cols {
            let row = &c.bytes[r * c.row_bytes..(r + 1) * c.row_bytes];
            b.push_array_raw(c.name.as_str(), c.dt, &c.row_shape, row)?;
        }
        for (name, v) in metas {
            b.push_meta(name.as_str(), super::outgoing::borrow_meta(&v[r]));
        }
    }
    Ok(b)
}

/// Sends `msg` if there is room right now (GIL held); false if the channel is full or another
/// thread holds the sender.
fn try_send_now(tx: &Sender, py: Python<'_>, msg: MessageBuilder<'_>) -> PyResult<bool> {
    let Ok(mut g) = tx.inner().try_lock() else {
        return Ok(false);
    };
    let s = g.as_mut().ok_or_else(closed)?;
    match s.try_send(msg) {
        Ok(()) => Ok(true),
        Err(TrySendError::Full(_)) => Ok(false),
        Err(e) => Err(ring_err(py, e)),
    }
}

/// Sends records `at..n` from private copies of the arrays (taken now, with the GIL held),
/// waiting for room in slices with the GIL released.
#[allow(clippy::type_complexity)]
fn send_rest_owned(
    tx: &Sender,
    py: Python<'_>,
    keep: &[(
        Bound<'_, PyAny>,
        String,
        DType,
        Vec<usize>,
        usize,
        &'static [u8],
    )],
    metas: &[(String, Vec<MetaValue<'static>>)],
    at: usize,
    n: usize,
    end: Option<Instant>,
) -> PyResult<()> {
    let mut owned = Vec::with_capacity(keep.len());
    for (arr, name, dt, row_shape, row_bytes, _) in keep {
        let a = arr.cast::<numpy::PyUntypedArray>()?;
        // SAFETY: `arr` lives for this call; the GIL is held while we copy.
        let (now_dt, shape, bytes) = unsafe { dtype::raw_parts(a)? };
        if now_dt != *dt || shape.first() != Some(&n) || shape[1..] != row_shape[..] {
            return Err(PyValueError::new_err(format!(
                "send_many: array {name:?} changed shape while the send waited"
            )));
        }
        owned.push((
            name.clone(),
            *dt,
            row_shape.clone(),
            *row_bytes,
            bytes.to_vec(),
        ));
    }
    let cols: Vec<Column<'_>> = owned
        .iter()
        .map(|(name, dt, row_shape, row_bytes, bytes)| Column {
            name: name.clone(),
            dt: *dt,
            row_shape: row_shape.clone(),
            row_bytes: *row_bytes,
            bytes,
        })
        .collect();
    let mut at = at;
    while at < n {
        let upto = chunk_end(tx, &cols, metas, at, n);
        let msg = build(&cols, metas, at, upto).map_err(|e| ring_err(py, e))?;
        tx.send_owned(py, msg, end)?;
        at = upto;
    }
    Ok(())
}
