//! The batch form: `Sender.send_many` (many records per message) and `Receiver.recv_many`
//! (every record that is there, as columns).
//!
//! A Python call costs about a microsecond; a 16-float record costs shm-ring a few hundred
//! nanoseconds. So records travel as one message of many records (a Rust receiver sees
//! them as such: `Message::len`, `records()`), built from and gathered into stacked numpy
//! arrays: one Python call, and one numpy object per column, for a whole batch. The receiver
//! reads them in place (`Receiver::recv_batch`: released together, one index store) and
//! copies them into the columns, so a batch holds no pool block.

use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use shm_ring::{DType, MessageBuilder, MessageView, MetaValue, TrySendError};

use super::errors::ring_err;
use super::outgoing::{meta_value, numpy};
use super::sender::Sender;
use super::{closed, view};
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

/// Sends the records `arrays[k][i]` / `meta[k][i]` (see `Sender.send_many`).
pub(super) fn send_many(
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
        Err(e) => Err(ring_err(py, e.into())),
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

/// Bytes in 8-aligned storage (numpy views them as any dtype).
#[derive(Debug, Default, Clone)]
struct Bytes {
    words: Vec<u64>,
    len: usize,
}

impl Bytes {
    fn of(b: &[u8]) -> Bytes {
        let mut out = Bytes::default();
        out.extend(b);
        out
    }

    fn extend(&mut self, b: &[u8]) {
        let end = self.len + b.len();
        self.words.resize(end.div_ceil(8), 0);
        bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[self.len..end].copy_from_slice(b);
        self.len = end;
    }
}

/// The owner of a `recv_many` column's memory (the base object of its array).
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen)]
pub struct Buffer {
    bytes: Bytes,
}

/// A metadata value, owned.
#[derive(Debug, Clone)]
enum Meta {
    I(i64),
    F(f64),
    S(String),
}

/// What one column of a batch holds so far.
#[derive(Debug)]
enum Col {
    /// Every record had this array, with this dtype and shape: the rows, concatenated.
    Stacked {
        dt: DType,
        shape: Vec<usize>,
        bytes: Bytes,
    },
    /// Records disagree (dtype, shape, or some lack it): one entry per record.
    Ragged(Vec<Option<(DType, Vec<usize>, Bytes)>>),
    /// Metadata: one value per record.
    Meta(Vec<Option<Meta>>),
}

#[derive(Debug)]
struct Gathered {
    name: String,
    col: Col,
    /// Rows in `col` (equal to the batch's records after each record).
    rows: usize,
}

/// The records of a burst of messages, gathered into columns (without the GIL).
#[derive(Debug, Default)]
pub(super) struct Columns {
    records: usize,
    cols: Vec<Gathered>,
    /// A message that failed validation ended the burst: raised if nothing came before it.
    error: Option<shm_ring::Error>,
}

impl Col {
    /// The column as one entry per record (for records that disagree).
    fn ragged(self, rows: usize) -> Col {
        match self {
            Col::Stacked { dt, shape, bytes } => {
                let row = shape.iter().product::<usize>() * dt.size();
                let all = &bytemuck::cast_slice::<u64, u8>(&bytes.words)[..bytes.len];
                Col::Ragged(
                    (0..rows)
                        .map(|r| Some((dt, shape.clone(), Bytes::of(&all[r * row..(r + 1) * row]))))
                        .collect(),
                )
            }
            c => c,
        }
    }
}

impl Columns {
    /// Appends the records of `v`; on a corrupt record, drops the whole message's records.
    fn add(&mut self, v: MessageView<'_>) {
        if self.error.is_some() {
            return;
        }
        let before = (
            self.records,
            self.cols.iter().map(|c| c.rows).collect::<Vec<_>>(),
        );
        for rec in v.records() {
            if let Err(e) = rec.and_then(|r| self.add_record(r)) {
                self.error = Some(e);
                self.truncate(before);
                return;
            }
        }
    }

