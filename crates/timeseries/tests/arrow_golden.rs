//! Arrow IPC (file and stream) and Parquet files written by GluonTS 0.17's own
//! `ArrowWriter`/`ParquetWriter` (`tools/gluonts_fixtures.py --arrow`) read as the
//! same entries as the JSON lines of the same datasets, and give the same windows
//! as GluonTS in the golden fixtures.
//!
//! The Parquet cases run with `--features parquet`; without it, opening a Parquet
//! file must fail with an error naming the feature.

mod common;

use common::{json_entries, map_chain, splitter, strs};
use serde_json::Value;
use shmpipe_timeseries::arrow::{ArrowDataset, FileKind};
use shmpipe_timeseries::workload::{ChainConfig, deepar_chain};
use shmpipe_timeseries::{DataEntry, Freq, field};

fn fixture_dir() -> String {
    format!("{}/tests/fixtures", env!("CARGO_MANIFEST_DIR"))
}

fn load(path: &str) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// `(manifest entry, its JSON-lines cases)` for every dataset.
fn datasets() -> Vec<(Value, Vec<Value>)> {
    let manifest = load(&format!("{}/arrow/manifest.json", fixture_dir()));
    let cases = load(&format!("{}/gluonts_transforms.json", fixture_dir()));
    let cases = cases["cases"].as_array().unwrap().clone();
    let sets = manifest["datasets"].as_array().unwrap().clone();
    assert!(sets.len() >= 5, "manifest lists {} datasets", sets.len());
    sets.into_iter()
        .map(|d| {
            let names: Vec<&str> = strs(&d["cases"]);
            let mine = cases
                .iter()
                .filter(|c| names.contains(&c["name"].as_str().unwrap()))
                .cloned()
                .collect::<Vec<_>>();
            assert_eq!(mine.len(), names.len());
            (d, mine)
        })
        .collect()
}

/// NaN-aware equality of entries (the derived `PartialEq` says NaN != NaN).
fn assert_same(what: &str, got: &DataEntry, want: &DataEntry) {
    assert_eq!(got.start, want.start, "{what}: start");
    assert_eq!(got.item_id, want.item_id, "{what}: item_id");
    assert_eq!(
        got.forecast_start, want.forecast_start,
        "{what}: forecast_start"
    );
    let g: Vec<&str> = got.fields().map(|(n, _)| n).collect();
    let w: Vec<&str> = want.fields().map(|(n, _)| n).collect();
    assert_eq!(g, w, "{what}: fields");
    for (name, a) in want.fields() {
        let b = got.get(name).unwrap();
        assert_eq!(b.shape(), a.shape(), "{what}.{name}: shape");
        for (i, (x, y)) in b.data().iter().zip(a.data()).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{what}.{name}[{i}]: {x} vs {y}"
            );
        }
    }
}

fn open(dir: &str, file: &str, freq: Freq) -> Vec<DataEntry> {
    let path = format!("{dir}/arrow/{file}");
    let ds = ArrowDataset::open(&path, freq).unwrap_or_else(|e| panic!("{e}"));
    ds.entries().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn gluonts_arrow_files_read_as_the_json_entries() {
    let dir = fixture_dir();
    let mut files_checked = 0;
    for (d, cases) in datasets() {
        let freq: Freq = d["freq"].as_str().unwrap().parse().unwrap();
        let want = json_entries(&cases[0], freq);
        for f in d["files"].as_array().unwrap() {
            let file = f["file"].as_str().unwrap();
            let path = format!("{dir}/arrow/{file}");
            let kind = FileKind::of(&path).unwrap();
            let expected_kind = match f["kind"].as_str().unwrap() {
                "ArrowFile" => FileKind::IpcFile,
                "ArrowStreamFile" => FileKind::IpcStream,
                "ParquetFile" => FileKind::Parquet,
                k => panic!("unknown kind {k}"),
            };
            assert_eq!(kind, expected_kind, "{file}: kind as GluonTS infers it");
            if kind == FileKind::Parquet && !cfg!(feature = "parquet") {
                let e = ArrowDataset::open(&path, freq).unwrap_err();
                assert!(e.to_string().contains("--features parquet"), "{e}");
                continue;
            }
            let got = open(&dir, file, freq);
            assert_eq!(got.len(), want.len(), "{file}: series");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_same(&format!("{file}[{i}]"), g, w);
            }
            if kind != FileKind::Parquet {
                // SAFETY: the fixture files are not modified while the test runs.
                let mapped = unsafe { ArrowDataset::map(&path, freq) }.unwrap();
                for (i, w) in want.iter().enumerate() {
                    assert_same(&format!("{file}[{i}] mapped"), &mapped.entry(i).unwrap(), w);
                }
            }
            files_checked += 1;
        }
    }
    let expected = if cfg!(feature = "parquet") { 17 } else { 12 };
    assert_eq!(files_checked, expected, "files read");
}

