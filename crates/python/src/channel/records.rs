//! `Receiver.recv_many`: every record that is there, as columns.
//!
//! The receiver reads a burst of messages in place (`Receiver::recv_batch`: released together,
//! one index store) and copies their records into columns: one numpy object per column for a
//! whole batch, and no pool block held by it.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use shm_ring::{DType, MessageView, MetaValue};

use super::errors::ring_err;
use super::view;

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
            if let Err(e) = rec
                .map_err(shm_ring::Error::from)
                .and_then(|r| self.add_record(r))
            {
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

/// Reads the messages that are there (waiting up to `t` for the first) until about
/// `max_records` records, in place, into columns: whole messages, so the last one may go
/// over. shm-ring bounds a burst in messages: the first burst is one message, each next one
/// as many messages as the records left allow at the largest message seen so far.
pub(super) fn gather(
    rx: &mut shm_ring::Receiver,
    max_records: usize,
    t: Duration,
) -> Result<Columns, shm_ring::Error> {
    let mut cols = Columns::default();
    let mut first = true;
    let mut burst = 1;
    let mut largest = 1;
    loop {
        let wait = if first { t } else { Duration::ZERO };
        let r = rx.recv_batch(burst, Some(wait), |v| {
            let before = cols.records;
            cols.add(v);
            largest = largest.max(cols.records - before);
        });
        match r {
            Ok(_) => {}
            // Nothing more there after the first burst.
            Err(shm_ring::RecvTimeoutError::Timeout) if !first => break,
            Err(e) if cols.records > 0 || !first => {
                cols.error = Some(e.into());
                break;
            }
            Err(e) => return Err(e.into()),
        }
        if cols.error.is_some() || cols.records >= max_records.max(1) {
            break;
        }
        burst = ((max_records - cols.records) / largest).max(1);
        first = false;
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
