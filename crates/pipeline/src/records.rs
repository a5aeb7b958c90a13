//! [`Records`]: the order in which one part of a source is read, epoch by epoch. Emitters read
//! their part with it; a parent that feeds a pipeline itself (enqueue mode, e.g. the Python
//! binding's persistent workers) reads with it too and so sends the same records in the same
//! order as an emitter would.

use crate::config::OnBadRecord;
use crate::item::Item;
use crate::shuffle::{ShuffleBuffer, derive_seed, epoch_order};
use crate::source::{Source, SourceError};

/// How a part is read: the settings of [`PipelineBuilder`](crate::PipelineBuilder) that
/// decide the order of records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOrder {
    /// The pipeline's seed.
    pub seed: u64,
    /// Permute each epoch (and pass the records through a shuffle buffer).
    pub shuffle: bool,
    /// Capacity of the shuffle buffer (`0` or `1`: none).
    pub shuffle_buffer: usize,
    /// This job's rank (see [`PipelineBuilder::shard`](crate::PipelineBuilder::shard)).
    pub rank: usize,
    /// The emitter reading this part (`0` for a parent that feeds the pipeline).
    pub emitter: usize,
    /// What to do with a malformed record.
    pub on_bad_record: OnBadRecord,
}

/// One part of a source, read epoch after epoch: each epoch in its own seeded permutation and
/// through a shuffle buffer when shuffling, malformed records skipped (and counted) or
/// returned, as the pipeline's settings say.
///
/// # Examples
/// ```
/// use shmpipe::{Item, MemorySource, OnBadRecord, ReadOrder, Records};
/// let items: Vec<Item> = (0..10).map(|i| Item::new().with_meta("i", i)).collect();
/// let order = ReadOrder { seed: 7, shuffle: true, shuffle_buffer: 4, rank: 0, emitter: 0,
///                         on_bad_record: OnBadRecord::Fail };
/// let mut r = Records::new(Box::new(MemorySource::new(items)), order);
/// r.start_epoch(0);
/// let mut seen: Vec<i64> = r.by_ref().map(|it| it.unwrap().i64("i").unwrap()).collect();
/// seen.sort_unstable();
/// assert_eq!(seen, (0..10).collect::<Vec<_>>());
/// ```
pub struct Records {
    source: Box<dyn Source>,
    order: ReadOrder,
    /// Indices of this epoch not read yet.
    pending: std::vec::IntoIter<usize>,
    buffer: Option<ShuffleBuffer<Item>>,
    /// What the shuffle buffer held at the end of the epoch, in its release order.
    drained: std::vec::IntoIter<Item>,
    skipped: u64,
}

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records")
            .field("len", &self.source.len())
            .field("order", &self.order)
            .field("skipped", &self.skipped)
            .finish_non_exhaustive()
    }
}

impl Records {
    /// Reads `source` (one part) in `order`. No epoch is started: call
    /// [`Records::start_epoch`].
    pub fn new(source: Box<dyn Source>, order: ReadOrder) -> Records {
        Records {
            source,
            order,
            pending: Vec::new().into_iter(),
            buffer: None,
            drained: Vec::new().into_iter(),
            skipped: 0,
        }
    }

    /// Records in the part (per epoch, before skipping any).
    pub fn len(&self) -> usize {
        self.source.len()
    }

    /// Whether the part holds no record.
    pub fn is_empty(&self) -> bool {
        self.source.is_empty()
    }

    /// Malformed records skipped so far (with [`OnBadRecord::Skip`]).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Starts epoch `epoch` (`0, 1, ...`): the iterator then yields its records and ends with
    /// it. What was left of the previous epoch is dropped.
    pub fn start_epoch(&mut self, epoch: u64) {
        let o = &self.order;
        let base = [o.seed, epoch, o.rank as u64, o.emitter as u64];
        let len = self.source.len();
        self.pending = epoch_order(len, o.shuffle.then(|| derive_seed(&base))).into_iter();
        self.buffer = (o.shuffle && o.shuffle_buffer > 1)
            .then(|| ShuffleBuffer::new(o.shuffle_buffer, derive_seed(&[derive_seed(&base), 1])));
        self.drained = Vec::new().into_iter();
    }
}

impl Iterator for Records {
    type Item = Result<Item, SourceError>;

    /// The next record of the current epoch; `None` at its end. An error is a malformed record
    /// under [`OnBadRecord::Fail`], or a failure of the source.
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let Some(idx) = self.pending.next() else {
                if let Some(mut b) = self.buffer.take() {
                    self.drained = b.drain().into_iter();
                }
                return self.drained.next().map(Ok);
            };
            let item = match self.source.read(idx) {
                Ok(item) => item,
                Err(SourceError::BadRecord { .. })
                    if self.order.on_bad_record == OnBadRecord::Skip =>
                {
                    self.skipped += 1;
                    continue;
                }
                Err(e) => return Some(Err(e)),
            };
            match self.buffer.as_mut() {
                Some(b) => {
                    if let Some(out) = b.push(item) {
                        return Some(Ok(out));
                    }
                }
                None => return Some(Ok(item)),
            }
        }
    }
}
