//! The workload over stores every worker reads in place (a GluonTS Arrow file copied
//! into a sealed memfd, a sealed memfd of parsed series), as a real multi-process pipeline:
//! every series reaches the workers intact, and the window counts are exact; a store dropped
//! after `start()` and safe step arguments cannot make workers read the wrong data or die.
//!
//! Each test re-executes this binary as workers and emitters (`shmpipe::init`).

mod common;

use common::same;
use shmpipe_timeseries::arrow::ArrowDataset;
use shmpipe_timeseries::pipeline::item_to_entry;
use shmpipe_timeseries::rows::{
    ROW_META, ROWS_FIELD, RowStore, RowsWorkload, SOURCE_ROWS, STEP_ROWS, register_rows, run_rows,
    start_rows,
};
use shmpipe_timeseries::shared::SharedDataset;
use shmpipe_timeseries::synth::{GenConfig, to_bytes};
use shmpipe_timeseries::workload::ChainConfig;
use shmpipe_timeseries::{DataEntry, Freq, jsonl};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/arrow/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A copy of fixture `name` in a temporary file (removed when the test ends) that the test
/// may change.
fn fixture_copy(name: &str, tag: &str) -> shmpipe_test_kit::TempFile {
    let copy = shmpipe_test_kit::TempFile::new(tag, "feather");
    std::fs::copy(fixture(name), &copy.0).unwrap();
    copy
}

/// The rows registry (after `shmpipe::init`), the daily frequency and a copy of the daily
/// fixture (tagged `tag`) that the test may change.
fn daily_copy(tag: &str) -> (shmpipe::Registry, Freq, shmpipe_test_kit::TempFile) {
    let reg = register_rows(shmpipe::Registry::new());
    shmpipe::init(&reg);
    let freq: Freq = "D".parse().unwrap();
    (reg, freq, fixture_copy("daily.feather", tag))
}

/// Cuts the file at `path` to nothing (under a reader that may have it mapped).
fn truncate(path: &std::path::Path) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(0)
        .unwrap();
}

fn workload(freq: Freq, transform: bool) -> RowsWorkload {
    RowsWorkload {
        // Every admissible point: an exact count.
        chain: ChainConfig {
            freq,
            ..common::exhaustive_chain()
        },
        batch_size: 1,
        epochs: 2,
        workers: 2,
        emitters: 1,
        group: 2,
        seed: 3,
        transform,
    }
}

/// Windows the chain gives for `entries` in one process (exhaustive sampler: seed-free).
fn windows_in_process(entries: &[DataEntry], cfg: &RowsWorkload) -> u64 {
    let mut chain = shmpipe_timeseries::workload::training_chain(&cfg.chain, 0);
    let mut out = Vec::new();
    for e in entries {
        chain.apply(e.clone(), true, &mut out).unwrap();
    }
    out.len() as u64
}

/// Runs the pass-through pipeline (no chain) and checks that every row arrives once
/// per epoch, equal to `want[row]`.
fn check_passthrough(reg: &shmpipe::Registry, store: &RowStore, want: &[DataEntry], freq: Freq) {
    let cfg = workload(freq, false);
    let mut p = start_rows(reg, store, &cfg).unwrap();
    let mut seen = vec![0usize; want.len()];
    while let Some(item) = p.dequeue().unwrap() {
        let row = item.i64(ROW_META).unwrap() as usize;
        let e = item_to_entry(item, freq).unwrap();
        assert!(same(&e, &want[row]), "row {row} differs");
        seen[row] += 1;
    }
    assert!(seen.iter().all(|&n| n == cfg.epochs), "rows seen {seen:?}");
}

/// [`check_passthrough`], then the training chain over the store's rows: every window the
/// chain gives in one process arrives, each epoch.
fn check_passthrough_and_windows(
    reg: &shmpipe::Registry,
    store: &RowStore,
    entries: &[DataEntry],
    freq: Freq,
) {
    check_passthrough(reg, store, entries, freq);
    let cfg = workload(freq, true);
    let stats = run_rows(reg, store, &cfg, |_| {}).unwrap();
    // The first batch (of one window) is not counted by the stats.
    assert_eq!(
        stats.windows + 1,
        windows_in_process(entries, &cfg) * cfg.epochs as u64
    );
}

#[test]
fn gluonts_arrow_file_in_a_sealed_memfd_through_the_pipeline() {
    let reg = register_rows(shmpipe::Registry::new());
    shmpipe::init(&reg);
    let freq: Freq = "D".parse().unwrap();
    let path = fixture("daily.feather");
    let entries = ArrowDataset::open(&path, freq).unwrap().entries().unwrap();
    let store = RowStore::arrow_shared(&path).unwrap();
    check_passthrough_and_windows(&reg, &store, &entries, freq);
}

#[test]
fn shared_memfd_dataset_through_the_pipeline() {
    let reg = register_rows(shmpipe::Registry::new());
    shmpipe::init(&reg);
    let g = GenConfig {
        num_series: 30,
        min_len: 20,
        max_len: 60,
        missing_prob: 0.1,
        ..GenConfig::default()
    };
    let entries = jsonl::parse_lines(&to_bytes(&g), g.freq).unwrap();
    let store = RowStore::shared(SharedDataset::create(&entries, g.freq).unwrap());
    check_passthrough_and_windows(&reg, &store, &entries, g.freq);
}