    fn add_record(&mut self, rec: shm_ring::RecordView<'_>) -> Result<(), shm_ring::Error> {
        let r = self.records;
        for (i, f) in rec.fields().enumerate() {
            let f = f?;
            let name = match &f {
                shm_ring::FieldRef::Array(a) => a.name,
                shm_ring::FieldRef::Meta(n, _) => *n,
            };
            let c = match self.cols.get(i).filter(|c| c.name == name) {
                Some(_) => i,
                None => match self.cols.iter().position(|c| c.name == name) {
                    Some(c) => c,
                    None => self.new_column(name, &f),
                },
            };
            let g = &mut self.cols[c];
            if g.rows != r {
                return Err(shm_ring::Error::Corrupt(format!(
                    "field {name:?} twice in one record"
                )));
            }
            push(g, f)?;
            g.rows += 1;
        }
        self.records += 1;
        for g in &mut self.cols {
            if g.rows == r {
                missing(g);
                g.rows += 1;
            }
        }
        Ok(())
    }

    /// A new column for a field first seen in record `self.records` (earlier records lack it).
    fn new_column(&mut self, name: &str, f: &shm_ring::FieldRef<'_>) -> usize {
        let r = self.records;
        let col = match f {
            shm_ring::FieldRef::Meta(..) => Col::Meta(vec![None; r]),
            shm_ring::FieldRef::Array(a) if r == 0 => Col::Stacked {
                dt: a.dtype,
                shape: a.shape.to_vec(),
                bytes: Bytes::default(),
            },
            shm_ring::FieldRef::Array(_) => Col::Ragged(vec![None; r]),
        };
        self.cols.push(Gathered {
            name: name.to_owned(),
            col,
            rows: r,
        });
        self.cols.len() - 1
    }

    fn truncate(&mut self, (records, rows): (usize, Vec<usize>)) {
        self.records = records;
        self.cols.truncate(rows.len());
        for (g, n) in self.cols.iter_mut().zip(rows) {
            g.rows = n;
            match &mut g.col {
                Col::Stacked { dt, shape, bytes } => {
                    bytes.len = n * shape.iter().product::<usize>() * dt.size();
                    bytes.words.truncate(bytes.len.div_ceil(8));
                }
                Col::Ragged(v) => v.truncate(n),
                Col::Meta(v) => v.truncate(n),
            }
        }
    }

    /// The columns as a `Records` object.
    pub(super) fn into_records(self, py: Python<'_>) -> PyResult<Bound<'_, Records>> {
        if self.records == 0
            && let Some(e) = self.error
        {
            return Err(ring_err(py, e));
        }
        let arrays = PyDict::new(py);
        let meta = PyDict::new(py);
        for g in self.cols {
            match g.col {
                Col::Stacked { dt, shape, bytes } => {
                    let mut full = Vec::with_capacity(shape.len() + 1);
                    full.push(self.records);
                    full.extend_from_slice(&shape);
                    arrays.set_item(g.name, owned_array(py, dt, &full, bytes)?)?;
                }
                Col::Ragged(v) => {
                    let list = PyList::empty(py);
                    for e in v {
                        match e {
                            None => list.append(py.None())?,
                            Some((dt, shape, b)) => list.append(owned_array(py, dt, &shape, b)?)?,
                        }
                    }
                    arrays.set_item(g.name, list)?;
                }
                Col::Meta(v) => {
                    let list = PyList::empty(py);
                    for e in v {
                        match e {
                            None => list.append(py.None())?,
                            Some(Meta::I(x)) => list.append(x)?,
                            Some(Meta::F(x)) => list.append(x)?,
                            Some(Meta::S(s)) => list.append(s)?,
                        }
                    }
                    meta.set_item(g.name, list)?;
                }
            }
        }
        Bound::new(
            py,
            Records {
                n: self.records,
                arrays: arrays.unbind(),
                meta: meta.unbind(),
            },
        )
    }
}

/// A numpy array of `dt` x `shape` whose memory is `bytes` (moved into its base object).
fn owned_array<'py>(
    py: Python<'py>,
    dt: DType,
    shape: &[usize],
    bytes: Bytes,
) -> PyResult<Bound<'py, PyAny>> {
    let owner = Bound::new(py, Buffer { bytes })?;
    let words = &owner.get().bytes.words;
    let ptr = if words.is_empty() {
        std::ptr::NonNull::<u64>::dangling().as_ptr().cast::<u8>()
    } else {
        words.as_ptr().cast::<u8>().cast_mut()
    };
    // SAFETY: `owner` (the array's base) holds the bytes: heap memory that never moves (the
    // Buffer is frozen), 8-aligned, `shape` x `dt` long (gathered rows of that dtype and
    // shape); a bool array's bytes were checked to be 0/1; only this array reaches them.
    unsafe { view::view(py, dt, shape, ptr, owner.into_any(), true) }
}

