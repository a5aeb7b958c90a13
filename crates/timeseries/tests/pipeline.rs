//! The workload as a multi-process pipeline: exact window counts, batch shapes,
//! and malformed records reported with their line.
//!
//! Each test re-executes this test binary as worker and emitter processes
//! (`shmpipe::init` diverts them), so every test calls `init` first.

mod common;

use shmpipe::{Epochs, Pipeline, Topology};
use shmpipe_test_kit::{ShmGuard, TempFile};
use shmpipe_timeseries::pipeline::{
    Layout, SOURCE_LINES, STEP_BATCH, STEP_PARSE, STEP_TRAIN, STEP_TRANSFORM, batch_rows, register,
    run_workload, run_workload_with,
};
use shmpipe_timeseries::synth::{GenConfig, write_file};
use shmpipe_timeseries::workload::{WorkloadConfig, WorkloadError, WorkloadSource, run_in_process};

fn small_dataset(tag: &str) -> (TempFile, GenConfig) {
    let f = TempFile::new(&format!("ts-test-{tag}"), "jsonl");
    let g = GenConfig {
        num_series: 40,
        min_len: 20,
        max_len: 70,
        missing_prob: 0.1,
        ..GenConfig::default()
    };
    write_file(&g, &f.0).unwrap();
    (f, g)
}

/// With `num_instances` far above the series lengths the sampler picks every
/// admissible point (p >= 1), so the number of windows is exact:
/// `sum over series of (len - prediction + 1)` per epoch.
fn exhaustive_config(source: WorkloadSource, workers: usize) -> WorkloadConfig {
    WorkloadConfig {
        source,
        chain: common::exhaustive_chain(),
        batch_size: 1,
        epochs: 2,
        workers,
        emitters: 1,
        group_bytes: 1 << 10,
        seed: 5,
    }
}

#[test]
fn pipeline_produces_every_window_from_json_and_memory() {
    let reg = register(shmpipe::Registry::new());
    shmpipe::init(&reg);
    let (file, g) = small_dataset("exact");
    let entries = shmpipe_timeseries::jsonl::read_file(&file.0, g.freq).unwrap();
    let expected: u64 = entries
        .iter()
        .map(|e| e.get("target").unwrap().time_len() as u64 - 4 + 1)
        .sum::<u64>()
        * 2;
    for source in [
        WorkloadSource::JsonLines(file.0.clone()),
        WorkloadSource::ParsedOnce(file.0.clone()),
        WorkloadSource::InWorkers(file.0.clone()),
        WorkloadSource::JsonLinesInWorkers(file.0.clone()),
    ] {
        let cfg = exhaustive_config(source.clone(), 2);
        let local = run_in_process(&cfg, |_| {}).unwrap();
        assert_eq!(local.windows, expected, "{source:?} in process");
        let mut last = 0;
        let stats = run_workload(&reg, &cfg, |s| {
            assert!(s.windows >= last);
            last = s.windows;
        })
        .unwrap();
        // The first batch only starts the clock and is not counted.
        assert_eq!(stats.windows + 1, expected, "{source:?} in the pipeline");
        assert_eq!(stats.batches, stats.windows);
        // Each window: past (12) and future (4) target, observed values, is_pad (12),
        // time features 6 x 5 columns (4 hourly features + age), feat_static_cat, and
        // forecast_start and start (i64).
        let floats = 12 + 4 + 12 + 4 + 12 + 16 * 5 + 1;
        assert_eq!(stats.batch_bytes, stats.windows * (floats * 4 + 16));
    }
}

#[test]
fn staged_layout_produces_the_same_windows() {
    let reg = register(shmpipe::Registry::new());
    shmpipe::init(&reg);
    let (file, _) = small_dataset("staged");
    let cfg = exhaustive_config(WorkloadSource::JsonLines(file.0.clone()), 1);
    let fused = run_workload(&reg, &cfg, |_| {}).unwrap();
    let staged =
        run_workload_with(&reg, &cfg, Layout::Staged { workers: [1, 2, 1] }, |_| {}).unwrap();
    assert_eq!(staged.windows, fused.windows);
    assert_eq!(staged.batch_bytes, fused.batch_bytes);
}

