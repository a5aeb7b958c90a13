//! The workload as a multi-process [`shmpipe`] pipeline.
//!
//! Emitters read line-aligned parts of the JSON-lines file; workers parse,
//! transform, split and batch (one fused step, [`STEP_TRAIN`]); the consumer
//! receives stacked batches. Register the steps and sources once with
//! [`register`], call [`shmpipe::init`] first thing in `main`, then
//! [`run_workload`]:
//!
//! ```no_run
//! use shmpipe_timeseries::pipeline::{register, run_workload};
//! use shmpipe_timeseries::workload::{ChainConfig, WorkloadConfig, WorkloadSource};
//!
//! let reg = register(shmpipe::Registry::new());
//! shmpipe::init(&reg); // worker and emitter processes run their role here and exit
//! let cfg = WorkloadConfig {
//!     source: WorkloadSource::JsonLines("data.jsonl".into()),
//!     chain: ChainConfig::default(),
//!     batch_size: 32, epochs: 3, workers: 2, emitters: 1, group: 16, seed: 0,
//! };
//! let stats = run_workload(&reg, &cfg, |_| {}).unwrap();
//! println!("{:.0} windows/s", stats.windows_per_sec());
//! ```

use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::json;
use shmpipe::ndarray::Array1;
use shmpipe::{
    Epochs, Item, Meta, Pipeline, Registry, Source, SourceContext, SourceError, Step, StepContext,
    StepError, Topology,
};

use crate::batch::{Batch, Batcher};
use crate::entry::{Array, DataEntry};
use crate::jsonl::{parse_entry, split_lines};
use crate::period::{Freq, Period};
use crate::transform::Chain;
use crate::workload::{
    ChainConfig, WorkloadConfig, WorkloadError, WorkloadSource, WorkloadStats, consume_batches,
    training_chain,
};

/// Step: parse (if the item is a raw line), run the DeepAR-style chain, batch.
/// Args: [`ChainConfig::to_args`] (`{"freq", "context_length", "prediction_length",
/// "num_instances", "fused", "split", "min_past", "min_future"}`) and `"batch_size"`.
pub const STEP_TRAIN: &str = "gluonts_train";
/// Step: parse raw lines into entries only (for the staged layout).
pub const STEP_PARSE: &str = "gluonts_parse";
/// Step: run the chain only, one item per window (args as [`STEP_TRAIN`]).
pub const STEP_TRANSFORM: &str = "gluonts_transform";
/// Step: stack windows into batches only (`{"batch_size"}`).
pub const STEP_BATCH: &str = "gluonts_batch";
/// Source: the raw lines of a JSON-lines file (`{"path", "group"}`), parsed by the workers
/// on every pass; one record holds `group` consecutive lines (default [`DEFAULT_GROUP`]).
pub const SOURCE_LINES: &str = "gluonts_lines";
/// Source: a JSON-lines file (`{"path", "freq", "group"}`) parsed once by the emitter, then
/// served from memory on every pass; one record holds `group` series.
pub const SOURCE_PARSED: &str = "gluonts_parsed";

