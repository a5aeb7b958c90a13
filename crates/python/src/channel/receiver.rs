//! `Receiver`: the consumer end of a channel, and `Lease`, what keeps a received message (and
//! its pool blocks) alive under the numpy views of its arrays.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use shm_ring::MetaValue;

use super::errors::{from_fd_err, no_message, ring_err};
use super::message::Message;
use super::{closed, deadline, lock, records, slice, view};
use crate::exceptions::{Disconnected, PoolExhausted};

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

/// The consumer end of a channel: receives the messages of one `Sender`, whose arrays are
/// numpy views of shared memory (no copy).
///
/// Open it with `Receiver.open(name, timeout=...)` or `Receiver.from_fd(fd)`; read with
/// `recv()`, `try_recv()`, `recv_many()` (many small records as columns) or by iterating
/// (until the sender closes). A received array holds its pool block until its last view is
/// gone: keep only what you need, or copy it. `with Receiver.open(...) as rx:` closes it at
/// the end. Every `timeout=` is in seconds, `None` waiting as long as it takes (see
/// `help(shmpipe)`, "Timeouts"). A signal handler that raises (Ctrl-C) during a receive
/// loses nothing: what the receive had taken comes from the next receive of its kind.
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen)]
pub struct Receiver {
    /// The channel; `None` after `close()`.
    inner: Mutex<Option<shm_ring::Receiver>>,
    /// Pool blocks held by live messages of this receiver.
    held: Arc<AtomicUsize>,
    /// (blocks, block_size) of the sender's pool, read from the channel at open.
    pool: (u32, usize),
    /// A message taken by `recv` / `try_recv` / iteration as a signal handler raised: the
    /// next of them hands it over first.
    kept_message: Mutex<Option<Py<Message>>>,
    /// Records taken by `recv_many` as a signal handler raised: the next `recv_many` hands
    /// them over first.
    kept_records: Mutex<Option<Py<records::Records>>>,
}

/// `got`, unless a signal handler raises now: then `got` waits in `kept` for the next call,
/// and the handler's exception is raised.
///
/// Signals are checked here, after the take and its conversion, because a signal that came
/// during the wait would otherwise have its Python handler run right after the return: the
/// exception would drop what was taken (and a caller whose bookkeeping expects it would
/// wait for it for ever). Only a signal in the few instructions after this check can still
/// interrupt the caller before it holds the value, as after any Python call.
fn hand_over<'py, T>(
    py: Python<'py>,
    got: Bound<'py, T>,
    kept: &Mutex<Option<Py<T>>>,
) -> PyResult<Bound<'py, T>> {
    if let Err(e) = py.check_signals() {
        *lock(kept) = Some(got.unbind());
        return Err(e);
    }
    Ok(got)
}

/// What one wait slice of a receive got.
enum Got<T> {
    Value(T),
    Closed,
    Failed(shm_ring::Error),
}

impl Receiver {
    fn new(rx: shm_ring::Receiver) -> Receiver {
        let pool = rx.pool_geometry();
        Receiver {
            inner: Mutex::new(Some(rx)),
            held: Arc::new(AtomicUsize::new(0)),
            pool,
            kept_message: Mutex::new(None),
            kept_records: Mutex::new(None),
        }
    }

