//! The names the pipeline's steps, sources and items use: step and source names, item
//! fields and metadata keys (re-exported by [`crate::pipeline`]).

/// Step: parse (if the item is a raw line), run the DeepAR-style chain, batch.
/// Args: [`ChainConfig::to_args`](crate::workload::ChainConfig::to_args) (`{"freq",
/// "context_length", "prediction_length", "num_instances", "fused", "split", "min_past",
/// "min_future", "mean_window"}`) and `"batch_size"`; for training without `"mean_window"`,
/// `"data_path"` (the file) makes each worker compute it
/// ([`crate::workload::mean_window`]). Windows are drawn from each record's
/// seed ([`shmpipe::item_seed`]): with a mean window they are the same for any number of
/// workers.
pub const STEP_TRAIN: &str = "gluonts_train";
/// Step: parse raw lines into entries only (for the staged layout).
pub const STEP_PARSE: &str = "gluonts_parse";
/// Step: run the chain only, one item per window (args as [`STEP_TRAIN`]).
pub const STEP_TRANSFORM: &str = "gluonts_transform";
/// Step: stack windows into batches only (`{"batch_size"}`).
pub const STEP_BATCH: &str = "gluonts_batch";
/// Source: the raw lines of a JSON-lines file (`{"path", "group_bytes"}`), parsed by the
/// workers on every pass; one record holds consecutive lines of up to `group_bytes` bytes
/// together (default [`DEFAULT_GROUP_BYTES`]; a longer line alone).
pub const SOURCE_LINES: &str = "gluonts_lines";
/// Source: a JSON-lines file (`{"path", "freq", "group_bytes"}`) parsed once by the
/// emitter, then served from memory on every pass; one record holds series of up to
/// `group_bytes` bytes of arrays together.
pub const SOURCE_PARSED: &str = "gluonts_parsed";

/// Source: the line numbers of a JSON-lines file (`{"path", "group_bytes"}`), those of
/// lines of up to `group_bytes` bytes together per record; the workers hold the parsed file
/// (step arg `"cache_path"`) and look the series up, like a map-style dataset with an index
/// sampler (PyTorch's `DataLoader`).
pub const SOURCE_INDICES: &str = "gluonts_indices";
/// Source: byte ranges of the lines of a JSON-lines file (`{"path", "group_bytes"}`),
/// grouped as [`SOURCE_INDICES`]; the workers read (`pread`) and parse those bytes on every
/// pass (step arg `"read_path"`).
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
/// Default bytes of series (JSON text, or parsed arrays) per record crossing from an emitter
/// to a worker: records stay far below a pool block and the work per record even, while a
/// record of short series still carries many of them.
pub const DEFAULT_GROUP_BYTES: usize = 64 << 10;
/// Array of a batch item: `forecast_start` ordinals, `i64`, one per row.
pub const FORECAST_START_FIELD: &str = "forecast_start";
/// Array of a batch item: `start` ordinals, `i64`, one per row.
pub const START_FIELD: &str = "start";
/// Metadata of a batch item: the rows' `item_id`s as a JSON list (`null` for none).
pub const ITEM_IDS_META: &str = "item_ids";
