//! The workload over datasets that every worker reads in place: a GluonTS Arrow file
//! copied once into a sealed memfd (every worker maps the same pages) or a
//! [`SharedDataset`] (a sealed memfd of parsed series made by the parent). Both reach the
//! workers by descriptor ([`PipelineBuilder::share_fd`]), never by name or number. Emitters
//! send only row numbers; workers look the series up, run the chain and batch.
//!
//! ```no_run
//! use shmpipe_timeseries::rows::{register_rows, run_rows, RowStore, RowsWorkload};
//! use shmpipe_timeseries::workload::ChainConfig;
//!
//! let reg = register_rows(shmpipe::Registry::new());
//! shmpipe::init(&reg); // worker and emitter processes run their role here and exit
//! let store = RowStore::arrow_shared("data.feather")?;
//! let cfg = RowsWorkload { chain: ChainConfig::default(), batch_size: 32, epochs: 3,
//!     workers: 2, emitters: 1, group: 16, seed: 0, transform: true };
//! let stats = run_rows(&reg, &store, &cfg, |_| {}).unwrap();
//! println!("{:.0} windows/s", stats.windows_per_sec());
//! # Ok::<(), shmpipe_timeseries::workload::WorkloadError>(())
//! ```

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde_json::json;
use shmpipe::{
    Epochs, Item, Pipeline, PipelineBuilder, Registry, SourceContext, SourceError, Step,
    StepContext, StepError,
};

use crate::arrow::ArrowDataset;
use crate::batch::Batcher;
use crate::entry::DataEntry;
use crate::period::Freq;
use crate::pipeline::{I64Records, batch_to_item, consume_batches, entry_to_item};
use crate::shared::SharedDataset;
use crate::transform::Chain;
use crate::workload::{ChainConfig, Split, WorkloadError, WorkloadStats, training_chain};

/// Source: the row numbers `0..rows` (`{"rows", "group"}`), `group` per record.
pub const SOURCE_ROWS: &str = "gluonts_rows";
/// Step: look rows up in the store named by the args, run the chain (unless
/// `"transform": false`) and batch (unless `"batch": false`).
/// Store args (made by [`RowStore::step_args`]): `{"arrow_path"}` (each worker reads the
/// file into its own memory), `{"arrow_memfd": handle}` or `{"shared": handle}` (a sealed
/// memfd shared with [`PipelineBuilder::share_fd`]). Nothing in the args can make a worker
/// map a file that may change: the old `"mapped": true` is refused.
pub const STEP_ROWS: &str = "gluonts_train_rows";
/// Name of the `i64` array of row numbers sent by [`SOURCE_ROWS`].
pub const ROWS_FIELD: &str = "series_rows";
/// Name of the memfd an Arrow file is copied into (`/memfd:<name>` in `/proc/<pid>/maps`).
pub const ARROW_MEMFD_NAME: &str = "shmpipe-ts-arrow";

/// Where the workers find the series.
#[derive(Debug)]
pub struct RowStore(StoreSpec);

#[derive(Debug)]
enum StoreSpec {
    /// A GluonTS Arrow IPC file or stream, or Parquet file, read by each worker into its
    /// own memory.
    ArrowRead(PathBuf),
    /// An Arrow IPC file or stream copied into a sealed memfd, mapped by every worker.
    ArrowShared { path: PathBuf, memfd: OwnedFd },
    /// A dataset in a sealed memfd of this process.
    Shared(SharedDataset),
}

impl RowStore {
    /// A dataset in a sealed memfd of this process: the workers receive the memfd and map it.
    pub fn shared(ds: SharedDataset) -> RowStore {
        RowStore(StoreSpec::Shared(ds))
    }

