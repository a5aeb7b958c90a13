//! In-memory sources, fed to the workers by the parent itself.
//!
//! A sequence (a list, a numpy array, any object with `len` and indexing, e.g. a map-style
//! dataset) is read item by item with `obj[i]`; any other iterable (a generator) is pulled
//! with `next`. Nothing is pickled or copied up front, so start-up does not grow with the
//! dataset, and a generator is never materialised: [`Feed::top_up`] pulls only while the
//! pipeline's input queue is short (its channels full stop the input thread, and the queue
//! then grows), so an endless generator streams with back-pressure.
//!
//! Epochs, sharding and shuffling follow the emitters' definitions: a sequence is read in
//! [`shmpipe::read_order`] of this rank's part (`part_range`); an iterable is sharded
//! round-robin (item `i` goes to rank `i % world_size`) and shuffled with a shuffle buffer
//! alone (its length is unknown), and it is iterated again for each epoch unless it is an
//! iterator (read once).

use std::ops::Range;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyIterator;
use shmpipe::{Input, ShuffleBuffer, derive_seed, part_range, read_order};

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
    /// Anything iterable; `again`: `iter(obj)` gives a new pass (not an iterator).
    Iter {
        obj: Py<PyAny>,
        it: Option<Py<PyIterator>>,
        again: bool,
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
    pub fn new(py: Python<'_>, obj: &Bound<'_, PyAny>, spec: FeedSpec) -> PyResult<Feed> {
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
                again,
                pulled: 0,
                buf: None,
                rest: Vec::new(),
            }
        };
        let mut f = Feed {
            src,
            spec,
            epoch: 0,
            order: Vec::new(),
            pos: 0,
            done: spec.epochs == Some(0),
        };
        f.start_epoch(py)?;
        Ok(f)
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

    /// Ends the current epoch; starts the next one or marks the feed done.
    fn next_epoch(&mut self, py: Python<'_>) -> PyResult<()> {
        self.epoch += 1;
        let empty = match &self.src {
            Src::Seq { part, .. } => part.is_empty(),
            Src::Iter { again, pulled, .. } => !*again || *pulled == 0,
        };
        self.done = match self.spec.epochs {
            Some(n) => self.epoch >= n,
            // Endless over nothing would spin forever.
            None => empty,
        };
        if !self.done {
            self.start_epoch(py)?;
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
            self.next_epoch(py)?;
        }
        Ok(None)
    }

    /// Feeds items until `input` holds `max_items` items or `max_bytes` bytes, or the source
    /// is exhausted (then `Ok(true)`: the caller closes the input). Items go over in groups
    /// ([`Input::send_batch`]): one wake-up of the pipeline's input thread per group.
    ///
    /// # Errors
    /// What reading the source raised (the user's own exception), or a `TypeError` /
    /// `ValueError` naming the item that cannot travel.
    pub fn top_up(
        &mut self,
        py: Python<'_>,
        input: &mut Input,
        max_items: usize,
        max_bytes: usize,
    ) -> PyResult<bool> {
        const GROUP_ITEMS: usize = 256;
        const GROUP_BYTES: usize = 1 << 20;
        let mut group = Vec::new();
        let mut bytes = 0;
        let mut ended = false;
        while input.queued_items() + group.len() < max_items
            && input.queued_bytes() + bytes < max_bytes
        {
            let Some((at, obj)) = self.next_obj(py)? else {
                ended = true;
                break;
            };
            let item = item::from_py(py, &obj).map_err(|e| at_item(py, e, at))?;
            bytes += item.nbytes();
            group.push(item);
            if group.len() >= GROUP_ITEMS || bytes >= GROUP_BYTES {
                if input.send_batch(std::mem::take(&mut group)).is_err() {
                    // The pipeline's input thread stopped: the consumer reports why.
                    return Ok(false);
                }
                bytes = 0;
            }
        }
        if input.send_batch(group).is_err() {
            return Ok(false);
        }
        Ok(ended || self.done)
    }
}

/// A conversion error of source item `at`, saying which item (same exception type).
fn at_item(py: Python<'_>, e: PyErr, at: u64) -> PyErr {
    let msg = e.value(py).to_string();
    let new = PyErr::from_type(e.get_type(py), format!("source item {at}: {msg}"));
    new.set_cause(py, Some(e));
    new
}
