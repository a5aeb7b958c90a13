//! The loaders on real-length data (issue 18): long series with nulls through every source
//! (records grouped by bytes, a single series far larger than a pool block), and the same
//! training windows for any number of workers with one seed.

use shmpipe::{Epochs, Item, Pipeline};
use shmpipe_test_kit::{ShmGuard, TempFile};
use shmpipe_timeseries::pipeline::{SOURCE_LINES, STEP_TRAIN, register, run_workload};
use shmpipe_timeseries::synth::{FloatFormat, GenConfig, write_file};
use shmpipe_timeseries::workload::{ChainConfig, WorkloadConfig, WorkloadSource};

/// GluonTS-style JSON lines: `n` hourly series of `min..=max` points, 1% nulls, floats
/// written as Python writes float64.
fn long_series(tag: &str, n: usize, min: usize, max: usize) -> TempFile {
    let f = TempFile::new(&format!("ts-loaders-{tag}"), "jsonl");
    let g = GenConfig {
        num_series: n,
        min_len: min,
        max_len: max,
        missing_prob: 0.01,
        floats: FloatFormat::Shortest,
        ..GenConfig::default()
    };
    write_file(&g, &f.0).unwrap();
    f
}

fn chain() -> ChainConfig {
    ChainConfig {
        context_length: 168,
        prediction_length: 24,
        num_instances: 2.0,
        ..ChainConfig::default()
    }
}

/// Every window of a finite shuffled run as bytes (its arrays, in a fixed order), sorted.
fn windows(reg: &shmpipe::Registry, path: &std::path::Path, workers: usize) -> Vec<Vec<u8>> {
    let mut args = chain().to_args();
    args["batch_size"] = serde_json::json!(1);
    // The sampler's mean window from the whole file, as the loaders pass it.
    args["data_path"] = serde_json::json!(path.display().to_string());
    let p = Pipeline::builder(reg)
        .source_named(
            SOURCE_LINES,
            serde_json::json!({"path": path.display().to_string(), "group_bytes": 50_000}),
        )
        .epochs(Epochs::Finite(2))
        .shuffle(true)
        .seed(11)
        .step_with(STEP_TRAIN, args)
        .workers(workers)
        .start()
        .unwrap();
    let _g = ShmGuard::containing(p.id().to_owned());
    let mut out: Vec<Vec<u8>> = p
        .map(|r| {
            let it: Item = r.unwrap();
            let mut names: Vec<&str> = it.arrays().map(|(n, _)| n).collect();
            names.sort_unstable();
            names
                .iter()
                .flat_map(|n| it.get(n).unwrap().bytes().to_vec())
                .collect()
        })
        .collect();
    out.sort_unstable();
    out
}

#[test]
fn the_same_windows_for_one_two_and_three_workers_with_one_seed() {
    let reg = register(shmpipe::Registry::new());
    shmpipe::init(&reg);
    let f = long_series("seed", 60, 300, 1200);
    let one = windows(&reg, &f.0, 1);
    assert!(one.len() > 100, "{} windows", one.len());
    let two = windows(&reg, &f.0, 2);
    assert_eq!(two.len(), one.len());
    assert!(two == one, "2 workers drew other windows than 1");
    assert!(
        windows(&reg, &f.0, 3) == one,
        "3 workers drew other windows than 1"
    );
}

#[test]
fn long_series_and_one_very_long_series_through_every_source() {
    let reg = register(shmpipe::Registry::new());
    shmpipe::init(&reg);
    // 24 series of 500-5,000 points, and a file of one 200,000-point series (~3.7 MB of
    // JSON: one record far larger than a pool block).
    let many = long_series("many", 24, 500, 5000);
    let one = long_series("one", 1, 200_000, 200_000);
    assert!(std::fs::metadata(&one.0).unwrap().len() > 2 << 20);
    for (file, epochs) in [(&many, 1), (&one, 2)] {
        for source in [
            WorkloadSource::JsonLines(file.0.clone()),
            WorkloadSource::ParsedOnce(file.0.clone()),
            WorkloadSource::InWorkers(file.0.clone()),
            WorkloadSource::JsonLinesInWorkers(file.0.clone()),
        ] {
            let cfg = WorkloadConfig {
                source: source.clone(),
                chain: ChainConfig {
                    num_instances: 8.0,
                    ..chain()
                },
                batch_size: 8,
                epochs,
                workers: 2,
                emitters: 1,
                group_bytes: shmpipe_timeseries::pipeline::DEFAULT_GROUP_BYTES,
                seed: 3,
            };
            let stats =
                run_workload(&reg, &cfg, |_| {}).unwrap_or_else(|e| panic!("{source:?}: {e}"));
            assert!(stats.windows > 0, "{source:?}: no window");
        }
    }
}
