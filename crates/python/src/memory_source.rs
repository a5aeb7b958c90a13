//! In-memory sources, fed to the workers by the parent itself.
//!
//! A sequence (a list, a numpy array, any object with `len` and indexing, e.g. a map-style
//! dataset) is read item by item with `obj[i]`; any other iterable (a generator) is pulled
//! with `next`. Nothing is pickled or copied up front, so start-up does not grow with the
//! dataset, and a generator is never materialised: [`Feed::next_group`] is called only while
//! the pipeline has room (`crate::run`: inputs in flight and bytes waiting in front of the
//! channels are bounded), so an endless generator streams with back-pressure.
//!
//! Epochs, sharding and shuffling follow the emitters' definitions: a sequence is read in
//! [`shmpipe::read_order`] of this rank's part (`part_range`); an iterable is sharded
//! round-robin (item `i` goes to rank `i % world_size`) and shuffled with a shuffle buffer
//! alone (its length is unknown), and it is iterated again for each epoch unless it is an
//! iterator (read once). The caller starts each epoch ([`Feed::start_epoch_at`]).

use std::ops::Range;
use std::time::Instant;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyIterator;
use shmpipe::{Item, ShuffleBuffer, derive_seed, part_range, read_order};

use crate::item;

/// How a source is read: the pipeline's settings that concern it.
#[derive(Debug, Clone, Copy)]
pub struct FeedSpec {
    pub seed: u64,
    pub shuffle: bool,
    pub shuffle_buffer: usize,
    /// `None`: endless.
    pub epochs: Option<u64>,
    pub rank: usize,
    pub world_size: usize,
}

enum Src {
    /// `len` + indexing; `part`: this rank's index range.
    Seq { obj: Py<PyAny>, part: Range<usize> },
    /// Anything iterable (`iter(obj)` for each pass; an iterator gives one pass).
    Iter {
        obj: Py<PyAny>,
        it: Option<Py<PyIterator>>,
        /// Items pulled from `it` in this pass (for round-robin sharding and messages).
        pulled: u64,
        /// Shuffle buffer of this pass, with each item's position.
        buf: Option<ShuffleBuffer<(u64, Py<PyAny>)>>,
        /// What is left in the buffer once the pass ended.
        rest: Vec<(u64, Py<PyAny>)>,
    },
}