/// Source: the line numbers of a JSON-lines file (`{"path", "group"}`), `group` per
/// record; the workers hold the parsed file (step arg `"cache_path"`) and look the
/// series up, like a map-style dataset with an index sampler (PyTorch's `DataLoader`).
pub const SOURCE_INDICES: &str = "gluonts_indices";
/// Source: byte ranges of the lines of a JSON-lines file (`{"path", "group"}`); the
/// workers read (`pread`) and parse those bytes on every pass (step arg `"read_path"`).
pub const SOURCE_RANGES: &str = "gluonts_ranges";
/// Name of the `i64` array of `(offset, length, line)` triples sent by [`SOURCE_RANGES`].
pub const RANGES_FIELD: &str = "line_ranges";
/// Name of the `i64` array of 1-based line numbers sent by [`SOURCE_INDICES`].
pub const LINES_FIELD: &str = "series_lines";
/// Name of the `u8` array holding a raw JSON line.
pub const LINE_FIELD: &str = "json_line";
/// Metadata: 1-based line number of a raw line.
pub const LINE_NO_META: &str = "line";
/// Metadata: `start` period ordinal.
pub const START_META: &str = "start";
/// Metadata: `forecast_start` period ordinal (windows between stages).
pub const FORECAST_START_META: &str = "forecast_start";
/// Metadata: `item_id`.
pub const ITEM_ID_META: &str = "item_id";
/// Metadata of a grouped in-memory record: number of series in it. Series `j`'s
/// arrays and metadata are named `"{j}/{name}"`.
pub const GROUP_META: &str = "group";
/// Default number of series (or lines) per record crossing from emitter to worker.
pub const DEFAULT_GROUP: usize = 1;
/// Array of a batch item: `forecast_start` ordinals, `i64`, one per row.
pub const FORECAST_START_FIELD: &str = "forecast_start";

/// Adds [`STEP_TRAIN`], [`STEP_PARSE`], [`STEP_TRANSFORM`], [`STEP_BATCH`],
/// [`SOURCE_LINES`] and [`SOURCE_PARSED`] to a registry.
pub fn register(reg: Registry) -> Registry {
    reg.step(STEP_TRAIN, |cx: &StepContext<'_>| {
        TrainStep::from_context(cx, true, true)
    })
    .step(STEP_PARSE, |cx: &StepContext<'_>| {
        TrainStep::from_context(cx, false, false)
    })
    .step(STEP_TRANSFORM, |cx: &StepContext<'_>| {
        TrainStep::from_context(cx, true, false)
    })
    .step(STEP_BATCH, |cx: &StepContext<'_>| {
        TrainStep::from_context(cx, false, true)
    })
    .source(SOURCE_LINES, |cx: &SourceContext<'_>| {
        LinesSource::open(&path_arg(cx.args)?, group_arg(cx.args), cx.part, cx.parts)
    })
    .source(SOURCE_RANGES, |cx: &SourceContext<'_>| {
        I64Records::ranges(&path_arg(cx.args)?, group_arg(cx.args), cx.part, cx.parts)
    })
    .source(SOURCE_INDICES, |cx: &SourceContext<'_>| {
        I64Records::indices(&path_arg(cx.args)?, group_arg(cx.args), cx.part, cx.parts)
    })
    .source(SOURCE_PARSED, |cx: &SourceContext<'_>| {
        ParsedSource::open(
            &path_arg(cx.args)?,
            freq_arg(cx.args),
            group_arg(cx.args),
            cx.part,
            cx.parts,
        )
    })
}

fn path_arg(args: &serde_json::Value) -> Result<PathBuf, SourceError> {
    args["path"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| SourceError::Other("source needs a \"path\" argument".into()))
}

fn group_arg(args: &serde_json::Value) -> usize {
    args["group"]
        .as_u64()
        .map_or(DEFAULT_GROUP, |g| g.max(1) as usize)
}

fn freq_arg(args: &serde_json::Value) -> Result<Freq, String> {
    args["freq"]
        .as_str()
        .unwrap_or("h")
        .parse()
        .map_err(|e| format!("{e}"))
}

/// Converts an entry into a pipeline item (arrays moved, not copied).
pub fn entry_to_item(mut e: DataEntry) -> Item {
    let mut item = Item::new();
    for (name, a) in e.take_fields() {
        item.insert(&name, shmpipe::Array::F32(a.into_ndarray()));
    }
    if let Some(id) = &e.item_id {
        item.insert_meta(ITEM_ID_META, &**id);
    }
    if let Some(s) = e.start {
        item.insert_meta(START_META, s.ordinal);
    }
    if let Some(s) = e.forecast_start {
        item.insert_meta(FORECAST_START_META, s.ordinal);
    }
    item
}