/// Every window arrives with batches of 32: each worker that batches flushes its last,
/// partial batch at the end of the stream (`Step::finish`), so the count equals the
/// single-process reference exactly, fused and staged.
#[test]
fn partial_batches_are_flushed_at_the_end() {
    let reg = register(shmpipe::Registry::new());
    shmpipe::init(&reg);
    let (file, g) = small_dataset("flush");
    let mut cfg = exhaustive_config(WorkloadSource::JsonLines(file.0.clone()), 2);
    cfg.batch_size = 32;
    let reference = run_in_process(&cfg, |_| {}).unwrap();
    assert!(reference.windows % 32 != 0, "{}", reference.windows);
    let c = &cfg.chain;
    let args = serde_json::json!({
        "freq": c.freq.to_string(),
        "context_length": c.context_length,
        "prediction_length": c.prediction_length,
        "num_instances": c.num_instances,
        "batch_size": cfg.batch_size,
    });
    for (topo, batchers) in [
        (Topology::Fused, 2),
        (Topology::Fused, 3),
        (
            Topology::Staged {
                workers: vec![1, 2, 2],
            },
            2,
        ),
    ] {
        let b = Pipeline::builder(&reg)
            .source_named(
                SOURCE_LINES,
                serde_json::json!({
                    "path": file.0.display().to_string(),
                    "freq": g.freq.to_string(),
                    "group_bytes": cfg.group_bytes,
                }),
            )
            .epochs(Epochs::Finite(cfg.epochs as u64))
            .seed(cfg.seed)
            .workers(batchers)
            .topology(topo.clone());
        let b = if matches!(topo, Topology::Fused) {
            b.step_with(STEP_TRAIN, args.clone())
        } else {
            b.step_with(STEP_PARSE, args.clone())
                .step_with(STEP_TRANSFORM, args.clone())
                .step_with(STEP_BATCH, args.clone())
        };
        let mut p = b.start().unwrap();
        let _g = ShmGuard::containing(p.id());
        let rows: Vec<usize> = p.by_ref().map(|r| batch_rows(&r.unwrap())).collect();
        assert!(p.is_finished());
        let windows: u64 = rows.iter().map(|&r| r as u64).sum();
        assert_eq!(windows, reference.windows, "{topo:?}");
        assert!(rows.iter().all(|&r| (1..=32).contains(&r)), "{rows:?}");
        // At most one partial batch per batching worker.
        let partial = rows.iter().filter(|&&r| r < 32).count();
        assert!((1..=batchers).contains(&partial), "{topo:?}: {rows:?}");
    }
}

#[test]
fn malformed_line_is_reported_with_its_line_number() {
    let reg = register(shmpipe::Registry::new());
    shmpipe::init(&reg);
    let (file, _) = small_dataset("bad");
    let mut text = std::fs::read_to_string(&file.0).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
    out[6] = r#"{"start": "2020-01-01 00:00:00", "target": [1.0, "oops"]}"#.into();
    text = out.join("\n") + "\n";
    std::fs::write(&file.0, text).unwrap();
    let cfg = exhaustive_config(WorkloadSource::JsonLines(file.0.clone()), 2);
    match run_workload(&reg, &cfg, |_| {}) {
        Err(WorkloadError::Pipeline(msg)) => {
            assert!(msg.contains("line 7"), "{msg}");
            assert!(msg.contains("target"), "{msg}");
        }
        other => panic!("expected a pipeline error, got {other:?}"),
    }
    let cfg = exhaustive_config(WorkloadSource::ParsedOnce(file.0.clone()), 1);
    match run_workload(&reg, &cfg, |_| {}) {
        Err(WorkloadError::Pipeline(msg)) => {
            assert!(msg.contains(":7"), "{msg}");
        }
        other => panic!("expected a pipeline error, got {other:?}"),
    }
    let cfg = exhaustive_config(WorkloadSource::JsonLinesInWorkers(file.0.clone()), 2);
    match run_workload(&reg, &cfg, |_| {}) {
        Err(WorkloadError::Pipeline(msg)) => {
            assert!(msg.contains("line 7"), "{msg}");
        }
        other => panic!("expected a pipeline error, got {other:?}"),
    }
    let cfg = exhaustive_config(WorkloadSource::InWorkers(file.0.clone()), 2);
    match run_workload(&reg, &cfg, |_| {}) {
        Err(WorkloadError::Pipeline(msg)) => {
            assert!(msg.contains("line 7"), "{msg}");
        }
        other => panic!("expected a pipeline error, got {other:?}"),
    }
}