    /// An Arrow IPC file or stream that every worker maps in place (one copy for all, arrays
    /// read in place): the file is copied once into a sealed memfd, so it may change or be
    /// truncated afterwards without reaching the workers (no SIGBUS; issue 16, hole 4). Costs
    /// one copy of the file in memory for the pipeline, not one per worker.
    ///
    /// # Errors
    /// If the file cannot be read or copied (out of memory is an error here).
    pub fn arrow_shared(path: impl AsRef<Path>) -> Result<RowStore, WorkloadError> {
        let path = path.as_ref();
        let memfd = crate::shared::memfd::copy_of_file(path, ARROW_MEMFD_NAME)
            .map_err(|e| WorkloadError::Pipeline(e.to_string()))?;
        Ok(RowStore(StoreSpec::ArrowShared {
            path: path.to_path_buf(),
            memfd,
        }))
    }

    /// An Arrow (or Parquet) file that every worker reads into its own memory.
    pub fn arrow_read(path: impl AsRef<Path>) -> RowStore {
        RowStore(StoreSpec::ArrowRead(path.as_ref().to_path_buf()))
    }

    /// Number of series (opens the dataset for an Arrow store).
    fn rows(&self, freq: Freq) -> Result<usize, String> {
        match &self.0 {
            StoreSpec::ArrowRead(path) => Ok(ArrowDataset::open(path, freq)
                .map_err(|e| e.to_string())?
                .len()),
            StoreSpec::ArrowShared { path, memfd } => {
                let fd = memfd.try_clone().map_err(|e| e.to_string())?;
                Ok(ArrowDataset::from_sealed_memfd(path, fd, freq)
                    .map_err(|e| e.to_string())?
                    .len())
            }
            StoreSpec::Shared(ds) => Ok(ds.len()),
        }
    }