/// Issue 16, hole 3: the shared dataset travelled as `(pid, fd number)` and workers opened
/// `/proc/<pid>/fd/<n>` when their step was built, after `start()` had returned. A parent
/// that dropped the store and built another one (which takes the same number) had the
/// workers silently read the second dataset. A step built 300 ms late makes the race certain.
#[test]
fn a_store_dropped_after_start_is_still_the_one_the_workers_read() {
    use std::os::fd::{AsFd, AsRawFd};
    let reg = register_rows(shmpipe::Registry::new()).step("slow_build", |cx| {
        let ms = cx.args["ms"].as_u64().unwrap_or(0);
        std::thread::sleep(std::time::Duration::from_millis(ms));
        Ok(shmpipe::map(Ok))
    });
    shmpipe::init(&reg);
    let dataset = |seed| {
        let g = GenConfig {
            num_series: 12,
            min_len: 20,
            max_len: 40,
            seed,
            ..GenConfig::default()
        };
        (jsonl::parse_lines(&to_bytes(&g), g.freq).unwrap(), g.freq)
    };
    let ((a, freq), (b, _)) = (dataset(1), dataset(2));
    assert!(!same(&a[0], &b[0]), "the two datasets differ");
    let ds_a = SharedDataset::create(&a, freq).unwrap();
    let number = ds_a.as_fd().as_raw_fd();
    let store_a = RowStore::shared(ds_a);
    let cfg = RowsWorkload {
        epochs: 1,
        ..workload(freq, false)
    };
    let mut builder = shmpipe::Pipeline::builder(&reg);
    let args = store_a.step_args(&mut builder, &cfg).unwrap();
    let p = builder
        .source_named(SOURCE_ROWS, store_a.source_args(&cfg).unwrap())
        .step_with("slow_build", serde_json::json!({"ms": 300}))
        .step_with(STEP_ROWS, args)
        .workers(2)
        .start()
        .unwrap();
    drop(store_a);
    let store_b = SharedDataset::create(&b, freq).unwrap();
    assert_eq!(store_b.as_fd().as_raw_fd(), number, "B reuses A's number");
    let mut seen = 0;
    for item in p {
        let item = item.unwrap();
        let row = item.i64(ROW_META).unwrap() as usize;
        let e = item_to_entry(item, freq).unwrap();
        assert!(same(&e, &a[row]), "row {row} is not dataset A's");
        seen += 1;
    }
    assert_eq!(seen, a.len());
    drop(store_b);
}

/// Issue 16, hole 4: `RowStore::arrow_mapped` was `unsafe` (the file must not change while
/// mapped), but safe code reached the same mapping through the step argument
/// `"mapped": true`; truncating the file then killed the worker with SIGBUS. Whatever the
/// arguments, safe code gets the data or an error, never a worker killed by a signal.
#[test]
fn safe_step_arguments_cannot_map_a_file_that_may_shrink() {
    use shmpipe::ndarray::Array1;
    let (reg, freq, copy) = daily_copy("mapped-arrow");
    let rows = ArrowDataset::open(&copy.0, freq).unwrap().len();
    assert!(rows >= 3, "{rows} rows");
    let mut args = ChainConfig {
        freq,
        ..ChainConfig::default()
    }
    .to_args();
    args.as_object_mut().unwrap().extend([
        (
            "arrow_path".to_owned(),
            serde_json::json!(copy.0.display().to_string()),
        ),
        ("mapped".to_owned(), serde_json::json!(true)),
        ("transform".to_owned(), serde_json::json!(false)),
        ("batch".to_owned(), serde_json::json!(false)),
    ]);
    let mut p = shmpipe::Pipeline::builder(&reg)
        .step_with(STEP_ROWS, args)
        .workers(1)
        .start()
        .unwrap();
    let row = |r: i64| shmpipe::Item::new().with(ROWS_FIELD, Array1::from(vec![r]));
    let mut outcome = Vec::new();
    p.enqueue(row(0)).unwrap();
    outcome.push(p.dequeue());
    if matches!(outcome[0], Ok(Some(_))) {
        // The worker has the file open (mapped, before the fix) and has read row 0.
        truncate(&copy.0);
        for r in 1..rows as i64 {
            p.enqueue(row(r)).unwrap();
        }
        p.close_input();
        outcome.extend(std::iter::from_fn(|| match p.dequeue() {
            Ok(None) => None,
            r => Some(r),
        }));
    }
    for r in &outcome {
        if let Err(e) = r {
            assert!(
                !matches!(e, shmpipe::Error::ProcessDied { .. }),
                "safe step arguments killed a worker: {e}"
            );
            assert!(e.to_string().contains("\"mapped\""), "{e}");
        }
    }
}

/// The safe way to have every worker read an Arrow file in place: a sealed copy. The file
/// truncated in the middle of the run changes nothing for the workers.
#[test]
fn an_arrow_file_truncated_during_the_run_does_not_reach_the_workers() {
    let (reg, freq, copy) = daily_copy("shared-arrow");
    let entries = ArrowDataset::open(&copy.0, freq)
        .unwrap()
        .entries()
        .unwrap();
    let store = RowStore::arrow_shared(&copy.0).unwrap();
    let cfg = RowsWorkload {
        group: 1,
        ..workload(freq, false)
    };
    let mut p = start_rows(&reg, &store, &cfg).unwrap();
    let mut seen = 0;
    while let Some(item) = p.dequeue().unwrap() {
        if seen == 0 {
            truncate(&copy.0);
        }
        let row = item.i64(ROW_META).unwrap() as usize;
        assert!(same(&item_to_entry(item, freq).unwrap(), &entries[row]));
        seen += 1;
    }
    assert_eq!(seen, entries.len() * cfg.epochs);
}
