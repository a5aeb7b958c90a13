//! `Sender`: the producer end of a channel.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use shm_ring::{ChannelConfig, DType, MessageBuilder, SendTimeoutError, Transfer, TrySendError};

use super::errors::ring_err;
use super::loan::{AnyLoan, Loan};
use super::outgoing::{Outgoing, Part};
use super::{closed, deadline, lock, slice, view};
use crate::dtype;
use crate::exceptions::PoolExhausted;

/// The producer end of a channel: sends dicts of numpy arrays (plus small metadata) to one
/// `Receiver` in another process, arrays of `threshold` bytes and more zero-copy through a
/// pool of `blocks` blocks of `block_size` bytes.
///
/// Make one with `Sender.create(name, ...)` (a named channel, opened with
/// `Receiver.open(name)`) or `Sender.anonymous(...)` / `shmpipe.pipe()` (for a child
/// process). Write into shared memory directly with `loan()`, then `send()`; `send_many()`
/// sends many small records per call. `with Sender.create(...) as tx:` closes it at the end.
/// Every `timeout=` is in seconds, `None` waiting as long as it takes (see `help(shmpipe)`,
/// "Timeouts").
#[derive(Debug)]
#[pyclass(module = "shmpipe._native", frozen)]
pub struct Sender {
    /// The channel; `None` after `close()`.
    inner: Mutex<Option<shm_ring::Sender>>,
    cfg: ChannelConfig,
    anonymous: bool,
    /// Live `Loan` objects (each holds one pool block, sent or not, until its last view is
    /// gone): when they hold every block, waiting for one would be forever.
    live_loans: Arc<AtomicUsize>,
}

/// The channel's configuration; a `ValueError` naming the Python parameter for a value the
/// channel cannot use (checked here, before shm-ring, whose messages speak of its fields).
fn config(
    slots: u32,
    blocks: u32,
    block_size: usize,
    threshold: Option<usize>,
) -> PyResult<ChannelConfig> {
    const MAX_BLOCK: usize = (1 << 32) - 64;
    let bad = if !slots.is_power_of_two() || !(2..=1 << 20).contains(&slots) {
        Some(format!(
            "slots={slots}: a power of two from 2 to 2**20 (ring slots of 64 bytes)"
        ))
    } else if !(1..=1 << 20).contains(&blocks) {
        Some(format!(
            "blocks={blocks}: from 1 to 2**20 pool blocks (each holds one zero-copy array)"
        ))
    } else if !(64..=MAX_BLOCK).contains(&block_size) {
        Some(format!(
            "block_size={block_size}: from 64 bytes to 4 GiB - 64 (the largest zero-copy array)"
        ))
    } else {
        None
    };
    if let Some(m) = bad {
        return Err(PyValueError::new_err(m));
    }
    let mut cfg = ChannelConfig {
        slots,
        blocks,
        block_size,
        ..ChannelConfig::default()
    };
    if let Some(t) = threshold {
        cfg.transfer = Transfer::Adaptive { threshold: t };
    }
    Ok(cfg)
}

/// What a blocked call waiting in slices got: the value, the end of the channel, or an error.
enum Waited<T> {
    Got(T),
    Closed,
    Failed(shm_ring::Error),
}

impl Sender {
    fn new(tx: shm_ring::Sender, cfg: ChannelConfig, anonymous: bool) -> Sender {
        Sender {
            inner: Mutex::new(Some(tx)),
            cfg,
            anonymous,
            live_loans: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub(super) fn cfg(&self) -> &ChannelConfig {
        &self.cfg
    }

    /// The channel (`None` after `close()`).
    pub(super) fn inner(&self) -> &Mutex<Option<shm_ring::Sender>> {
        &self.inner
    }

    /// Runs `f` on the sender with the GIL released.
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut shm_ring::Sender) -> Result<R, shm_ring::Error> + Send,
    ) -> PyResult<R> {
        let r = py.detach(|| match lock(&self.inner).as_mut() {
            None => Waited::Closed,
            Some(tx) => f(tx).map_or_else(Waited::Failed, Waited::Got),
        });
        match r {
            Waited::Got(v) => Ok(v),
            Waited::Closed => Err(closed()),
            Waited::Failed(e) => Err(ring_err(py, e)),
        }
    }