    /// The training sampler's mean admissible window over the store's series (see
    /// [`ChainConfig::mean_window`]; opens the dataset for an Arrow store).
    fn mean_window(&self, cfg: &ChainConfig) -> Result<Option<f64>, String> {
        let lens: Vec<usize> = match &self.0 {
            StoreSpec::ArrowRead(path) => {
                target_lens(&ArrowDataset::open(path, cfg.freq).map_err(|e| e.to_string())?)?
            }
            StoreSpec::ArrowShared { path, memfd } => {
                let fd = memfd.try_clone().map_err(|e| e.to_string())?;
                target_lens(
                    &ArrowDataset::from_sealed_memfd(path, fd, cfg.freq)
                        .map_err(|e| e.to_string())?,
                )?
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
        Ok(
            (!windows.is_empty())
                .then(|| windows.iter().sum::<u64>() as f64 / windows.len() as f64),
        )
    }

    /// The store's part of the step args; shares its memfd with the pipeline of `b`.
    fn args(&self, b: &mut PipelineBuilder) -> Result<serde_json::Value, WorkloadError> {
        let share = |b: &mut PipelineBuilder, fd| {
            b.share_fd(fd)
                .map_err(|e| WorkloadError::Pipeline(e.to_string()))
        };
        Ok(match &self.0 {
            StoreSpec::ArrowRead(path) => json!({"arrow_path": path.display().to_string()}),
            StoreSpec::ArrowShared { path, memfd } => json!({
                "arrow_memfd": share(b, memfd.as_fd())?,
                "arrow_name": path.display().to_string(),
            }),
            StoreSpec::Shared(ds) => json!({"shared": share(b, ds.as_fd())?}),
        })
    }
}

/// What the worker holds.
#[derive(Debug)]
enum Store {
    Arrow(ArrowDataset),
    Shared(SharedDataset),
}

impl Store {
    fn from_args(cx: &StepContext<'_>, freq: Freq) -> Result<Store, StepError> {
        let a = cx.args;
        if a.get("mapped").is_some() {
            return Err(StepError::new(
                "gluonts_train_rows: the \"mapped\" argument is gone (workers mapping a file that \
                 may be truncated die with SIGBUS); use RowStore::arrow_shared, a sealed copy",
            ));
        }
        if let Some(p) = a["arrow_path"].as_str() {
            return ArrowDataset::open(Path::new(p), freq)
                .map(Store::Arrow)
                .map_err(StepError::new);
        }
        // A descriptor of our own, kept by the dataset's mapping.
        let owned = |key: &str| -> Result<OwnedFd, StepError> {
            cx.shared_fd(key)?
                .try_clone_to_owned()
                .map_err(|e| StepError::new(format!("{key}: {e}")))
        };
        if a.get("arrow_memfd").is_some() {
            let name = a["arrow_name"].as_str().unwrap_or("arrow dataset");
            return ArrowDataset::from_sealed_memfd(name, owned("arrow_memfd")?, freq)
                .map(Store::Arrow)
                .map_err(StepError::new);
        }
        if a.get("shared").is_some() {
            let ds = SharedDataset::open_fd(owned("shared")?).map_err(StepError::new)?;
            if ds.freq() != freq {
                return Err(StepError::new(format!(
                    "shared dataset has frequency {}, the chain {freq}",
                    ds.freq()
                )));
            }
            return Ok(Store::Shared(ds));
        }
        Err(StepError::new(
            "gluonts_train_rows needs \"arrow_path\", \"arrow_memfd\" or \"shared\" (see \
             RowStore::step_args)",
        ))
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
    /// Windows drawn from the record's own seed ([`shmpipe::item_seed`]), as
    /// [`STEP_TRAIN`](crate::pipeline::STEP_TRAIN) does: the same for any number of workers.
    fn process(&mut self, mut item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        if let (Some(chain), Some(seed)) = (&mut self.chain, shmpipe::item_seed()) {
            chain.reseed(seed);
        }
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

/// Time lengths of the targets of an Arrow dataset.
fn target_lens(d: &ArrowDataset) -> Result<Vec<usize>, String> {
    (0..d.len())
        .map(|i| d.entry(i).map(|e| target_len(&e)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())
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
        let store = Store::from_args(cx, cfg.freq)?;
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

impl RowStore {
    /// The arguments of [`STEP_ROWS`] that run `cfg`'s chain over this store, for a pipeline
    /// built with `b` (what [`start_rows`] uses; for pipelines composed by hand). A memfd
    /// store is shared with `b`'s children ([`PipelineBuilder::share_fd`]): the pipeline
    /// holds it from then on, so dropping the store after `start()` changes nothing for
    /// the workers.
    ///
    /// # Errors
    /// If the store cannot be handed to the pipeline.
    pub fn step_args(
        &self,
        b: &mut PipelineBuilder,
        cfg: &RowsWorkload,
    ) -> Result<serde_json::Value, WorkloadError> {
        let mut chain = cfg.chain.clone();
        // The same windows for any number of workers (see `ChainConfig::mean_window`).
        if chain.split == Split::Train && chain.mean_window.is_none() {
            chain.mean_window = self.mean_window(&chain).map_err(WorkloadError::Pipeline)?;
        }
        let mut args = chain.to_args();
        if let Some(a) = args.as_object_mut() {
            a.extend([
                ("batch_size".to_string(), json!(cfg.batch_size)),
                ("transform".to_string(), json!(cfg.transform)),
                ("batch".to_string(), json!(cfg.transform)),
            ]);
            if let serde_json::Value::Object(s) = self.args(b)? {
                a.extend(s);
            }
        }
        Ok(args)
    }

    /// The arguments of [`SOURCE_ROWS`] over this store, `cfg.group` rows per record.
    ///
    /// # Errors
    /// If the store cannot be opened.
    pub fn source_args(&self, cfg: &RowsWorkload) -> Result<serde_json::Value, WorkloadError> {
        let rows = self.rows(cfg.chain.freq).map_err(WorkloadError::Pipeline)?;
        Ok(json!({"rows": rows, "group": cfg.group}))
    }
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
    let mut b = Pipeline::builder(reg);
    let args = store.step_args(&mut b, cfg)?;
    b.source_named(SOURCE_ROWS, store.source_args(cfg)?)
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