    /// The kept message if there is one, else the next one (waiting until `end`), as a
    /// Python `Message` handed over through [`hand_over`]; `Ok(None)` at `end`.
    fn next_message<'py>(
        &self,
        py: Python<'py>,
        end: Option<Instant>,
    ) -> PyResult<Option<Bound<'py, Message>>> {
        // Taken in a statement of its own: the lock is not held while waiting.
        let kept = lock(&self.kept_message).take();
        let got = match kept {
            Some(m) => m.into_bound(py),
            None => match self.next_msg(py, end)? {
                Some(m) => self.wrap(py, m)?,
                None => return Ok(None),
            },
        };
        hand_over(py, got, &self.kept_message).map(Some)
    }

    /// `PoolExhausted` when messages alive in this process hold every block of the pool.
    fn hoarding(&self) -> PyResult<()> {
        let held = self.held.load(Ordering::Relaxed);
        let (blocks, size) = self.pool;
        if held > 0 && held >= blocks as usize {
            return Err(PoolExhausted::new_err(format!(
                "this receiver holds all {blocks} blocks ({size} bytes each) of the sender's pool \
                 in live arrays (messages kept, or arrays/tensors made from them), so the sender \
                 cannot send another zero-copy array. Drop old messages (copy what you keep: \
                 arr.copy()), or create the channel with more blocks: Sender.create(name, \
                 blocks=N)"
            )));
        }
        Ok(())
    }

    /// Runs `f` (given the receiver and a timeout) once with the GIL held and no wait, then,
    /// if it timed out, in slices with the GIL released until `end`, checking for signals and
    /// hoarding between slices. `Ok(None)` at `end`.
    pub(super) fn receive<R: Send>(
        &self,
        py: Python<'_>,
        end: Option<Instant>,
        mut f: impl FnMut(&mut shm_ring::Receiver, Duration) -> Result<R, shm_ring::Error> + Send,
    ) -> PyResult<Option<R>> {
        // Another thread waiting in a slice holds the receiver: no fast path then.
        if let Ok(mut g) = self.inner.try_lock() {
            match g.as_mut() {
                None => return Err(closed()),
                Some(rx) => match f(rx, Duration::ZERO) {
                    Ok(v) => return Ok(Some(v)),
                    Err(shm_ring::Error::Timeout | shm_ring::Error::Empty) => {}
                    Err(e) => return Err(ring_err(py, e)),
                },
            }
        }
        loop {
            let Some(s) = slice(end) else {
                return Ok(None);
            };
            let r = py.detach(|| match lock(&self.inner).as_mut() {
                None => Got::Closed,
                Some(rx) => f(rx, s).map_or_else(Got::Failed, Got::Value),
            });
            match r {
                Got::Value(v) => return Ok(Some(v)),
                Got::Closed => return Err(closed()),
                Got::Failed(shm_ring::Error::Timeout | shm_ring::Error::Empty) => {
                    py.check_signals()?;
                    self.hoarding()?;
                }
                Got::Failed(e) => return Err(ring_err(py, e)),
            }
        }
    }

    fn next_msg(
        &self,
        py: Python<'_>,
        end: Option<Instant>,
    ) -> PyResult<Option<shm_ring::Message>> {
        self.receive(py, end, |rx, t| {
            if t.is_zero() {
                rx.try_recv().map_err(shm_ring::Error::from)
            } else {
                rx.recv_timeout(t).map_err(shm_ring::Error::from)
            }
        })
    }

    /// The Python `Message` of `msg`. Arrays in pool blocks are views whose base is a `Lease`
    /// of the message; a message with no block (every array copied through the ring) gives
    /// arrays of their own instead (a 16-float copy costs less than a lease object).
    fn wrap<'py>(&self, py: Python<'py>, msg: shm_ring::Message) -> PyResult<Bound<'py, Message>> {
        if msg.leased_blocks() == 0 {
            return message(py, &msg, None);
        }
        self.held.fetch_add(msg.leased_blocks(), Ordering::Relaxed);
        let lease = Bound::new(
            py,
            Lease {
                msg,
                held: Arc::clone(&self.held),
            },
        )?;
        message(py, &lease.get().msg, Some(&lease))
    }
}

/// The `Message` of `msg`: arrays as views with base `lease`, or copies without one.
fn message<'py>(
    py: Python<'py>,
    msg: &shm_ring::Message,
    lease: Option<&Bound<'py, Lease>>,
) -> PyResult<Bound<'py, Message>> {
    let view = msg.view();
    let mut m = if view.len() == 1 {
        let rec = view.record(0).map_err(|e| ring_err(py, e))?;
        let (arrays, meta) = record(py, lease, rec)?;
        Message::new(arrays, meta, None)
    } else {
        let list = PyList::empty(py);
        let mut first = None;
        for rec in view.records() {
            let (a, m) = record(py, lease, rec.map_err(|e| ring_err(py, e))?)?;
            first.get_or_insert_with(|| (a.clone(), m.clone()));
            list.append(Bound::new(py, Message::new(a, m, None))?)?;
        }
        let (a, m) = first.unwrap_or_else(|| (PyDict::new(py), None));
        Message::new(a, m, Some(list.unbind()))
    };
    m.tag = view.tag();
    Bound::new(py, m)
}

/// The arrays and metadata of one record (the metadata dict only if there is metadata):
/// views with base `lease` (the message's owner), or copies if there is none.
fn record<'py>(
    py: Python<'py>,
    lease: Option<&Bound<'py, Lease>>,
    rec: shm_ring::RecordView<'_>,
) -> PyResult<(Bound<'py, PyDict>, Option<Bound<'py, PyDict>>)> {
    let arrays = PyDict::new(py);
    let mut meta: Option<Bound<'py, PyDict>> = None;
    for f in rec.fields() {
        match f.map_err(|e| ring_err(py, e))? {
            shm_ring::FieldRef::Array(a) => {
                let aligned = (a.bytes.as_ptr() as usize).is_multiple_of(a.dtype.size());
                let arr = match lease {
                    // Bytes to check (bool), to align, or no lease: a private copy.
                    Some(lease) if a.dtype != shm_ring::DType::Bool && aligned => {
                        // SAFETY: the bytes live in the message (its private heap body, or
                        // pool blocks leased to it: the sender does not touch them until the
                        // lease returns them), which `lease`, the array's base, owns and
                        // never moves; aligned; any bit pattern is a valid number. Writable:
                        // the block is this message's alone (a hostile producer could still
                        // change the values).
                        unsafe {
                            view::view(
                                py,
                                a.dtype,
                                &a.shape,
                                a.bytes.as_ptr().cast_mut(),
                                lease.clone().into_any(),
                                true,
                            )?
                        }
                    }
                    _ => view::copy(py, a.dtype, &a.shape, a.bytes)?,
                };
                arrays.set_item(a.name, arr)?;
            }
            shm_ring::FieldRef::Meta(n, v) => {
                let m = meta.get_or_insert_with(|| PyDict::new(py));
                match v {
                    MetaValue::I64(x) => m.set_item(n, x)?,
                    MetaValue::F64(x) => m.set_item(n, x)?,
                    MetaValue::Str(s) => m.set_item(n, s.as_ref())?,
                }
            }
        }
    }
    Ok((arrays, meta))
}

