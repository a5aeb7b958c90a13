//! `Sender` / `Receiver` / `Message`: shm-ring channels for numpy arrays.
//!
//! Blocking calls release the GIL and wait in slices of [`SLICE`], checking for signals
//! (Ctrl-C) between slices. Received arrays are numpy views whose base object is a [`Lease`]
//! holding the shm-ring message: its pool blocks go back to the sender when the last view (or
//! anything built on one, e.g. a torch tensor) is garbage.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use shm_ring::{ChannelConfig, DType, MessageBuilder, MetaValue, Transfer};

use crate::dtype;
use crate::errors::{Disconnected, PoolExhausted, ring_err};

mod message;
mod outgoing;

pub use message::Message;
use outgoing::{AnyLoan, Part, build_borrowed, build_owned, meta_value, numpy, take_loan};

/// How long a blocked call waits with the GIL released before it checks for signals.
pub const SLICE: Duration = Duration::from_millis(50);
/// Tag of the first message of a channel created from Python: the pool geometry, which lets
/// the receiver name the pool size when it holds every block.
const HELLO_TAG: u32 = 0x5348_4C4F;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn closed() -> PyErr {
    PyValueError::new_err("the channel end is closed")
}

use crate::timeout::deadline;

/// The next wait slice before `deadline`; `None` once it has passed.
fn slice(deadline: Option<Instant>) -> Option<Duration> {
    match deadline {
        None => Some(SLICE),
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| left.min(SLICE))
        }
    }
}

/// A pool block loaned to Python code (the base object of the array `Sender.loan` returns).
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen)]
pub struct Loan {
    inner: Mutex<Option<AnyLoan>>,
    ptr: usize,
    nbytes: usize,
    /// Keeps the sender (and with it the mapping of the block) alive while arrays view it.
    _sender: Py<Sender>,
}

/// The producer end of a channel.
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen)]
pub struct Sender {
    inner: Mutex<Option<shm_ring::Sender>>,
    cfg: ChannelConfig,
    fd: Option<RawFd>,
    /// Live `Loan` objects: numpy arrays may point into the pool, so the mapping stays until
    /// the last one is gone (a sent loan no longer holds the segment itself).
    live_loans: AtomicUsize,
    /// `close()` was called while loans were alive: the last one closes the channel.
    closing: std::sync::atomic::AtomicBool,
    /// After a close with live loan arrays: a one-byte loan whose token holds the segment
    /// mapped (the arrays stay readable) while the channel itself is already closed.
    keepalive: Mutex<Option<AnyLoan>>,
}

impl Drop for Loan {
    fn drop(&mut self) {
        let s = self._sender.get();
        if s.live_loans.fetch_sub(1, Ordering::SeqCst) == 1 && s.closing.load(Ordering::SeqCst) {
            lock(&s.inner).take();
            lock(&s.keepalive).take();
        }
    }
}

fn config(slots: u32, blocks: u32, block_size: usize, threshold: Option<usize>) -> ChannelConfig {
    let mut cfg = ChannelConfig {
        slots,
        blocks,
        block_size,
        ..ChannelConfig::default()
    };
    if let Some(t) = threshold {
        cfg.transfer = Transfer::Adaptive { threshold: t };
    }
    cfg
}

impl Sender {
    fn new(mut tx: shm_ring::Sender, cfg: ChannelConfig, anonymous: bool) -> PyResult<Sender> {
        let hello = MessageBuilder::new()
            .tag(HELLO_TAG)
            .meta_i64("blocks", i64::from(cfg.blocks))
            .meta_i64("block_size", cfg.block_size as i64);
        tx.try_send(hello).map_err(|e| ring_err(e.into()))?;
        let fd = anonymous.then(|| tx.segment().file().as_raw_fd());
        Ok(Sender {
            inner: Mutex::new(Some(tx)),
            cfg,
            fd,
            live_loans: AtomicUsize::new(0),
            closing: std::sync::atomic::AtomicBool::new(false),
            keepalive: Mutex::new(None),
        })
    }

    /// Runs `f` on the sender with the GIL released.
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut shm_ring::Sender) -> Result<R, shm_ring::Error> + Send,
    ) -> PyResult<R> {
        py.detach(|| {
            let mut g = lock(&self.inner);
            let tx = self.open_end(&mut g)?;
            f(tx).map_err(ring_err)
        })
    }

    /// The sender, unless `close()` was called.
    fn open_end<'g>(
        &self,
        g: &'g mut std::sync::MutexGuard<'_, Option<shm_ring::Sender>>,
    ) -> PyResult<&'g mut shm_ring::Sender> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(closed());
        }
        g.as_mut().ok_or_else(closed)
    }
}