/// Converts a pipeline item back into an entry of frequency `freq`.
///
/// # Errors
/// If an array is not `f32` or has more than [`crate::entry::MAX_NDIM`] dimensions.
pub fn item_to_entry(mut item: Item, freq: Freq) -> Result<DataEntry, StepError> {
    let mut e = DataEntry::default();
    let names: Vec<String> = item.arrays().map(|(n, _)| n.to_owned()).collect();
    for n in names {
        let a = item
            .remove(&n)
            .and_then(|a| a.into_typed::<f32>().ok())
            .ok_or_else(|| StepError::new(format!("array {n:?} is not f32")))?;
        if a.ndim() > crate::entry::MAX_NDIM {
            return Err(StepError::new(format!(
                "array {n:?} has too many dimensions"
            )));
        }
        e.insert(n, Array::from_ndarray(a));
    }
    if let Some(Meta::Str(id)) = item.meta(ITEM_ID_META) {
        e.item_id = Some(id.as_str().into());
    }
    if let Some(ordinal) = item.i64(START_META) {
        e.start = Some(Period { freq, ordinal });
    }
    if let Some(ordinal) = item.i64(FORECAST_START_META) {
        e.forecast_start = Some(Period { freq, ordinal });
    }
    Ok(e)
}

/// Converts a batch into one item: every stacked array, plus `forecast_start` ordinals.
pub fn batch_to_item(b: Batch) -> Item {
    let starts: Vec<i64> = b
        .forecast_starts
        .iter()
        .map(|p| p.map_or(i64::MIN, |p| p.ordinal))
        .collect();
    let mut item = Item::new().with(FORECAST_START_FIELD, Array1::from(starts));
    for (name, a) in b.into_fields() {
        item.insert(&name, shmpipe::Array::F32(a.into_ndarray()));
    }
    item
}

/// Rows in a batch item (length of its `forecast_start` array).
pub fn batch_rows(item: &Item) -> usize {
    item.get(FORECAST_START_FIELD)
        .and_then(|a| a.shape().first().copied())
        .unwrap_or(0)
}