/// An in-memory source being fed to a pipeline.
pub struct Feed {
    src: Src,
    spec: FeedSpec,
    epoch: u64,
    /// Sequence: the read order of this epoch, and the position in it.
    order: Vec<usize>,
    pos: usize,
    done: bool,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed")
            .field("epoch", &self.epoch)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Feed {
    /// A feed over `obj` (a sequence or an iterable).
    ///
    /// # Errors
    /// `TypeError` for an object that is neither; `ValueError` for an iterator (read once)
    /// with `epochs` other than 1.
    pub fn new(obj: &Bound<'_, PyAny>, spec: FeedSpec) -> PyResult<Feed> {
        let is_seq = obj.hasattr("__len__")? && obj.hasattr("__getitem__")?;
        let src = if is_seq {
            let part = part_range(obj.len()?, spec.rank, spec.world_size.max(1));
            Src::Seq {
                obj: obj.clone().unbind(),
                part,
            }
        } else {
            let it = obj.try_iter().map_err(|_| {
                PyTypeError::new_err(format!(
                    "source: a path, a sequence (len and indexing) or an iterable, not {}",
                    obj.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?;
            let again = !it.is(obj);
            if !again && spec.epochs != Some(1) {
                return Err(PyValueError::new_err(
                    "source: an iterator or generator can be read once, so epochs must be 1; \
                     for several epochs pass a sequence, or an object whose __iter__ starts a \
                     new pass",
                ));
            }
            Src::Iter {
                obj: obj.clone().unbind(),
                it: None,
                pulled: 0,
                buf: None,
                rest: Vec::new(),
            }
        };
        // Done until [`Feed::start_epoch_at`].
        Ok(Feed {
            src,
            spec,
            epoch: 0,
            order: Vec::new(),
            pos: 0,
            done: true,
        })
    }

    /// Starts epoch `epoch`: what is left of the current one is dropped.
    ///
    /// # Errors
    /// What `iter(source)` raised.
    pub fn start_epoch_at(&mut self, py: Python<'_>, epoch: u64) -> PyResult<()> {
        self.epoch = epoch;
        self.done = false;
        self.start_epoch(py)
    }

    fn start_epoch(&mut self, py: Python<'_>) -> PyResult<()> {
        let s = self.spec;
        let base = derive_seed(&[s.seed, self.epoch, s.rank as u64, 0]);
        match &mut self.src {
            Src::Seq { part, .. } => {
                let shuffle = s.shuffle.then_some(s.shuffle_buffer);
                self.order = read_order(part.len(), s.seed, self.epoch, s.rank, 0, shuffle);
                self.pos = 0;
            }
            Src::Iter {
                obj,
                it,
                pulled,
                buf,
                rest,
                ..
            } => {
                *it = Some(obj.bind(py).try_iter()?.unbind());
                *pulled = 0;
                rest.clear();
                // The emitters' buffer seed (`derive_seed([base, 1])`), over the stream.
                *buf = (s.shuffle && s.shuffle_buffer > 1)
                    .then(|| ShuffleBuffer::new(s.shuffle_buffer, derive_seed(&[base, 1])));
            }
        }
        Ok(())
    }

    /// The next object of the source and its position (for messages); `None` when done.
    fn next_obj<'py>(&mut self, py: Python<'py>) -> PyResult<Option<(u64, Bound<'py, PyAny>)>> {
        while !self.done {
            match &mut self.src {
                Src::Seq { obj, part } => {
                    if let Some(&i) = self.order.get(self.pos) {
                        self.pos += 1;
                        let at = part.start + i;
                        return Ok(Some((at as u64, obj.bind(py).get_item(at)?)));
                    }
                }
                Src::Iter {
                    it,
                    pulled,
                    buf,
                    rest,
                    ..
                } => {
                    if let Some((at, o)) = rest.pop() {
                        return Ok(Some((at, o.into_bound(py))));
                    }
                    if let Some(i) = it.as_ref() {
                        let next = i.bind(py).clone().next();
                        match next {
                            Some(o) => {
                                let o = o?;
                                let at = *pulled;
                                *pulled += 1;
                                let w = self.spec.world_size.max(1) as u64;
                                if at % w != self.spec.rank as u64 {
                                    continue;
                                }
                                match buf.as_mut() {
                                    None => return Ok(Some((at, o))),
                                    Some(b) => match b.push((at, o.unbind())) {
                                        Some((at, o)) => return Ok(Some((at, o.into_bound(py)))),
                                        None => continue,
                                    },
                                }
                            }
                            None => {
                                *it = None;
                                if let Some(b) = buf.as_mut() {
                                    // Popped from the end: reversed, to release in the
                                    // buffer's drain order.
                                    *rest = b.drain();
                                    rest.reverse();
                                }
                                continue;
                            }
                        }
                    }
                }
            }
            // The end of this epoch (the caller starts the next one).
            self.done = true;
        }
        Ok(None)
    }

    /// The next items of the current epoch, converted: up to `max_items` items, about
    /// `max_bytes` array bytes, or what came by `until` (at least one item); `None` at the end
    /// of the epoch.
    ///
    /// # Errors
    /// What reading the source raised (the user's own exception), or a `TypeError` /
    /// `ValueError` naming the item that cannot travel.
    pub fn next_group(
        &mut self,
        py: Python<'_>,
        max_items: usize,
        max_bytes: usize,
        until: Instant,
    ) -> PyResult<Option<Vec<Item>>> {
        let mut group = Vec::new();
        let mut bytes = 0;
        while group.len() < max_items
            && bytes < max_bytes
            && (group.is_empty() || Instant::now() < until)
        {
            let Some((at, obj)) = self.next_obj(py)? else {
                break;
            };
            let item = item::from_py(py, &obj).map_err(|e| at_item(py, e, at))?;
            bytes += item.nbytes();
            group.push(item);
        }
        Ok((!group.is_empty()).then_some(group))
    }
}

/// A conversion error of source item `at`, saying which item (same exception type).
fn at_item(py: Python<'_>, e: PyErr, at: u64) -> PyErr {
    let msg = e.value(py).to_string();
    let new = PyErr::from_type(e.get_type(py), format!("source item {at}: {msg}"));
    new.set_cause(py, Some(e));
    new
}