/// A `float32` target without nulls is handed out as a slice of the mapped file.
#[test]
fn mapped_float32_targets_are_borrowed_from_the_mapping() {
    let path = format!("{}/arrow/daily.feather", fixture_dir());
    let freq: Freq = "D".parse().unwrap();
    // SAFETY: the fixture file is not modified while the test runs.
    let ds = unsafe { ArrowDataset::map(&path, freq) }.unwrap();
    let file_len = std::fs::metadata(&path).unwrap().len() as usize;
    for i in 0..ds.len() {
        let v = ds.values(i, field::TARGET).unwrap().unwrap();
        assert!(matches!(v, std::borrow::Cow::Borrowed(_)), "row {i} copied");
        assert_eq!(
            v.len(),
            ds.entry(i).unwrap().get(field::TARGET).unwrap().time_len()
        );
    }
    // The raw file (float64 with nulls) must convert.
    let raw = format!("{}/arrow/daily-raw.feather", fixture_dir());
    // SAFETY: as above.
    let raw = unsafe { ArrowDataset::map(&raw, freq) }.unwrap();
    let v = raw.values(0, field::TARGET).unwrap().unwrap();
    assert!(matches!(v, std::borrow::Cow::Owned(_)));
    assert!(v.iter().any(|x| x.is_nan()), "nulls become NaN");
    assert!(file_len > 0);
}

/// The map chain and splitter of the golden cases (validation and test splits) give the
/// same windows from Arrow as from JSON, and as many as GluonTS wrote.
#[test]
fn chain_outputs_from_arrow_match_the_golden_fixtures() {
    let dir = fixture_dir();
    let mut cases_checked = 0;
    for (d, cases) in datasets() {
        let freq: Freq = d["freq"].as_str().unwrap().parse().unwrap();
        let file = d["files"][0]["file"].as_str().unwrap();
        let from_arrow = open(&dir, file, freq);
        for case in &cases {
            let s = &case["sampler"];
            let kind = s["kind"].as_str().unwrap();
            if !matches!(kind, "validation" | "test") {
                continue;
            }
            let chain = || map_chain(case, freq).then(splitter(case));
            let is_train = case["is_train"].as_bool().unwrap();
            let run = |entries: &[DataEntry]| {
                let mut c = chain();
                let mut out = Vec::new();
                for e in entries {
                    c.apply(e.clone(), is_train, &mut out).unwrap();
                }
                out
            };
            let name = case["name"].as_str().unwrap();
            let got = run(&from_arrow);
            let want = run(&json_entries(case, freq));
            let golden = case["windows"].as_array().unwrap();
            assert_eq!(got.len(), golden.len(), "{name}: windows (GluonTS)");
            assert_eq!(got.len(), want.len(), "{name}: windows (JSON)");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_same(&format!("{name}: window {i}"), g, w);
                // Values copied from the input (no arithmetic): exact against GluonTS.
                let gw = &golden[i]["fields"]["past_target"]["data"];
                let pt = g.get("past_target").unwrap().data();
                for (k, (x, y)) in pt.iter().zip(gw.as_array().unwrap()).enumerate() {
                    let y = y.as_f64().unwrap_or(f64::NAN) as f32;
                    assert!(
                        x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                        "{name}: window {i} past_target[{k}]"
                    );
                }
            }
            cases_checked += 1;
        }
    }
    assert_eq!(cases_checked, 6, "validation and test cases");
}

