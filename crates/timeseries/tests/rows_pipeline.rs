//! The workload over stores every worker reads in place (a memory-mapped GluonTS
//! Arrow file, a sealed shared memfd), as a real multi-process pipeline: every
//! series reaches the workers intact, and the window counts are exact.
//!
//! Each test re-executes this binary as workers and emitters (`shmpipe::init`).

mod common;

use common::same;
use shmpipe_timeseries::arrow::ArrowDataset;
use shmpipe_timeseries::pipeline::item_to_entry;
use shmpipe_timeseries::rows::{
    ROW_META, RowStore, RowsWorkload, register_rows, run_rows, start_rows,
};
use shmpipe_timeseries::shared::SharedDataset;
use shmpipe_timeseries::synth::{GenConfig, to_bytes};
use shmpipe_timeseries::workload::ChainConfig;
use shmpipe_timeseries::{DataEntry, Freq, jsonl};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/arrow/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn workload(freq: Freq, transform: bool) -> RowsWorkload {
    RowsWorkload {
        chain: ChainConfig {
            freq,
            context_length: 12,
            prediction_length: 4,
            // Far above the series lengths: every admissible point, an exact count.
            num_instances: 1e6,
            ..ChainConfig::default()
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

#[test]
fn mapped_gluonts_arrow_file_through_the_pipeline() {
    let reg = register_rows(shmpipe::Registry::new());
    shmpipe::init(&reg);
    let freq: Freq = "D".parse().unwrap();
    let path = fixture("daily.feather");
    let entries = ArrowDataset::open(&path, freq).unwrap().entries().unwrap();
    // SAFETY: the fixture file is not modified while the test runs.
    let store = unsafe { RowStore::arrow_mapped(&path) };
    check_passthrough(&reg, &store, &entries, freq);
    let cfg = workload(freq, true);
    let stats = run_rows(&reg, &store, &cfg, |_| {}).unwrap();
    // The first batch (of one window) is not counted by the stats.
    assert_eq!(
        stats.windows + 1,
        windows_in_process(&entries, &cfg) * cfg.epochs as u64
    );
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
    check_passthrough(&reg, &store, &entries, g.freq);
    let cfg = workload(g.freq, true);
    let stats = run_rows(&reg, &store, &cfg, |_| {}).unwrap();
    assert_eq!(
        stats.windows + 1,
        windows_in_process(&entries, &cfg) * cfg.epochs as u64
    );
}
