//! The worker step: parse, chain and batch, each when configured.

use std::path::{Path, PathBuf};

use shmpipe::{Item, Step, StepContext, StepError};

use super::convert::{batch_to_item, entry_to_item, item_to_entry, split_group};
use super::names::{GROUP_META, LINE_FIELD, LINE_NO_META, LINES_FIELD, RANGES_FIELD};
use crate::batch::Batcher;
use crate::entry::DataEntry;
use crate::jsonl::{parse_entry, split_lines};
use crate::period::Freq;
use crate::transform::Chain;
use crate::workload::{ChainConfig, Split, mean_window, training_chain};

/// The worker step: parse (raw lines), then optionally the chain, then
/// optionally batching. Entries and windows travel as items between stages.
///
/// A partial batch left at the end of the stream is emitted by [`Step::finish`]
/// (one per worker, with fewer than `batch_size` rows), so no window is lost.
pub(super) struct TrainStep {
    freq: Freq,
    /// The parsed file by line (index `line - 1`), when the step holds the data.
    cache: Option<Vec<Option<Result<DataEntry, String>>>>,
    /// The file whose byte ranges the step reads itself, and a reusable buffer.
    file: Option<(std::fs::File, PathBuf, Vec<u8>)>,
    chain: Option<Chain>,
    /// `false` for the test split (features extended into the future).
    is_train: bool,
    batcher: Option<Batcher>,
    windows: Vec<DataEntry>,
}

impl TrainStep {
    pub(super) fn from_context(
        cx: &StepContext<'_>,
        transform: bool,
        batch: bool,
    ) -> Result<TrainStep, StepError> {
        let a = cx.args;
        let mut cfg = ChainConfig::from_args(a).map_err(StepError::new)?;
        // The training sampler's mean window, from the whole file (`"data_path"`) unless the
        // runner computed it: every worker then draws the same windows for a series.
        if cfg.split == Split::Train
            && cfg.mean_window.is_none()
            && let Some(path) = a["data_path"].as_str()
        {
            cfg.mean_window = mean_window(Path::new(path), &cfg)
                .map_err(|e| StepError::new(format!("{path}: {e}")))?;
        }
        let batch_size = a["batch_size"].as_u64().unwrap_or(32) as usize;
        let cache = match a["cache_path"].as_str() {
            Some(path) => Some(load_cache(Path::new(path), cfg.freq)?),
            None => None,
        };
        let file = match a["read_path"].as_str() {
            Some(path) => {
                let f = std::fs::File::open(path)
                    .map_err(|e| StepError::new(format!("{path}: {e}")))?;
                Some((f, PathBuf::from(path), Vec::new()))
            }
            None => None,
        };
        Ok(TrainStep {
            freq: cfg.freq,
            cache,
            file,
            is_train: cfg.is_train(),
            chain: transform.then(|| training_chain(&cfg, cx.worker.seed)),
            batcher: batch.then(|| Batcher::new(batch_size)),
            windows: Vec::new(),
        })
    }
}

