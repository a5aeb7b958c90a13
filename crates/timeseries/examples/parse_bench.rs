//! JSON-lines parsing throughput per core: the crate's parser against `serde_json`
//! and (with `--features bench-peers`) `simd-json` and `sonic-rs`, all on the same
//! bytes, all producing the same `DataEntry` (the peers through the same serde
//! visitors as the `serde_json` reader), all checked bit for bit against each other.
//!
//! ```text
//! cargo run --release -p shmpipe-timeseries --features bench-peers --example parse_bench
//! cargo run --release -p shmpipe-timeseries --example parse_bench -- --short
//! ```
//!
//! Default data: [`GenConfig::long_series`] (2,000 hourly series of 500-5,000
//! points, 1% missing as `null`/`"NaN"`, 17-digit floats as Python's `json`
//! writes float64, ~100 MB). `--short` uses the old 3-decimal, 400-1,600 point
//! series. Figures are thread CPU time, best of `--passes` alternated passes.

use clap::Parser;
use shmpipe_timeseries::jsonl::parse_entry;
use shmpipe_timeseries::serde_reader::parse_entry_serde;
use shmpipe_timeseries::synth::{GenConfig, to_bytes};
use shmpipe_timeseries::workload::thread_cpu_time;
use shmpipe_timeseries::{DataEntry, Freq};

/// Parse throughput of the crate's JSON-lines reader against other JSON crates.
#[derive(Parser, Debug)]
struct Args {
    /// Number of series (default: 2,000).
    #[arg(long)]
    series: Option<usize>,
    /// Short 3-decimal series (400-1,600 points) instead of long 17-digit ones.
    #[arg(long)]
    short: bool,
    /// Passes per parser; the best is kept.
    #[arg(long, default_value_t = 5)]
    passes: usize,
}

type ParseFn = fn(&[u8], Freq, &mut Vec<u8>) -> DataEntry;

fn ours(l: &[u8], f: Freq, _: &mut Vec<u8>) -> DataEntry {
    parse_entry(l, f).expect("valid line")
}

fn serde(l: &[u8], f: Freq, _: &mut Vec<u8>) -> DataEntry {
    parse_entry_serde(l, f).expect("valid line")
}

#[cfg(feature = "bench-peers")]
fn simd(l: &[u8], f: Freq, scratch: &mut Vec<u8>) -> DataEntry {
    // simd-json parses in place: the copy is part of what a caller pays.
    scratch.clear();
    scratch.extend_from_slice(l);
    let mut de = simd_json::Deserializer::from_slice(scratch).expect("valid line");
    shmpipe_timeseries::serde_reader::parse_entry_with(&mut de, f).expect("valid line")
}

#[cfg(feature = "bench-peers")]
fn sonic(l: &[u8], f: Freq, _: &mut Vec<u8>) -> DataEntry {
    let mut de = sonic_rs::Deserializer::from_slice(l);
    shmpipe_timeseries::serde_reader::parse_entry_with(&mut de, f).expect("valid line")
}

fn parsers() -> Vec<(&'static str, ParseFn)> {
    #[allow(unused_mut)]
    let mut v: Vec<(&'static str, ParseFn)> = vec![("shmpipe jsonl", ours), ("serde_json", serde)];
    #[cfg(feature = "bench-peers")]
    {
        v.push(("simd-json", simd));
        v.push(("sonic-rs", sonic));
    }
    v
}

/// One pass: (thread CPU seconds, points).
fn pass(lines: &[&[u8]], freq: Freq, f: ParseFn) -> (f64, usize) {
    let mut scratch = Vec::new();
    let t = thread_cpu_time();
    let mut points = 0;
    for l in lines {
        points += f(l, freq, &mut scratch).get("target").unwrap().time_len();
    }
    ((thread_cpu_time() - t).as_secs_f64(), points)
}

fn same(a: &DataEntry, b: &DataEntry) -> bool {
    let (x, y) = (a.get("target").unwrap(), b.get("target").unwrap());
    x.shape() == y.shape()
        && a.start == b.start
        && a.item_id == b.item_id
        && x.data()
            .iter()
            .zip(y.data())
            .all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
}

fn main() {
    let a = Args::parse();
    let mut cfg = if a.short {
        GenConfig::default()
    } else {
        GenConfig::long_series()
    };
    cfg.num_series = a.series.unwrap_or(2000);
    let data = to_bytes(&cfg);
    let lines: Vec<&[u8]> = data
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let mb = data.len() as f64 / 1e6;
    let ps = parsers();
    // Every parser gives the same entries, bit for bit, on every line.
    let mut scratch = Vec::new();
    for l in &lines {
        let want = ours(l, cfg.freq, &mut scratch);
        for (name, f) in &ps[1..] {
            assert!(same(&want, &f(l, cfg.freq, &mut scratch)), "{name} differs");
        }
    }
    let mut best = vec![f64::MAX; ps.len()];
    let mut points = 0;
    for _ in 0..a.passes.max(1) {
        for (k, (_, f)) in ps.iter().enumerate() {
            let (t, p) = pass(&lines, cfg.freq, *f);
            best[k] = best[k].min(t);
            points = p;
        }
    }
    println!(
        "{} series, {points} points, {mb:.1} MB of JSON lines ({}); per core, best of {} passes",
        lines.len(),
        if a.short {
            "3-decimal floats"
        } else {
            "17-digit floats, 1% null/\"NaN\""
        },
        a.passes
    );
    println!("| parser | MB/s | M points/s | shmpipe's speed-up |");
    println!("|---|---|---|---|");
    for (k, (name, _)) in ps.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.1} | {:.2}x |",
            mb / best[k],
            points as f64 / best[k] / 1e6,
            best[k] / best[0]
        );
    }
    if !cfg!(feature = "bench-peers") {
        println!("(simd-json and sonic-rs: run with --features bench-peers)");
    }
}