/// The worker step: parse (raw lines), then optionally the chain, then
/// optionally batching. Entries and windows travel as items between stages.
///
/// A partial batch left at the end of the stream is emitted by [`Step::finish`]
/// (one per worker, with fewer than `batch_size` rows), so no window is lost.
struct TrainStep {
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
    fn from_context(
        cx: &StepContext<'_>,
        transform: bool,
        batch: bool,
    ) -> Result<TrainStep, StepError> {
        let a = cx.args;
        let cfg = ChainConfig::from_args(a).map_err(StepError::new)?;
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
    fn process(&mut self, mut item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        if let Some(ranges) = item
            .remove(RANGES_FIELD)
            .and_then(|a| a.into_typed::<i64>().ok())
        {
            use std::os::unix::fs::FileExt;
            let (file, path, mut buf) = self
                .file
                .take()
                .ok_or_else(|| StepError::new("line_ranges needs the step arg read_path"))?;
            let ranges: Vec<i64> = ranges.iter().copied().collect();
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
            result?;
        } else if let Some(numbers) = item
            .remove(LINES_FIELD)
            .and_then(|a| a.into_typed::<i64>().ok())
        {
            // Taken out for the loop (`run_ref` borrows `self`), put back after.
            let cache = self
                .cache
                .take()
                .ok_or_else(|| StepError::new("series_lines needs the step arg cache_path"))?;
            let mut result = Ok(());
            for &n in numbers.iter() {
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
            result?;
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

/// Packs entries into one record: series `j`'s fields and metadata named `"{j}/{name}"`.
pub fn group_items(entries: Vec<Item>) -> Item {
    let mut g = Item::new().with_meta(GROUP_META, entries.len() as i64);
    for (j, mut it) in entries.into_iter().enumerate() {
        let names: Vec<String> = it.arrays().map(|(n, _)| n.to_owned()).collect();
        for n in names {
            if let Some(a) = it.remove(&n) {
                g.insert(&format!("{j}/{n}"), a);
            }
        }
        for (n, m) in it.metas() {
            g.insert_meta(&format!("{j}/{n}"), m.clone());
        }
    }
    g
}

/// Unpacks a record made by [`group_items`] into `n` entries.
///
/// # Errors
/// A malformed name or a non-`f32` array.
pub fn split_group(mut item: Item, n: usize, freq: Freq) -> Result<Vec<DataEntry>, StepError> {
    let mut parts: Vec<Item> = (0..n).map(|_| Item::new()).collect();
    let index = |name: &str| -> Result<(usize, String), StepError> {
        let (j, rest) = name
            .split_once('/')
            .ok_or_else(|| StepError::new(format!("ungrouped field {name:?}")))?;
        let j: usize = j
            .parse()
            .ok()
            .filter(|&j| j < n)
            .ok_or_else(|| StepError::new(format!("bad group index in {name:?}")))?;
        Ok((j, rest.to_owned()))
    };
    let names: Vec<String> = item.arrays().map(|(n, _)| n.to_owned()).collect();
    for name in names {
        let (j, field) = index(&name)?;
        if let Some(a) = item.remove(&name) {
            parts[j].insert(&field, a);
        }
    }
    for (name, m) in item.metas() {
        if name == GROUP_META {
            continue;
        }
        let (j, field) = index(name)?;
        parts[j].insert_meta(&field, m.clone());
    }
    parts.into_iter().map(|p| item_to_entry(p, freq)).collect()
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

/// Records that are each one i64 array under `field`: byte ranges or line numbers of the
/// part's lines, or row numbers of a store (`rows.rs`), read by the workers themselves.
pub(crate) struct I64Records {
    pub(crate) field: &'static str,
    pub(crate) records: Vec<Vec<i64>>,
}

/// The part's non-blank lines as `(line number, byte range)`.
fn non_blank_lines(
    path: &Path,
    part: usize,
    parts: usize,
) -> Result<Vec<(i64, Range<usize>)>, SourceError> {
    let Part {
        data,
        lines,
        first_line,
    } = read_part(path, part, parts)?;
    Ok(lines
        .into_iter()
        .enumerate()
        .filter(|(_, r)| !data[r.clone()].iter().all(u8::is_ascii_whitespace))
        .map(|(i, r)| ((first_line + i as u64) as i64, r))
        .collect())
}

impl I64Records {
    /// Byte ranges: each record is `group` `(offset, length, line)` triples of non-blank lines.
    fn ranges(
        path: &Path,
        group: usize,
        part: usize,
        parts: usize,
    ) -> Result<I64Records, SourceError> {
        let triples: Vec<[i64; 3]> = non_blank_lines(path, part, parts)?
            .into_iter()
            .map(|(line, r)| [r.start as i64, r.len() as i64, line])
            .collect();
        Ok(I64Records {
            field: RANGES_FIELD,
            records: triples.chunks(group).map(|c| c.concat()).collect(),
        })
    }

    /// Line numbers: each record is `group` line numbers of non-blank lines.
    fn indices(
        path: &Path,
        group: usize,
        part: usize,
        parts: usize,
    ) -> Result<I64Records, SourceError> {
        let numbers: Vec<i64> = non_blank_lines(path, part, parts)?
            .into_iter()
            .map(|(line, _)| line)
            .collect();
        Ok(I64Records {
            field: LINES_FIELD,
            records: numbers.chunks(group).map(<[i64]>::to_vec).collect(),
        })
    }
}

impl Source for I64Records {
    fn len(&self) -> usize {
        self.records.len()
    }

    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        let r = self
            .records
            .get(index)
            .ok_or_else(|| SourceError::Other(format!("index {index} out of range")))?;
        Ok(Item::new().with(self.field, Array1::from(r.clone())))
    }
}

/// One emitter's part of a JSON-lines file.
struct Part {
    /// The whole file.
    data: Vec<u8>,
    /// Byte ranges of the part's lines (blank ones included).
    lines: Vec<Range<usize>>,
    /// 1-based number of the part's first line.
    first_line: u64,
}

/// Reads part `part` of `parts` (line-aligned byte ranges, as the pipeline splits files).
fn read_part(path: &Path, part: usize, parts: usize) -> Result<Part, SourceError> {
    let io = |e: std::io::Error| SourceError::Io {
        file: path.display().to_string(),
        message: e.to_string(),
    };
    let ranges = shmpipe::split_seeks(path, parts).map_err(io)?;
    let r = ranges
        .get(part)
        .cloned()
        .ok_or_else(|| SourceError::Other(format!("part {part} of {parts}")))?;
    let data = std::fs::read(path).map_err(io)?;
    let (start, end) = (r.start as usize, (r.end as usize).min(data.len()));
    let first_line = memchr::memchr_iter(b'\n', &data[..start]).count() as u64 + 1;
    let mut lines = Vec::new();
    let mut s = start;
    for i in memchr::memchr_iter(b'\n', &data[start..end]) {
        lines.push(s..start + i);
        s = start + i + 1;
    }
    if s < end {
        lines.push(s..end);
    }
    Ok(Part {
        data,
        lines,
        first_line,
    })
}

/// Raw lines: each record is the bytes of `group` consecutive lines, parsed by the workers.
struct LinesSource {
    data: Vec<u8>,
    /// Per record: byte range (whole lines) and 1-based number of its first line.
    records: Vec<(Range<usize>, u64)>,
}

impl LinesSource {
    fn open(
        path: &Path,
        group: usize,
        part: usize,
        parts: usize,
    ) -> Result<LinesSource, SourceError> {
        let Part {
            data,
            lines,
            first_line,
        } = read_part(path, part, parts)?;
        let records = lines
            .chunks(group)
            .enumerate()
            .map(|(k, c)| {
                (
                    c[0].start..c[c.len() - 1].end,
                    first_line + (k * group) as u64,
                )
            })
            .collect();
        Ok(LinesSource { data, records })
    }
}

impl Source for LinesSource {
    fn len(&self) -> usize {
        self.records.len()
    }

    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        let (r, line) = self
            .records
            .get(index)
            .cloned()
            .ok_or_else(|| SourceError::Other(format!("index {index} out of range")))?;
        Ok(Item::new()
            .with(LINE_FIELD, Array1::from(self.data[r].to_vec()))
            .with_meta(LINE_NO_META, line as i64))
    }
}

/// Entries parsed once at start, served from memory in groups. A malformed line is
/// reported when its group is read, so the pipeline's bad-record policy applies
/// (skipping drops the whole group).
struct ParsedSource {
    items: Vec<Result<Item, SourceError>>,
}

impl ParsedSource {
    fn open(
        path: &Path,
        freq: Result<Freq, String>,
        group: usize,
        part: usize,
        parts: usize,
    ) -> Result<ParsedSource, SourceError> {
        let freq = freq.map_err(SourceError::Other)?;
        let Part {
            data,
            lines: ranges,
            first_line: first,
        } = read_part(path, part, parts)?;
        let mut items = Vec::with_capacity(ranges.len());
        for (i, r) in ranges.into_iter().enumerate() {
            let line = &data[r];
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            items.push(parse_entry(line, freq).map(entry_to_item).map_err(|e| {
                SourceError::BadRecord {
                    file: path.display().to_string(),
                    line: first + i as u64,
                    field: e.field.clone(),
                    message: e.to_string(),
                }
            }));
        }
        // Group `group` series per record; a group with a bad line is that line's error.
        let mut grouped = Vec::with_capacity(items.len().div_ceil(group));
        let mut it = items.into_iter().peekable();
        while it.peek().is_some() {
            let chunk: Result<Vec<Item>, SourceError> = it.by_ref().take(group).collect();
            grouped.push(chunk.map(group_items));
        }
        Ok(ParsedSource { items: grouped })
    }
}

impl Source for ParsedSource {
    fn len(&self) -> usize {
        self.items.len()
    }

    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        self.items
            .get(index)
            .cloned()
            .unwrap_or_else(|| Err(SourceError::Other(format!("index {index} out of range"))))
    }
}

/// Runs the workload with `cfg.workers` worker processes and `cfg.emitters` emitters,
/// calling `progress` after every batch. `reg` must come from [`register`] and
/// [`shmpipe::init`] must have been called with it at the top of `main`.
///
/// Rates are measured from the first batch received to the last, so process
/// start-up (and, for [`WorkloadSource::ParsedOnce`], the one-time parse) is excluded;
/// the first batch is not counted.
///
/// # Errors
/// [`WorkloadError::Pipeline`] with the pipeline's error (which names the file,
/// line and field of a malformed record), or for a [`WorkloadSource::Memory`] source.
pub fn run_workload(
    reg: &Registry,
    cfg: &WorkloadConfig,
    progress: impl FnMut(&WorkloadStats),
) -> Result<WorkloadStats, WorkloadError> {
    run_workload_with(reg, cfg, Layout::Fused, progress)
}

/// How the work is laid out over worker processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// One step ([`STEP_TRAIN`]) in `cfg.workers` workers (the default).
    Fused,
    /// Three stages ([`STEP_PARSE`], [`STEP_TRANSFORM`], [`STEP_BATCH`]) with the given
    /// numbers of workers, connected by the pipeline's staged topology.
    Staged {
        /// Workers per stage.
        workers: [usize; 3],
    },
}

/// [`run_workload`] with an explicit [`Layout`].
///
/// # Errors
/// As [`run_workload`].
pub fn run_workload_with(
    reg: &Registry,
    cfg: &WorkloadConfig,
    layout: Layout,
    progress: impl FnMut(&WorkloadStats),
) -> Result<WorkloadStats, WorkloadError> {
    let perr = |e: shmpipe::Error| WorkloadError::Pipeline(e.to_string());
    let (source, args, input_bytes) = match &cfg.source {
        WorkloadSource::JsonLines(p) => (SOURCE_LINES, p, file_len(p)),
        WorkloadSource::ParsedOnce(p) => (SOURCE_PARSED, p, 0),
        WorkloadSource::InWorkers(p) => (SOURCE_INDICES, p, 0),
        WorkloadSource::JsonLinesInWorkers(p) => (SOURCE_RANGES, p, file_len(p)),
        WorkloadSource::Memory(_) => {
            return Err(WorkloadError::Pipeline(
                "WorkloadSource::Memory cannot cross processes; use ParsedOnce".into(),
            ));
        }
    };
    let c = &cfg.chain;
    let mut step_args = c.to_args();
    step_args["batch_size"] = json!(cfg.batch_size);
    match &cfg.source {
        WorkloadSource::InWorkers(p) => step_args["cache_path"] = json!(p.display().to_string()),
        WorkloadSource::JsonLinesInWorkers(p) => {
            step_args["read_path"] = json!(p.display().to_string())
        }
        _ => {}
    }
    let b = Pipeline::builder(reg)
        .source_named(
            source,
            json!({
                "path": args.display().to_string(),
                "freq": c.freq.to_string(),
                "group": cfg.group,
            }),
        )
        .emitters(cfg.emitters.max(1))
        .epochs(Epochs::Finite(cfg.epochs as u64))
        .seed(cfg.seed);
    let b = match layout {
        Layout::Fused => b
            .step_with(STEP_TRAIN, step_args)
            .workers(cfg.workers.max(1)),
        Layout::Staged { workers } => b
            .step_with(STEP_PARSE, step_args.clone())
            .step_with(STEP_TRANSFORM, step_args.clone())
            .step_with(STEP_BATCH, step_args)
            .topology(Topology::Staged {
                workers: workers.iter().map(|&w| w.max(1)).collect(),
            }),
    };
    let mut p = b.start().map_err(perr)?;
    let mut stats = consume_batches(&mut p, progress)?;
    stats.input_bytes = input_bytes * cfg.epochs as u64;
    Ok(stats)
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}