    /// Repeats `f` (given the sender and a wait slice) with the GIL released until it does
    /// not time out, checking for signals and for a pool held by our own live loan arrays
    /// between slices; `Timeout` at `end`.
    pub(super) fn wait<R: Send>(
        &self,
        py: Python<'_>,
        end: Option<Instant>,
        mut f: impl FnMut(&mut shm_ring::Sender, Duration) -> Result<R, shm_ring::Error> + Send,
    ) -> PyResult<R> {
        loop {
            let Some(s) = slice(end) else {
                return Err(ring_err(py, shm_ring::Error::Timeout));
            };
            let r = py.detach(|| match lock(&self.inner).as_mut() {
                None => Waited::Closed,
                Some(tx) => f(tx, s).map_or_else(Waited::Failed, Waited::Got),
            });
            match r {
                Waited::Got(v) => return Ok(v),
                Waited::Closed => return Err(closed()),
                Waited::Failed(shm_ring::Error::Timeout) => {
                    py.check_signals()?;
                    self.hoarding()?;
                }
                Waited::Failed(e) => return Err(ring_err(py, e)),
            }
        }
    }

    /// `PoolExhausted` when arrays from `loan()` alive in this process hold every block.
    fn hoarding(&self) -> PyResult<()> {
        let live = self.live_loans.load(Ordering::Relaxed);
        let blocks = self.cfg.blocks as usize;
        if blocks > 0 && live >= blocks {
            return Err(PoolExhausted::new_err(format!(
                "all {blocks} pool blocks (blocks={blocks}) are held by arrays from loan() that \
                 are still alive in this process (a loaned block comes back only when the \
                 consumer released it and the last view of the loaned array is gone), so \
                 waiting for one would be forever: del (or stop referencing) the arrays you no \
                 longer need before the next loan, or create the Sender with more blocks="
            )));
        }
        Ok(())
    }

    /// A loan of `shape` x `dt`: taken at once with the GIL held if a block is free (and no
    /// other thread holds the sender), else waited for in slices with the GIL released.
    pub(super) fn take_loan(
        &self,
        py: Python<'_>,
        dt: DType,
        shape: &[usize],
        end: Option<Instant>,
    ) -> PyResult<AnyLoan> {
        if let Ok(mut g) = self.inner.try_lock() {
            let tx = g.as_mut().ok_or_else(closed)?;
            match AnyLoan::new(tx, dt, shape, Duration::ZERO) {
                Ok(l) => return Ok(l),
                Err(shm_ring::Error::Timeout) => {}
                Err(e) => return Err(ring_err(py, e)),
            }
        }
        self.wait(py, end, |tx, s| AnyLoan::new(tx, dt, shape, s))
    }

    /// Sends `msg`: at once with the GIL held if there is room (the message may borrow numpy
    /// memory then), else, owned by then, waiting in slices with the GIL released.
    pub(super) fn send_out(
        &self,
        py: Python<'_>,
        mut out: Outgoing<'_>,
        end: Option<Instant>,
    ) -> PyResult<()> {
        // A message mixing loans and numpy memory cannot give the memory back once built:
        // own it now (rare; small arrays in practice).
        if out.has_loans() && out.borrows() {
            out.own()?;
        }
        if out.borrows() {
            if let Ok(mut g) = self.inner.try_lock() {
                let tx = g.as_mut().ok_or_else(closed)?;
                let msg = out.build().map_err(|e| ring_err(py, e))?;
                match tx.try_send(msg) {
                    Err(TrySendError::Full(_)) => {}
                    r => return r.map_err(|e| ring_err(py, e)),
                }
            }
            self.own_for_wait(py, &mut out, end)?;
        }
        let msg = out.build().map_err(|e| ring_err(py, e))?;
        self.send_owned(py, msg, end)
    }