#[pymethods]
impl Receiver {
    /// Opens channel `name` (made by `Sender.create(name)`). `timeout`: seconds to wait for
    /// the name to appear (`None`: as long as it takes); the default 0 does not wait, so a
    /// missing name raises `FileNotFoundError` at once.
    #[staticmethod]
    #[pyo3(signature = (name, timeout=0.0))]
    fn open(py: Python<'_>, name: &str, timeout: Option<f64>) -> PyResult<Receiver> {
        let end = deadline(timeout)?;
        loop {
            match py.detach(|| shm_ring::Receiver::<shm_ring::Message>::open(name)) {
                Ok(rx) => return Ok(Receiver::new(rx)),
                Err(shm_ring::OpenError::NotFound(_) | shm_ring::OpenError::NotASegment(_))
                    if end.is_none_or(|e| Instant::now() < e) =>
                {
                    py.check_signals()?;
                    py.detach(|| std::thread::sleep(Duration::from_millis(5)));
                }
                Err(e) => return Err(ring_err(py, e)),
            }
        }
    }

    /// Opens an anonymous channel from its memfd `fd`. The receiver works on its own
    /// duplicate: `fd` stays the caller's (close it when done; `Sender.fileno()` stays the
    /// sender's).
    #[staticmethod]
    fn from_fd(py: Python<'_>, fd: i32) -> PyResult<Receiver> {
        if fd < 0 {
            return Err(PyValueError::new_err(format!("bad file descriptor {fd}")));
        }
        // SAFETY: `fd` is only borrowed for the duplication below, during which this thread
        // holds the GIL; a number that is not an open descriptor makes fcntl fail (EBADF)
        // without touching any object.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let own = rustix::io::fcntl_dupfd_cloexec(borrowed, 0)
            .map_err(|e| PyErr::from(std::io::Error::from(e)))?;
        shm_ring::Receiver::<shm_ring::Message>::from_fd(own)
            .map(Receiver::new)
            .map_err(|e| from_fd_err(py, fd, e))
    }

    /// The next message (a `Message`), waiting up to `timeout` seconds (`None`: as long as it
    /// takes), then `TimeoutError`. Raises `Disconnected` once the sender closed and
    /// everything was received, `PeerDied` if it died, `PoolExhausted` when messages alive in
    /// this process hold every pool block.
    #[pyo3(signature = (timeout=None))]
    fn recv<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, Message>> {
        self.next_message(py, deadline(timeout)?)?
            .ok_or_else(|| no_message(timeout))
    }

    /// A message if one is there, else None.
    fn try_recv<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, Message>>> {
        self.next_message(py, Some(Instant::now()))
    }

    /// Every record that is there, as columns (a `Records`): waits up to `timeout` seconds
    /// for the first message, then takes the messages already there, up to about
    /// `max_records` records (at least 1; whole messages, so the last may go over). The
    /// columns are private copies: a batch holds no pool block.
    #[pyo3(signature = (max_records=65536, timeout=None))]
    fn recv_many<'py>(
        &self,
        py: Python<'py>,
        max_records: usize,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, records::Records>> {
        if max_records == 0 {
            return Err(PyValueError::new_err(
                "max_records=0: at least 1 (the most records one call returns)",
            ));
        }
        let end = deadline(timeout)?;
        let kept = lock(&self.kept_records).take();
        let got = match kept {
            Some(r) => r.into_bound(py),
            None => match self.receive(py, end, |rx, t| records::gather(rx, max_records, t))? {
                Some(c) => c.into_records(py)?,
                None => return Err(no_message(timeout)),
            },
        };
        hand_over(py, got, &self.kept_records)
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
        match self.next_message(py, None) {
            Ok(m) => Ok(m),
            Err(e) if e.is_instance_of::<Disconnected>(py) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Closes the receiver (arrays already received stay valid).
    fn close(&self) {
        lock(&self.inner).take();
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// `close()`; exceptions pass on.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }
}