/// The DeepAR training chain (seeded sampler) gives identical windows from the Arrow
/// file and from the JSON lines.
#[test]
fn deepar_chain_is_identical_from_arrow_and_json() {
    let dir = fixture_dir();
    let (d, cases) = datasets()
        .into_iter()
        .find(|(d, _)| d["dataset"] == "daily")
        .unwrap();
    let freq: Freq = d["freq"].as_str().unwrap().parse().unwrap();
    let cfg = ChainConfig {
        freq,
        context_length: 14,
        prediction_length: 7,
        num_instances: 5.0,
        fused: false,
        ..ChainConfig::default()
    };
    for file in ["daily.feather", "daily-stream.arrow", "daily-raw.feather"] {
        let run = |entries: Vec<DataEntry>| {
            let mut c = deepar_chain(&cfg, 11);
            let mut out = Vec::new();
            for e in entries {
                c.apply(e, true, &mut out).unwrap();
            }
            out
        };
        let got = run(open(&dir, file, freq));
        let want = run(json_entries(&cases[0], freq));
        assert!(!got.is_empty());
        assert_eq!(got.len(), want.len(), "{file}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_same(&format!("{file}: window {i}"), g, w);
        }
    }
}

/// Every single-byte change of a GluonTS Arrow file (two per byte: all bits, lowest bit)
/// and every truncation is an error or still reads: never a panic, never a hang.
#[test]
fn corrupted_arrow_files_are_errors_never_panics() {
    let freq: Freq = "h".parse().unwrap();
    let try_read = |bytes: &[u8], name: &str| {
        let r = std::panic::catch_unwind(|| {
            if let Ok(ds) = ArrowDataset::from_ipc_bytes(name, bytes.to_vec(), freq) {
                for i in 0..ds.len() {
                    let _ = ds.entry(i);
                    let _ = ds.values(i, field::TARGET);
                }
            }
        });
        assert!(r.is_ok(), "{name}: panicked");
    };
    for file in [
        "hourly.feather",
        "hourly-stream.arrow",
        "hourly-nested.feather",
    ] {
        let bytes = std::fs::read(format!("{}/arrow/{file}", fixture_dir())).unwrap();
        for pos in 0..bytes.len() {
            for flip in [0xFFu8, 0x01] {
                let mut b = bytes.clone();
                b[pos] ^= flip;
                try_read(&b, &format!("{file}-{pos}-{flip}"));
            }
        }
        for len in 0..bytes.len() {
            try_read(&bytes[..len], &format!("{file}-len{len}"));
        }
    }
}

/// GluonTS's `ArrowWriter(compression="lz4")` output is refused with a message that
/// says how to write a readable file.
#[test]
fn compressed_gluonts_files_are_a_clear_error() {
    let path = format!("{}/arrow/hourly-lz4.feather", fixture_dir());
    let e = ArrowDataset::open(&path, "h".parse().unwrap()).unwrap_err();
    assert!(e.to_string().contains("compression=None"), "{e}");
}