#[pymethods]
impl Sender {
    /// Creates the named channel `name`, served by a socket (see `Sender.create` in `shmpipe`).
    #[staticmethod]
    #[pyo3(signature = (name, slots=1024, blocks=16, block_size=1 << 20, threshold=None))]
    fn create(
        py: Python<'_>,
        name: &str,
        slots: u32,
        blocks: u32,
        block_size: usize,
        threshold: Option<usize>,
    ) -> PyResult<Sender> {
        let cfg = config(slots, blocks, block_size, threshold);
        let tx = py
            .detach(|| shm_ring::Sender::create(name, &cfg))
            .map_err(ring_err)?;
        Sender::new(tx, cfg, false)
    }

    /// Creates an anonymous channel (memfd); `fileno()` is the descriptor to give a child.
    #[staticmethod]
    #[pyo3(signature = (slots=1024, blocks=16, block_size=1 << 20, threshold=None))]
    fn anonymous(
        py: Python<'_>,
        slots: u32,
        blocks: u32,
        block_size: usize,
        threshold: Option<usize>,
    ) -> PyResult<Sender> {
        let cfg = config(slots, blocks, block_size, threshold);
        let tx = py
            .detach(|| shm_ring::Sender::anonymous(&cfg))
            .map_err(ring_err)?;
        Sender::new(tx, cfg, true)
    }

    /// The memfd of an anonymous channel (owned by the sender: dup it to keep it).
    fn fileno(&self) -> PyResult<RawFd> {
        self.fd.ok_or_else(|| {
            PyValueError::new_err("a named channel has no descriptor: open it by name")
        })
    }

    /// The channel's name (`None` if anonymous).
    #[getter]
    fn name(&self) -> Option<String> {
        lock(&self.inner)
            .as_ref()
            .and_then(|t| t.name().map(str::to_owned))
    }

    /// Number of pool blocks.
    #[getter]
    fn blocks(&self) -> u32 {
        self.cfg.blocks
    }

    /// Bytes per pool block (the largest zero-copy array).
    #[getter]
    fn block_size(&self) -> usize {
        self.cfg.block_size
    }

