//! The workload over datasets that every worker reads in place: a GluonTS Arrow file
//! (memory-mapped by each worker: the page cache holds it once) or a
//! [`SharedDataset`] (a sealed memfd made by the parent). Emitters send only row
//! numbers; workers look the series up, run the chain and batch.
//!
//! ```no_run
//! use shmpipe_timeseries::rows::{register_rows, run_rows, RowStore, RowsWorkload};
//! use shmpipe_timeseries::workload::ChainConfig;
//!
//! let reg = register_rows(shmpipe::Registry::new());
//! shmpipe::init(&reg); // worker and emitter processes run their role here and exit
//! // SAFETY: the file is not modified while the pipeline runs.
//! let store = unsafe { RowStore::arrow_mapped("data.feather") };
//! let cfg = RowsWorkload { chain: ChainConfig::default(), batch_size: 32, epochs: 3,
//!     workers: 2, emitters: 1, group: 16, seed: 0, transform: true };
//! let stats = run_rows(&reg, &store, &cfg, |_| {}).unwrap();
//! println!("{:.0} windows/s", stats.windows_per_sec());
//! ```

use std::path::{Path, PathBuf};

use serde_json::json;
use shmpipe::{
    Epochs, Item, Pipeline, Registry, SourceContext, SourceError, Step, StepContext, StepError,
};

use crate::arrow::ArrowDataset;
use crate::batch::Batcher;
use crate::entry::DataEntry;
use crate::period::Freq;
use crate::pipeline::{I64Records, batch_to_item, entry_to_item};
use crate::shared::SharedDataset;
use crate::transform::Chain;
use crate::workload::{ChainConfig, WorkloadError, WorkloadStats, consume_batches, training_chain};

/// Source: the row numbers `0..rows` (`{"rows", "group"}`), `group` per record.
pub const SOURCE_ROWS: &str = "gluonts_rows";
/// Step: look rows up in the store named by the args, run the chain (unless
/// `"transform": false`) and batch (unless `"batch": false`).
/// Store args: `{"arrow_path", "mapped"}` or `{"shared_pid", "shared_fd"}`. Passing
/// `"mapped": true` by hand takes on the contract of [`RowStore::arrow_mapped`] (the
/// file is not modified while the pipeline runs).
pub const STEP_ROWS: &str = "gluonts_train_rows";
/// Name of the `i64` array of row numbers sent by [`SOURCE_ROWS`].
pub const ROWS_FIELD: &str = "series_rows";

/// Where the workers find the series.
#[derive(Debug)]
pub struct RowStore(StoreSpec);

#[derive(Debug)]
enum StoreSpec {
    /// A GluonTS Arrow IPC file or stream, or Parquet file; memory-mapped by each
    /// worker when `mapped` (only set by the unsafe [`RowStore::arrow_mapped`]).
    Arrow { path: PathBuf, mapped: bool },
    /// A dataset in a sealed memfd of this process, opened by the workers.
    Shared(SharedDataset),
}

impl RowStore {
    /// A dataset in a sealed memfd of this process: the workers open and map it.
    pub fn shared(ds: SharedDataset) -> RowStore {
        RowStore(StoreSpec::Shared(ds))
    }

    /// An Arrow IPC file or stream that every worker memory-maps (one copy in the page
    /// cache, arrays read in place).
    ///
    /// # Safety
    /// As [`ArrowDataset::map`]: the file must not be modified or truncated while
    /// the pipeline runs.
    pub unsafe fn arrow_mapped(path: impl AsRef<Path>) -> RowStore {
        RowStore(StoreSpec::Arrow {
            path: path.as_ref().to_path_buf(),
            mapped: true,
        })
    }

    /// An Arrow (or Parquet) file that every worker reads into its own memory.
    pub fn arrow_read(path: impl AsRef<Path>) -> RowStore {
        RowStore(StoreSpec::Arrow {
            path: path.as_ref().to_path_buf(),
            mapped: false,
        })
    }

    /// Number of series, and the training sampler's mean admissible window over them (see
    /// [`ChainConfig::mean_window`]; opens the file for an Arrow store).
    fn rows(&self, cfg: &ChainConfig) -> Result<(usize, Option<f64>), String> {
        let lens: Vec<usize> = match &self.0 {
            StoreSpec::Arrow { path, mapped } => {
                let d = open_arrow(path, *mapped, cfg.freq)?;
                (0..d.len())
                    .map(|i| d.entry(i).map(|e| target_len(&e)))
                    .collect::<Result<_, _>>()
                    .map_err(|e| e.to_string())?
            }
            StoreSpec::Shared(ds) => (0..ds.len())
                .map(|i| ds.entry(i).map(|e| target_len(&e)))
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?,
        };
        let (min_past, min_future) = (cfg.min_past, cfg.min_future());
        let windows: Vec<u64> = lens
            .iter()
            .map(|&n| crate::sampler::bounds(n, min_past, min_future))
            .filter(|(a, b)| b >= a)
            .map(|(a, b)| (b - a + 1) as u64)
            .collect();
        let mean = (!windows.is_empty())
            .then(|| windows.iter().sum::<u64>() as f64 / windows.len() as f64);
        Ok((lens.len(), mean))
    }