impl Step for TrainStep {
    /// Draws every window of a record from the record's own seed
    /// ([`shmpipe::item_seed`]): the same windows for any number of workers (a per-worker
    /// stream made them depend on which worker got which record).
    fn process(&mut self, mut item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        if let (Some(chain), Some(seed)) = (&mut self.chain, shmpipe::item_seed()) {
            chain.reseed(seed);
        }
        if let Some(ranges) = item
            .remove(RANGES_FIELD)
            .and_then(|a| a.into_typed::<i64>().ok())
        {
            let ranges: Vec<i64> = ranges.iter().copied().collect();
            self.run_line_ranges(&ranges, out)?;
        } else if let Some(numbers) = item
            .remove(LINES_FIELD)
            .and_then(|a| a.into_typed::<i64>().ok())
        {
            self.run_cached_lines(numbers.iter().copied(), out)?;
        } else if let Some(lines) = item
            .remove(LINE_FIELD)
            .and_then(|a| a.into_typed::<u8>().ok())
        {
            let bytes = lines
                .as_slice()
                .ok_or_else(|| StepError::new("json_line is not contiguous"))?;
            let first = item.i64(LINE_NO_META).unwrap_or(1);
            for (line_no, line) in (first..).zip(split_lines(bytes)) {
                if !line.iter().all(u8::is_ascii_whitespace) {
                    let e = parse_entry(line, self.freq)
                        .map_err(|e| StepError::new(format!("line {line_no}: {e}")))?;
                    self.run(e, out)?;
                }
            }
        } else if let Some(n) = item.i64(GROUP_META) {
            for e in split_group(item, n as usize, self.freq)? {
                self.run(e, out)?;
            }
        } else {
            let e = item_to_entry(item, self.freq)?;
            self.run(e, out)?;
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), StepError> {
        if let Some(b) = self.batcher.as_mut().and_then(Batcher::finish) {
            out.push(batch_to_item(b.map_err(StepError::new)?));
        }
        Ok(())
    }
}

impl TrainStep {
    /// `line_ranges`: reads each (offset, length, line number) triple's line from the file of
    /// the step arg `read_path` and runs its entry.
    fn run_line_ranges(&mut self, ranges: &[i64], out: &mut Vec<Item>) -> Result<(), StepError> {
        use std::os::unix::fs::FileExt;
        let (file, path, mut buf) = self
            .file
            .take()
            .ok_or_else(|| StepError::new("line_ranges needs the step arg read_path"))?;
        let mut result = Ok(());
        for r in ranges.chunks_exact(3) {
            let (offset, len, line) = (r[0] as u64, r[1] as usize, r[2]);
            buf.resize(len, 0);
            let parsed = file
                .read_exact_at(&mut buf, offset)
                .map_err(|e| StepError::new(format!("{}: {e}", path.display())))
                .and_then(|()| {
                    parse_entry(&buf, self.freq).map_err(|e| {
                        StepError::new(format!("{}: line {line}: {e}", path.display()))
                    })
                });
            result = parsed.and_then(|e| self.run(e, out));
            if result.is_err() {
                break;
            }
        }
        self.file = Some((file, path, buf));
        result
    }

    /// `series_lines`: runs the entries of these line numbers from the cache of the step arg
    /// `cache_path`.
    fn run_cached_lines(
        &mut self,
        numbers: impl IntoIterator<Item = i64>,
        out: &mut Vec<Item>,
    ) -> Result<(), StepError> {
        // Taken out for the loop (`run_ref` borrows `self`), put back after.
        let cache = self
            .cache
            .take()
            .ok_or_else(|| StepError::new("series_lines needs the step arg cache_path"))?;
        let mut result = Ok(());
        for n in numbers {
            result = match cache.get((n as usize).wrapping_sub(1)) {
                // Read in place: the worker's copy is not copied again each pass.
                Some(Some(Ok(e))) => self.run_ref(e, out),
                Some(Some(Err(msg))) => Err(StepError::new(format!("line {n}: {msg}"))),
                _ => Err(StepError::new(format!("no series on line {n}"))),
            };
            if result.is_err() {
                break;
            }
        }
        self.cache = Some(cache);
        result
    }

    /// Chain and batch one entry (each when configured).
    fn run(&mut self, entry: DataEntry, out: &mut Vec<Item>) -> Result<(), StepError> {
        self.windows.clear();
        match &mut self.chain {
            Some(chain) => chain
                .apply(entry, self.is_train, &mut self.windows)
                .map_err(StepError::new)?,
            None => self.windows.push(entry),
        }
        self.flush_windows(out)
    }

    /// [`TrainStep::run`] on a borrowed entry (the fused chain reads it in place).
    fn run_ref(&mut self, entry: &DataEntry, out: &mut Vec<Item>) -> Result<(), StepError> {
        self.windows.clear();
        match &mut self.chain {
            Some(chain) => chain
                .apply_ref(entry, self.is_train, &mut self.windows)
                .map_err(StepError::new)?,
            None => self.windows.push(entry.clone()),
        }
        self.flush_windows(out)
    }

    /// Batches (or forwards) the windows of the last entry.
    fn flush_windows(&mut self, out: &mut Vec<Item>) -> Result<(), StepError> {
        for w in self.windows.drain(..) {
            match &mut self.batcher {
                Some(batcher) => {
                    if let Some(b) = batcher.push(w) {
                        out.push(batch_to_item(b.map_err(StepError::new)?));
                    }
                }
                None => out.push(entry_to_item(w)),
            }
        }
        Ok(())
    }
}

/// Parses a whole file once, by line number (blank lines are `None`).
fn load_cache(
    path: &Path,
    freq: Freq,
) -> Result<Vec<Option<Result<DataEntry, String>>>, StepError> {
    let data =
        std::fs::read(path).map_err(|e| StepError::new(format!("{}: {e}", path.display())))?;
    Ok(split_lines(&data)
        .map(|line| {
            (!line.iter().all(u8::is_ascii_whitespace))
                .then(|| parse_entry(line, freq).map_err(|e| e.to_string()))
        })
        .collect())
}