    /// Pool blocks free right now.
    fn free_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |tx| tx.free_blocks())
    }

    /// (messages, zero_copy_arrays, copied_arrays, array_bytes) sent so far.
    fn stats(&self) -> PyResult<(u64, u64, u64, u64)> {
        let g = lock(&self.inner);
        let s = g.as_ref().ok_or_else(closed)?.stats();
        Ok((
            s.messages,
            s.zero_copy_arrays,
            s.copied_arrays,
            s.array_bytes,
        ))
    }

    /// Waits up to `timeout` seconds for a consumer to attach; returns its pid.
    fn wait_for_consumer(&self, py: Python<'_>, timeout: f64) -> PyResult<u32> {
        let end = deadline(Some(timeout))?;
        loop {
            let Some(s) = slice(end) else {
                return Err(ring_err(shm_ring::Error::Timeout));
            };
            match self.with(py, |tx| tx.wait_for_consumer(s)) {
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyTimeoutError>(py) => {
                    py.check_signals()?
                }
                r => return r,
            }
        }
    }

    /// A writable array of `shape` and `dtype` inside a pool block (see `shmpipe.Sender.loan`).
    #[pyo3(signature = (shape, dtype, timeout=None))]
    fn loan<'py>(
        slf: &Bound<'py, Self>,
        shape: Vec<usize>,
        dtype: &Bound<'py, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let dt = dtype::from_py(py, dtype)?;
        let end = deadline(timeout)?;
        let this = slf.get();
        let (loan, ptr, nbytes) = loop {
            let Some(s) = slice(end) else {
                return Err(ring_err(shm_ring::Error::Timeout));
            };
            let r = py.detach(|| {
                let mut g = lock(&this.inner);
                let tx = this.open_end(&mut g)?;
                AnyLoan::new(tx, dt, &shape, s)
                    .map(|(l, p, n)| (l, p as usize, n))
                    .map_err(ring_err)
            });
            match r {
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyTimeoutError>(py) => {
                    py.check_signals()?
                }
                r => break r?,
            }
        };
        this.live_loans.fetch_add(1, Ordering::SeqCst);
        let owner = Bound::new(
            py,
            Loan {
                inner: Mutex::new(Some(loan)),
                ptr,
                nbytes,
                _sender: slf.clone().unbind(),
            },
        )?;
        // SAFETY: the block stays mapped while `owner` lives (it holds the sender, which holds
        // the segment); the block is this loan's alone until sent.
        let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, nbytes) };
        // SAFETY: as above; the block is writable shared memory.
        unsafe { dtype::array_over(py, dt, &shape, bytes, owner.into_any(), true) }
    }

    /// Sends `arrays` (name -> numpy array) and `meta` (name -> int/float/str) as one message.
    #[pyo3(signature = (arrays, meta=None, timeout=None))]
    fn send(
        &self,
        py: Python<'_>,
        arrays: &Bound<'_, PyDict>,
        meta: Option<&Bound<'_, PyDict>>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        // Keeps every array alive while its bytes are borrowed below (the caller's dict may
        // change while the GIL is released).
        let mut keep: Vec<Bound<'_, PyAny>> = Vec::with_capacity(arrays.len());
        let mut parts: Vec<(String, Part)> = Vec::with_capacity(arrays.len());
        for (k, v) in arrays.iter() {
            let name: String = k.extract()?;
            let arr = if v.cast::<PyUntypedArray>().is_ok() {
                v
            } else {
                numpy(py)?.call_method1("asarray", (v,))?
            };
            // A loaned array handed back whole: zero-copy.
            if let Some(taken) = take_loan(&arr, &name)? {
                parts.push((name, Part::Loan(taken)));
                continue;
            }
            let arr = match arr.cast::<PyUntypedArray>() {
                Ok(a) if a.is_c_contiguous() => arr,
                _ => numpy(py)?.call_method1("ascontiguousarray", (&arr,))?,
            };
            let a = arr.cast::<PyUntypedArray>()?;
            // SAFETY: `arr` is kept in `keep` until the message is sent.
            let (dt, shape, bytes) = unsafe { dtype::raw_parts(a)? };
            // SAFETY: the 'static lifetime never escapes this call (see `keep`).
            let bytes: &'static [u8] =
                unsafe { std::mem::transmute::<&[u8], &'static [u8]>(bytes) };
            keep.push(arr);
            parts.push((name, Part::Raw { dt, shape, bytes }));
        }
        let mut metas = Vec::new();
        if let Some(m) = meta {
            for (k, v) in m.iter() {
                metas.push((k.extract::<String>()?, meta_value(&v)?));
            }
        }
        let end = deadline(timeout)?;
        if parts.iter().any(|(_, p)| matches!(p, Part::Loan(_))) {
            // A message with loans cannot be retried (a failed send returns its blocks), so it
            // waits for ring space in one call.
            let b = build_owned(parts, &metas).map_err(ring_err)?;
            return match end {
                None => self.with(py, move |tx| tx.send(b)),
                Some(d) => self.with(py, move |tx| {
                    tx.send_timeout(b, d.saturating_duration_since(Instant::now()))
                }),
            };
        }
        // Fast path: room in the ring and pool right now, sent without releasing the GIL. The
        // builder borrows names, shapes and bytes, so a retry rebuilds it for nothing.
        let b = build_borrowed(&parts, &metas).map_err(ring_err)?;
        match self.open_end(&mut lock(&self.inner))?.try_send(b) {
            Err(shm_ring::TrySendError::Full(_)) => {}
            r => return r.map_err(|e| ring_err(e.into())),
        }
        loop {
            let Some(s) = slice(end) else {
                return Err(ring_err(shm_ring::Error::Timeout));
            };
            let b = build_borrowed(&parts, &metas).map_err(ring_err)?;
            match self.with(py, move |tx| tx.send_timeout(b, s)) {
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyTimeoutError>(py) => {
                    py.check_signals()?
                }
                r => {
                    drop(keep);
                    return r;
                }
            }
        }
    }

    /// Closes the channel: the receiver drains what was sent, then gets `Disconnected`.
    ///
    /// Arrays from `loan` that are still alive (sent or not) stay readable: a one-byte loan
    /// keeps the pool mapped until the last of them is garbage. If no block is free for it,
    /// the stream ends at once and the sender's mapping is kept until that moment.
    fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let mut g = lock(&self.inner);
        if self.live_loans.load(Ordering::SeqCst) > 0 {
            let Some(tx) = g.as_mut() else { return };
            match AnyLoan::new(tx, DType::U8, &[1], Duration::ZERO) {
                Ok((keep, _, _)) => *lock(&self.keepalive) = Some(keep),
                Err(_) => {
                    // No block free for the keep-alive loan: end the stream now (the
                    // receiver drains, then sees the close) and keep the Sender, mapping and
                    // all, until the last loan array is gone (`Loan::drop`).
                    tx.shutdown();
                    return;
                }
            }
        }
        g.take();
    }
}