/// Appends field `f` (of the column's next record) to `g`.
fn push(g: &mut Gathered, f: shm_ring::FieldRef<'_>) -> Result<(), shm_ring::Error> {
    match f {
        shm_ring::FieldRef::Meta(_, v) => {
            let m = match v {
                MetaValue::I64(x) => Meta::I(x),
                MetaValue::F64(x) => Meta::F(x),
                MetaValue::Str(s) => Meta::S(s.into_owned()),
            };
            match &mut g.col {
                Col::Meta(v) => v.push(Some(m)),
                _ => {
                    return Err(shm_ring::Error::Corrupt(format!(
                        "field {:?} is an array in one record and metadata in another",
                        g.name
                    )));
                }
            }
        }
        shm_ring::FieldRef::Array(a) => {
            if a.dtype == DType::Bool && a.bytes.iter().any(|&b| b > 1) {
                return Err(shm_ring::Error::Corrupt(format!(
                    "array {:?}: a byte other than 0/1 in a bool array",
                    a.name
                )));
            }
            if let Col::Stacked { dt, shape, .. } = &g.col
                && (*dt != a.dtype || shape[..] != a.shape[..])
            {
                g.col = std::mem::replace(&mut g.col, Col::Meta(Vec::new())).ragged(g.rows);
            }
            match &mut g.col {
                Col::Stacked { bytes, .. } => bytes.extend(a.bytes),
                Col::Ragged(v) => v.push(Some((a.dtype, a.shape.to_vec(), Bytes::of(a.bytes)))),
                Col::Meta(_) => {
                    return Err(shm_ring::Error::Corrupt(format!(
                        "field {:?} is metadata in one record and an array in another",
                        g.name
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Marks the column's next record as lacking the field.
fn missing(g: &mut Gathered) {
    if matches!(g.col, Col::Stacked { .. }) {
        g.col = std::mem::replace(&mut g.col, Col::Meta(Vec::new())).ragged(g.rows);
    }
    match &mut g.col {
        Col::Ragged(v) => v.push(None),
        Col::Meta(v) => v.push(None),
        Col::Stacked { .. } => unreachable!("made ragged above"),
    }
}

/// Reads every message that is there (waiting up to `t` for the first), up to `max_records`
/// messages, in place, into columns.
pub(super) fn gather(
    rx: &mut shm_ring::Receiver,
    max_records: usize,
    t: Duration,
) -> Result<Columns, shm_ring::Error> {
    let mut cols = Columns::default();
    match rx.recv_batch(max_records.max(1), Some(t), |v| cols.add(v)) {
        Ok(_) => {}
        Err(e) if cols.records > 0 => cols.error = Some(e),
        Err(e) => return Err(e),
    }
    if cols.records == 0
        && let Some(e) = cols.error.take()
    {
        return Err(e);
    }
    Ok(cols)
}

/// A batch of received records, as columns: `records["x"]` stacks every record's `x` along a
/// new first axis (a list, with `None` for records without it, when they differ in dtype or
/// shape); `records.meta["id"]` lists every record's `id`. The arrays are private copies.
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen, mapping)]
pub struct Records {
    n: usize,
    /// name -> stacked array (or list of arrays).
    #[pyo3(get)]
    arrays: Py<PyDict>,
    /// name -> list of values.
    #[pyo3(get)]
    meta: Py<PyDict>,
}

#[pymethods]
impl Records {
    fn __len__(&self) -> usize {
        self.n
    }
    fn __getitem__<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        if let Some(v) = self.arrays.bind(py).get_item(key)? {
            return Ok(v);
        }
        match self.meta.bind(py).get_item(key)? {
            Some(v) => Ok(v),
            None => Err(pyo3::exceptions::PyKeyError::new_err(key.to_owned())),
        }
    }
    fn __contains__(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        Ok(self.arrays.bind(py).contains(key)? || self.meta.bind(py).contains(key)?)
    }
    /// Column names (arrays, then metadata).
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let k = self.arrays.bind(py).keys();
        for m in self.meta.bind(py).keys() {
            k.append(m)?;
        }
        Ok(k)
    }
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.keys(py)?.as_any().try_iter().map(Bound::into_any)
    }
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Records({} records, columns {})",
            self.n,
            self.keys(py)?.repr()?
        ))
    }
}