    /// Sends a message that reads no numpy memory: with the GIL held if there is room, else
    /// in slices with the GIL released (it comes back whole after each slice).
    pub(super) fn send_owned(
        &self,
        py: Python<'_>,
        msg: MessageBuilder<'_>,
        end: Option<Instant>,
    ) -> PyResult<()> {
        let mut msg = Some(msg);
        if let Ok(mut g) = self.inner.try_lock() {
            let tx = g.as_mut().ok_or_else(closed)?;
            match tx.try_send(msg.take().expect("message")) {
                Err(TrySendError::Full(m)) => msg = Some(m),
                r => return r.map_err(|e| ring_err(py, e)),
            }
        }
        self.wait(py, end, |tx, s| {
            let m = msg.take().expect("message");
            match tx.send_timeout(m, s) {
                Ok(()) => Ok(()),
                Err(SendTimeoutError::Timeout(m)) => {
                    msg = Some(m);
                    Err(shm_ring::Error::Timeout)
                }
                Err(e) => Err(e.into()),
            }
        })
    }

    /// Makes `out` read no numpy memory before it waits with the GIL released: an array that
    /// would go zero-copy gets a loan (waited for in slices), filled with the GIL held from the
    /// array as it is then; the others are copied.
    fn own_for_wait(
        &self,
        py: Python<'_>,
        out: &mut Outgoing<'_>,
        end: Option<Instant>,
    ) -> PyResult<()> {
        let cfg = self.cfg;
        for i in 0..out.parts.len() {
            let (dt, shape, len) = match &out.parts[i].1 {
                Part::Borrowed {
                    dt, shape, bytes, ..
                } => (*dt, shape.clone(), bytes.len()),
                _ => continue,
            };
            if cfg.blocks == 0 || !cfg.transfer.zero_copy(len) || len > cfg.block_size {
                continue;
            }
            let mut l = self.take_loan(py, dt, &shape, end)?;
            // The GIL is held again: read the array as it is now (it may have changed).
            let arr = out.array_of(i).expect("borrowed");
            if l.fill_from(arr, dt, &shape)? {
                out.parts[i].1 = Part::Loan(Some(l));
            }
        }
        out.own()
    }
}

/// A shape given as an int or a sequence of ints.
fn shape_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    if let Ok(t) = obj.cast::<pyo3::types::PyTuple>() {
        return t.iter().map(|d| d.extract::<usize>()).collect();
    }
    if let Ok(n) = obj.extract::<usize>() {
        return Ok(vec![n]);
    }
    obj.extract::<Vec<usize>>()
}

/// The dtype of `obj`: the last few objects asked for are remembered (held, so their
/// addresses cannot be reused by other objects), as a loop asks for the same one each time.
fn dtype_of(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    static SEEN: Mutex<Vec<(Py<PyAny>, DType)>> = Mutex::new(Vec::new());
    if let Some(&(_, dt)) = lock(&SEEN).iter().find(|(o, _)| o.as_ptr() == obj.as_ptr()) {
        return Ok(dt);
    }
    let dt = dtype::from_py(py, obj)?;
    let mut seen = lock(&SEEN);
    if seen.len() >= 8 {
        seen.remove(0);
    }
    seen.push((obj.clone().unbind(), dt));
    Ok(dt)
}