    fn args(&self) -> serde_json::Value {
        match &self.0 {
            StoreSpec::Arrow { path, mapped } => {
                json!({"arrow_path": path.display().to_string(), "mapped": mapped})
            }
            StoreSpec::Shared(ds) => {
                let (pid, fd) = ds.handle();
                json!({"shared_pid": pid, "shared_fd": fd})
            }
        }
    }
}

fn open_arrow(path: &Path, mapped: bool, freq: Freq) -> Result<ArrowDataset, String> {
    if mapped {
        // SAFETY: Delegated to whoever asked for a mapping: `RowStore::arrow_mapped` is
        // unsafe with the contract that the file is not modified during the run, and
        // `STEP_ROWS` documents that the step arg `"mapped": true` carries it too.
        unsafe { ArrowDataset::map(path, freq) }.map_err(|e| e.to_string())
    } else {
        ArrowDataset::open(path, freq).map_err(|e| e.to_string())
    }
}

/// What the worker holds.
#[derive(Debug)]
enum Store {
    Arrow(ArrowDataset),
    Shared(SharedDataset),
}

impl Store {
    fn from_args(a: &serde_json::Value, freq: Freq) -> Result<Store, StepError> {
        if let Some(p) = a["arrow_path"].as_str() {
            let mapped = a["mapped"].as_bool().unwrap_or(false);
            return open_arrow(Path::new(p), mapped, freq)
                .map(Store::Arrow)
                .map_err(StepError::new);
        }
        match (a["shared_pid"].as_u64(), a["shared_fd"].as_i64()) {
            (Some(pid), Some(fd)) => {
                let ds = SharedDataset::open_proc(pid as u32, fd as i32).map_err(StepError::new)?;
                if ds.freq() != freq {
                    return Err(StepError::new(format!(
                        "shared dataset has frequency {}, the chain {freq}",
                        ds.freq()
                    )));
                }
                Ok(Store::Shared(ds))
            }
            _ => Err(StepError::new(
                "gluonts_train_rows needs \"arrow_path\" or \"shared_pid\" and \"shared_fd\"",
            )),
        }
    }

    fn entry(&self, i: usize) -> Result<DataEntry, StepError> {
        match self {
            Store::Arrow(d) => d.entry(i).map_err(StepError::new),
            Store::Shared(d) => d.entry(i).map_err(StepError::new),
        }
    }
}

/// Chain parameters from step args (missing keys take [`ChainConfig::default`]'s values).
fn chain_config(a: &serde_json::Value) -> Result<ChainConfig, StepError> {
    ChainConfig::from_args(a).map_err(StepError::new)
}

/// Worker step: rows -> entries -> chain -> batches.
struct RowsStep {
    store: Store,
    chain: Option<Chain>,
    batcher: Option<Batcher>,
    windows: Vec<DataEntry>,
}

impl Step for RowsStep {
    /// Windows drawn from the record's own seed, as [`STEP_TRAIN`](crate::pipeline::STEP_TRAIN)
    /// does: the same for any number of workers.
    fn process_in(
        &mut self,
        item: Item,
        cx: &shmpipe::ItemContext,
        out: &mut Vec<Item>,
    ) -> Result<(), StepError> {
        if let Some(chain) = &mut self.chain {
            chain.reseed(cx.seed);
        }
        self.process(item, out)
    }