/// What keeps a received message (and its pool blocks) alive: the base object of its arrays.
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen, weakref)]
pub struct Lease {
    msg: shm_ring::Message,
    held: Arc<AtomicUsize>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.held
            .fetch_sub(self.msg.leased_blocks(), Ordering::Relaxed);
    }
}

#[pymethods]
impl Lease {
    /// Pool blocks held by this message.
    #[getter]
    fn blocks(&self) -> usize {
        self.msg.leased_blocks()
    }
}

/// The consumer end of a channel.
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen)]
pub struct Receiver {
    inner: Mutex<Option<shm_ring::Receiver>>,
    /// Pool blocks held by live messages of this receiver.
    held: Arc<AtomicUsize>,
    /// (blocks, block_size) of the sender's pool, from its hello message.
    pool: Mutex<Option<(u64, u64)>>,
}

impl Receiver {
    fn new(rx: shm_ring::Receiver) -> Receiver {
        Receiver {
            inner: Mutex::new(Some(rx)),
            held: Arc::new(AtomicUsize::new(0)),
            pool: Mutex::new(None),
        }
    }

    /// Records the pool geometry announced by the sender's first message.
    fn hello(&self, m: &shm_ring::Message) -> PyResult<()> {
        let rec = m.record(0).map_err(ring_err)?;
        let b = rec.meta_i64("blocks").unwrap_or(0).max(0) as u64;
        let sz = rec.meta_i64("block_size").unwrap_or(0).max(0) as u64;
        *lock(&self.pool) = Some((b, sz));
        Ok(())
    }

    fn hoarding(&self) -> Option<PyErr> {
        let held = self.held.load(Ordering::Relaxed) as u64;
        let (blocks, size) = (*lock(&self.pool))?;
        (held > 0 && held >= blocks).then(|| {
            PoolExhausted::new_err(format!(
                "this receiver holds all {blocks} blocks ({size} bytes each) of the sender's pool in \
                 live arrays (messages kept, or arrays/tensors made from them), so the sender cannot \
                 send another zero-copy array. Drop old messages (copy what you keep: arr.copy()), \
                 or create the channel with more blocks: Sender.create(name, blocks=N)"
            ))
        })
    }

    /// Waits for the next message (skipping the hello), with signal checks between slices.
    fn next_msg(
        &self,
        py: Python<'_>,
        end: Option<Instant>,
    ) -> PyResult<Option<shm_ring::Message>> {
        // Fast path: a message already waiting is taken without releasing the GIL.
        let first = lock(&self.inner).as_mut().ok_or_else(closed)?.try_recv();
        match first {
            Ok(Some(m)) if m.tag() != HELLO_TAG => return Ok(Some(m)),
            Ok(Some(m)) => self.hello(&m)?,
            Ok(None) => {}
            Err(e) => return Err(ring_err(e)),
        }
        loop {
            let s = slice(end);
            let r = py.detach(|| {
                let mut g = lock(&self.inner);
                let rx = g.as_mut().ok_or_else(closed)?;
                Ok::<_, PyErr>(match s {
                    Some(s) => rx.recv_timeout(s),
                    None => rx
                        .try_recv()
                        .and_then(|m| m.ok_or(shm_ring::Error::Timeout)),
                })
            })?;
            match r {
                Ok(m) if m.tag() == HELLO_TAG => self.hello(&m)?,
                Ok(m) => return Ok(Some(m)),
                Err(shm_ring::Error::Timeout) => {
                    py.check_signals()?;
                    if let Some(e) = self.hoarding() {
                        return Err(e);
                    }
                    if s.is_none() || end.is_some_and(|d| Instant::now() >= d) {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(ring_err(e)),
            }
        }
    }

    fn wrap<'py>(&self, py: Python<'py>, msg: shm_ring::Message) -> PyResult<Bound<'py, Message>> {
        self.held.fetch_add(msg.leased_blocks(), Ordering::Relaxed);
        let lease = Bound::new(
            py,
            Lease {
                msg,
                held: Arc::clone(&self.held),
            },
        )?;
        let l = lease.get();
        let view = l.msg.view();
        let mut records = Vec::with_capacity(1);
        for rec in view.records() {
            let rec = rec.map_err(ring_err)?;
            let arrays = PyDict::new(py);
            let meta = PyDict::new(py);
            for f in rec.fields() {
                match f.map_err(ring_err)? {
                    shm_ring::FieldRef::Array(a) => {
                        // SAFETY: the bytes live in the message (its heap body or its leased
                        // pool blocks), which `lease` owns and never moves; the sender does not
                        // touch a leased block until the lease returns it, so writes are ours.
                        let arr = unsafe {
                            dtype::array_over(
                                py,
                                a.dtype,
                                &a.shape,
                                a.bytes,
                                lease.clone().into_any(),
                                true,
                            )?
                        };
                        arrays.set_item(a.name, arr)?;
                    }
                    shm_ring::FieldRef::Meta(n, v) => match v {
                        MetaValue::I64(x) => meta.set_item(n, x)?,
                        MetaValue::F64(x) => meta.set_item(n, x)?,
                        MetaValue::Str(s) => meta.set_item(n, s.as_ref())?,
                    },
                }
            }
            records.push((arrays, meta));
        }
        let tag = view.tag();
        // One record (every message sent from Python): the message is that record.
        let mut m = match records.len() {
            0 => Message::new(PyDict::new(py), PyDict::new(py), None),
            1 => {
                let (a, m) = records.pop().expect("one record");
                Message::new(a, m, None)
            }
            _ => {
                let (a, m) = (records[0].0.clone(), records[0].1.clone());
                let list = PyList::empty(py);
                for (a, m) in records {
                    list.append(Bound::new(py, Message::new(a, m, None))?)?;
                }
                Message::new(a, m, Some(list.unbind()))
            }
        };
        m.tag = tag;
        Bound::new(py, m)
    }
}