#[pymethods]
impl Sender {
    /// Creates the channel `name` (served by a Unix socket in `$SHMPIPE_DIR`; nothing goes to
    /// `/dev/shm`) for one `Receiver.open(name)`.
    ///
    /// `slots`: ring slots of 64 bytes (a power of two, 2 to 2**20): messages in flight and
    /// small arrays inline. `blocks` (1 to 2**20) pool blocks of `block_size` bytes (64 bytes
    /// to 4 GiB - 64): one per zero-copy array in flight, so `block_size` is the largest
    /// array that can travel. `threshold`: arrays from this many bytes on go zero-copy
    /// (default 1024), smaller ones are copied. `linger`: seconds that `close()` waits, while
    /// no `Receiver` has opened the channel yet, for a late one (default 10; 0 closes at once
    /// and drops what nobody received). A bad value raises `ValueError` naming it; a taken
    /// name `FileExistsError`.
    #[staticmethod]
    #[pyo3(signature = (name, slots=1024, blocks=16, block_size=1 << 20, threshold=None,
                        linger=10.0),
           text_signature = "(name, slots=1024, blocks=16, block_size=1048576, threshold=None, \
                             linger=10.0)")]
    fn create(
        py: Python<'_>,
        name: &str,
        slots: u32,
        blocks: u32,
        block_size: usize,
        threshold: Option<usize>,
        linger: f64,
    ) -> PyResult<Sender> {
        let mut cfg = config(slots, blocks, block_size, threshold)?;
        cfg.linger = crate::timeout::seconds(linger, "linger")?.ok_or_else(|| {
            PyValueError::new_err(format!(
                "linger={linger}: seconds, a finite number >= 0 (default 10; 0: close at once)"
            ))
        })?;
        let tx = py
            .detach(|| shm_ring::Sender::<shm_ring::Message>::create(name, &cfg))
            .map_err(|e| ring_err(py, e))?;
        Ok(Sender::new(tx, cfg, false))
    }

    /// Creates an anonymous channel (a memfd, no name): `fileno()` is the descriptor to give
    /// a child process, which opens it with `Receiver.from_fd(fd)` (or use `shmpipe.pipe()`,
    /// whose handle pickles for `multiprocessing`). Parameters as for `Sender.create`.
    #[staticmethod]
    #[pyo3(signature = (slots=1024, blocks=16, block_size=1 << 20, threshold=None),
           text_signature = "(slots=1024, blocks=16, block_size=1048576, threshold=None)")]
    fn anonymous(
        py: Python<'_>,
        slots: u32,
        blocks: u32,
        block_size: usize,
        threshold: Option<usize>,
    ) -> PyResult<Sender> {
        let cfg = config(slots, blocks, block_size, threshold)?;
        let tx = py
            .detach(|| shm_ring::Sender::<shm_ring::Message>::anonymous(&cfg))
            .map_err(|e| ring_err(py, e))?;
        Ok(Sender::new(tx, cfg, true))
    }

    /// The memfd of an anonymous channel (the sender's own: `Receiver.from_fd` duplicates it).
    fn fileno(&self) -> PyResult<i32> {
        if !self.anonymous {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a named channel has no descriptor: open it by name",
            ));
        }
        lock(&self.inner)
            .as_ref()
            .map(|t| t.as_fd().as_raw_fd())
            .ok_or_else(closed)
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
        self.with(py, |tx| tx.free_blocks().map_err(shm_ring::Error::from))
    }

    /// What was sent so far: a `SenderStats` (messages, zero_copy_arrays, copied_arrays,
    /// array_bytes).
    fn stats(&self) -> PyResult<SenderStats> {
        let g = lock(&self.inner);
        let s = g.as_ref().ok_or_else(closed)?.stats();
        Ok(SenderStats {
            messages: s.messages,
            zero_copy_arrays: s.zero_copy_arrays,
            copied_arrays: s.copied_arrays,
            array_bytes: s.array_bytes,
        })
    }

    /// Waits up to `timeout` seconds (None: no limit) for a consumer to attach; returns its
    /// pid.
    #[pyo3(signature = (timeout=None))]
    fn wait_for_consumer(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<u32> {
        let end = deadline(timeout)?;
        self.wait(py, end, |tx, s| {
            tx.wait_for_consumer(s).ok_or(shm_ring::Error::Timeout)
        })
    }

    /// A writable, zeroed numpy array of `shape` and `dtype` inside a pool block: write your
    /// data there, then `send({"x": arr})` sends it without a copy (and makes it read-only).
    ///
    /// The array holds its block until the receiver released it and the last view of the
    /// array is gone (`del arr` after `send` in a loop). Below `threshold` bytes the array is
    /// an ordinary one that `send` copies (cheaper than a block). Waits up to `timeout`
    /// seconds for a free block; raises `PoolExhausted` when live loaned arrays of this
    /// process hold every block, `ValueError` naming `block_size=` for an array larger than a
    /// block.
    #[pyo3(signature = (shape, dtype, timeout=None))]
    fn loan<'py>(
        slf: &Bound<'py, Self>,
        shape: &Bound<'py, PyAny>,
        dtype: &Bound<'py, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let shape = shape_of(shape)?;
        let dt = dtype_of(py, dtype)?;
        let end = deadline(timeout)?;
        let this = slf.get();
        let nbytes = shape
            .iter()
            .try_fold(dt.size(), |n, &d| n.checked_mul(d))
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "shape={shape:?}: an array of {} that large does not fit in memory",
                    dt.name()
                ))
            })?;
        if this.cfg.blocks == 0 || !this.cfg.transfer.zero_copy(nbytes) {
            // Below the threshold: an ordinary array, copied by `send` (cheaper than a block).
            return view::zeros(py, dt, &shape);
        }
        let l = this.take_loan(py, dt, &shape, end)?;
        Loan::into_array(py, l, dt, &shape, &this.live_loans)
    }

    /// Sends `arrays` (name -> numpy array of a numeric dtype or bool, any shape) and `meta`
    /// (name -> int, float or str) as one message. Arrays from `loan()` and arrays of
    /// `threshold` bytes and more go zero-copy (the latter copied once into a block); smaller
    /// ones are copied into the message. Waits up to `timeout` seconds for room; raises
    /// `PeerDied` if the receiver died, `ValueError` naming the parameter to raise when an
    /// array cannot fit (`block_size=`, `blocks=`, `slots=`).
    #[pyo3(signature = (arrays, meta=None, timeout=None))]
    fn send(
        &self,
        py: Python<'_>,
        arrays: &Bound<'_, PyDict>,
        meta: Option<&Bound<'_, PyDict>>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let out = Outgoing::collect(arrays, meta)?;
        self.send_out(py, out, deadline(timeout)?)
    }

    /// Sends `n` records in as few messages as fit (one when they fit a block): record `i`
    /// holds `arrays[k][i]` for every `k` and `meta[k][i]` for every `k` (every array and
    /// list has `n` rows). Returns `n`. The receiver reads them with `recv_many()` (or as
    /// a `Message` whose `.records` lists them). `timeout` as for `send`.
    #[pyo3(signature = (arrays, meta=None, timeout=None))]
    fn send_many(
        &self,
        py: Python<'_>,
        arrays: &Bound<'_, PyDict>,
        meta: Option<&Bound<'_, PyDict>>,
        timeout: Option<f64>,
    ) -> PyResult<usize> {
        self.send_many_records(py, arrays, meta, deadline(timeout)?)
    }

    /// Closes the channel: the receiver drains what was sent, then gets `Disconnected`.
    ///
    /// A named channel that no `Receiver` has opened yet lingers: `close()` blocks up to
    /// `linger` seconds (`Sender.create(..., linger=10)`), serving the name, so a receiver that
    /// starts late still gets every message; with `linger=0`, or once a receiver has opened
    /// the channel, `close()` returns at once. Anonymous channels never linger.
    ///
    /// Arrays from `loan` that are still alive (sent or not) stay readable: each holds its
    /// block (and the pool's mapping) until its last view is gone.
    fn close(&self, py: Python<'_>) {
        // Without the GIL: a loan in another thread may hold the sender for a wait slice, and
        // a named channel nobody opened yet lingers for a consumer.
        py.detach(|| drop(lock(&self.inner).take()));
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// `close()`; exceptions pass on.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }
}

/// What a `Sender` has sent so far (`Sender.stats()`).
#[derive(Debug, Clone, Copy)]
#[pyclass(module = "shmpipe._native", frozen, get_all)]
pub struct SenderStats {
    /// Messages sent.
    pub messages: u64,
    /// Arrays that went zero-copy (in a pool block).
    pub zero_copy_arrays: u64,
    /// Arrays copied into a message.
    pub copied_arrays: u64,
    /// Bytes of every array sent.
    pub array_bytes: u64,
}

#[pymethods]
impl SenderStats {
    fn __repr__(&self) -> String {
        format!(
            "SenderStats(messages={}, zero_copy_arrays={}, copied_arrays={}, array_bytes={})",
            self.messages, self.zero_copy_arrays, self.copied_arrays, self.array_bytes
        )
    }
}