    fn process(&mut self, mut item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        let rows = item
            .remove(ROWS_FIELD)
            .and_then(|a| a.into_typed::<i64>().ok())
            .ok_or_else(|| StepError::new(format!("expected an i64 array {ROWS_FIELD:?}")))?;
        for &r in rows.iter() {
            let r = usize::try_from(r).map_err(|_| StepError::new(format!("row {r}")))?;
            let e = self.store.entry(r)?;
            self.windows.clear();
            match &mut self.chain {
                Some(c) => c
                    .apply(e, true, &mut self.windows)
                    .map_err(StepError::new)?,
                None => self.windows.push(e),
            }
            for w in self.windows.drain(..) {
                match &mut self.batcher {
                    Some(b) => {
                        if let Some(b) = b.push(w) {
                            out.push(batch_to_item(b.map_err(StepError::new)?));
                        }
                    }
                    None => out.push(entry_to_item(w).with_meta(ROW_META, r as i64)),
                }
            }
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

/// Time length of an entry's target (0 without one).
fn target_len(e: &DataEntry) -> usize {
    e.get(crate::field::TARGET).map_or(0, |t| t.time_len())
}

/// Metadata of an unbatched output: the row it came from.
pub const ROW_META: &str = "row";

/// Adds [`SOURCE_ROWS`] and [`STEP_ROWS`] to a registry.
pub fn register_rows(reg: Registry) -> Registry {
    reg.step(STEP_ROWS, |cx: &StepContext<'_>| {
        let a = cx.args;
        let cfg = chain_config(a)?;
        let store = Store::from_args(a, cfg.freq)?;
        let batch_size = a["batch_size"].as_u64().unwrap_or(32) as usize;
        Ok(RowsStep {
            store,
            chain: a["transform"]
                .as_bool()
                .unwrap_or(true)
                .then(|| training_chain(&cfg, cx.worker.seed)),
            batcher: a["batch"]
                .as_bool()
                .unwrap_or(true)
                .then(|| Batcher::new(batch_size)),
            windows: Vec::new(),
        })
    })
    .source(SOURCE_ROWS, |cx: &SourceContext<'_>| {
        let rows = cx.args["rows"]
            .as_u64()
            .ok_or_else(|| SourceError::Other("gluonts_rows needs \"rows\"".into()))?;
        let group = cx.args["group"].as_u64().map_or(1, |g| g.max(1)) as usize;
        let part: Vec<i64> = shmpipe::part_range(rows as usize, cx.part, cx.parts)
            .map(|r| r as i64)
            .collect();
        // The part's row numbers, `group` per record.
        Ok(I64Records {
            field: ROWS_FIELD,
            records: part.chunks(group).map(<[i64]>::to_vec).collect(),
        })
    })
}

/// What to run over a [`RowStore`].
#[derive(Clone, Debug)]
pub struct RowsWorkload {
    /// The chain.
    pub chain: ChainConfig,
    /// Windows per batch.
    pub batch_size: usize,
    /// Passes over the data.
    pub epochs: usize,
    /// Worker processes.
    pub workers: usize,
    /// Emitter processes (they send row numbers only).
    pub emitters: usize,
    /// Rows per record sent to a worker.
    pub group: usize,
    /// Seed of the samplers.
    pub seed: u64,
    /// Run the chain and batch (`false`: the workers send the entries themselves).
    pub transform: bool,
}

/// Starts the pipeline over `store` (the caller reads the outputs).
///
/// # Errors
/// If the store cannot be opened or the pipeline cannot start.
pub fn start_rows(
    reg: &Registry,
    store: &RowStore,
    cfg: &RowsWorkload,
) -> Result<Pipeline, WorkloadError> {
    let mut c = cfg.chain.clone();
    let (rows, mean) = store.rows(&c).map_err(WorkloadError::Pipeline)?;
    // The same windows for any number of workers (see `ChainConfig::mean_window`).
    if c.mean_window.is_none() {
        c.mean_window = mean;
    }
    let mut args = c.to_args();
    if let Some(a) = args.as_object_mut() {
        a.extend([
            ("batch_size".to_string(), json!(cfg.batch_size)),
            ("transform".to_string(), json!(cfg.transform)),
            ("batch".to_string(), json!(cfg.transform)),
        ]);
        if let serde_json::Value::Object(s) = store.args() {
            a.extend(s);
        }
    }
    Pipeline::builder(reg)
        .source_named(SOURCE_ROWS, json!({"rows": rows, "group": cfg.group}))
        .emitters(cfg.emitters.max(1))
        .epochs(Epochs::Finite(cfg.epochs as u64))
        .seed(cfg.seed)
        .step_with(STEP_ROWS, args)
        .workers(cfg.workers.max(1))
        .start()
        .map_err(|e| WorkloadError::Pipeline(e.to_string()))
}

/// Runs the training workload over `store`, calling `progress` after every batch
/// (rates from the first batch to the last, as [`crate::pipeline::run_workload`]).
///
/// # Errors
/// As [`start_rows`], or the pipeline's error.
pub fn run_rows(
    reg: &Registry,
    store: &RowStore,
    cfg: &RowsWorkload,
    progress: impl FnMut(&WorkloadStats),
) -> Result<WorkloadStats, WorkloadError> {
    let mut p = start_rows(reg, store, cfg)?;
    consume_batches(&mut p, progress)
}