#[pymethods]
impl Receiver {
    /// Opens channel `name`, retrying up to `timeout` seconds while it does not exist yet.
    #[staticmethod]
    #[pyo3(signature = (name, timeout=0.0))]
    fn open(py: Python<'_>, name: &str, timeout: f64) -> PyResult<Receiver> {
        let end = deadline(Some(timeout))?;
        loop {
            match py.detach(|| shm_ring::Receiver::open(name)) {
                Ok(rx) => return Ok(Receiver::new(rx)),
                Err(shm_ring::Error::NotFound(_) | shm_ring::Error::NotASegment(_))
                    if end.is_none_or(|e| Instant::now() < e) =>
                {
                    py.check_signals()?;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(ring_err(e)),
            }
        }
    }

    /// Opens an anonymous channel from its memfd (the receiver takes ownership of `fd`).
    #[staticmethod]
    fn from_fd(fd: RawFd) -> PyResult<Receiver> {
        if fd < 0 {
            return Err(PyValueError::new_err("bad file descriptor"));
        }
        // SAFETY: the caller hands over ownership of an open descriptor (documented).
        let file = unsafe { File::from_raw_fd(fd) };
        shm_ring::Receiver::from_file(file)
            .map(Receiver::new)
            .map_err(ring_err)
    }

    /// The next message; `timeout` in seconds (None: wait as long as it takes).
    #[pyo3(signature = (timeout=None))]
    fn recv<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, Message>> {
        match self.next_msg(py, deadline(timeout)?)? {
            Some(m) => self.wrap(py, m),
            None => Err(ring_err(shm_ring::Error::Timeout)),
        }
    }

    /// A message if one is there, else None.
    fn try_recv<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, Message>>> {
        match self.next_msg(py, Some(Instant::now()))? {
            Some(m) => Ok(Some(self.wrap(py, m)?)),
            None => Ok(None),
        }
    }

    /// Pool blocks held by live messages of this receiver.
    #[getter]
    fn held_blocks(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Pid of the producer process.
    #[getter]
    fn producer_pid(&self) -> PyResult<u32> {
        lock(&self.inner)
            .as_ref()
            .map(|r| r.producer_pid())
            .ok_or_else(closed)
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, Message>>> {
        match self.next_msg(py, None) {
            Ok(Some(m)) => Ok(Some(self.wrap(py, m)?)),
            Ok(None) => Ok(None),
            Err(e) if e.is_instance_of::<Disconnected>(py) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Closes the receiver (arrays already received stay valid).
    fn close(&self) {
        lock(&self.inner).take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_cut_into_slices_that_end_at_the_deadline() {
        assert_eq!(slice(None), Some(SLICE));
        assert_eq!(slice(Some(Instant::now() - Duration::from_millis(1))), None);
        let s = slice(Some(Instant::now() + Duration::from_millis(10))).unwrap();
        assert!(s <= Duration::from_millis(10) && s > Duration::ZERO);
        let s = slice(Some(Instant::now() + Duration::from_secs(10))).unwrap();
        assert_eq!(s, SLICE);
    }
}