/// `start` as naive or UTC timestamps of any unit, dates and strings all give the same
/// period; a zoned timestamp other than UTC is an error naming the zone; integer
/// `item_id`s read as their text; a null target is an error naming row and field.
#[test]
fn start_item_id_and_null_variants() {
    use arrow_array::builder::{Float32Builder, ListBuilder};
    use arrow_array::{
        ArrayRef, Date32Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
        TimestampSecondArray,
    };
    use std::sync::Arc;

    let freq: Freq = "h".parse().unwrap();
    // 2021-03-04 05:00:00 = 1614834000 s.
    let secs = 1_614_834_000i64;
    let mut t = ListBuilder::new(Float32Builder::new());
    t.values().append_slice(&[1.0, 2.0]);
    t.append(true);
    t.append(false); // a null target
    let target: ArrayRef = Arc::new(t.finish());
    let ids: ArrayRef = Arc::new(Int64Array::from(vec![7, 8]));
    let read = |start: ArrayRef| {
        let b = RecordBatch::try_from_iter([
            ("start", start),
            ("item_id", ids.clone()),
            ("target", target.clone()),
        ])
        .unwrap();
        let ds = ArrowDataset::from_batches("mem", b.schema(), vec![b], freq).unwrap();
        (ds.entry(0), ds.entry(1))
    };
    let want = shmpipe_timeseries::Period::parse("2021-03-04 05:00:00", freq).unwrap();
    let starts: Vec<ArrayRef> = vec![
        Arc::new(TimestampSecondArray::from(vec![secs, secs])),
        Arc::new(TimestampMicrosecondArray::from(vec![secs * 1_000_000; 2])),
        Arc::new(TimestampMicrosecondArray::from(vec![secs * 1_000_000; 2]).with_timezone("UTC")),
        Arc::new(StringArray::from(vec!["2021-03-04 05:00:00"; 2])),
    ];
    for s in starts {
        let (e0, e1) = read(s);
        let e0 = e0.unwrap();
        assert_eq!(e0.start, Some(want));
        assert_eq!(e0.item_id.as_deref(), Some("7"));
        assert_eq!(e0.get("target").unwrap().data(), &[1.0, 2.0]);
        let err = e1.unwrap_err();
        assert_eq!(
            (err.row, err.field.as_deref()),
            (Some(1), Some("target")),
            "{err}"
        );
    }
    let (e0, _) = read(Arc::new(Date32Array::from(vec![18_690, 18_690])));
    assert_eq!(
        e0.unwrap().start,
        shmpipe_timeseries::Period::parse("2021-03-04", freq).ok()
    );
    let (e0, _) = read(Arc::new(
        TimestampSecondArray::from(vec![secs, secs]).with_timezone("Europe/Berlin"),
    ));
    let err = e0.unwrap_err();
    assert!(err.to_string().contains("Europe/Berlin"), "{err}");
}

/// Single-byte changes (xor 0xFF, every 5th byte: the Parquet decoder is slow in debug
/// builds) and truncations of a GluonTS Parquet file are errors or still read: never a
/// panic.
#[cfg(feature = "parquet")]
#[test]
fn corrupted_parquet_files_are_errors_never_panics() {
    let freq: Freq = "h".parse().unwrap();
    let bytes = std::fs::read(format!("{}/arrow/hourly.parquet", fixture_dir())).unwrap();
    let tmp = shmpipe_test_kit::TempFile::new("ts-pq-fuzz", "parquet");
    let path = tmp.0.clone();
    let try_read = |b: &[u8], what: &str| {
        std::fs::write(&path, b).unwrap();
        let r = std::panic::catch_unwind(|| {
            if let Ok(ds) = ArrowDataset::open_parquet(&path, freq) {
                for i in 0..ds.len() {
                    let _ = ds.entry(i);
                }
            }
        });
        assert!(r.is_ok(), "{what}: panicked");
    };
    for pos in (0..bytes.len()).step_by(5) {
        let mut b = bytes.clone();
        b[pos] ^= 0xFF;
        try_read(&b, &format!("byte {pos}"));
    }
    for len in (0..bytes.len()).step_by(13) {
        try_read(&bytes[..len], &format!("length {len}"));
    }
}
