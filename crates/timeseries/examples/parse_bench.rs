//! JSON-lines parsing throughput: the hand-written parser against `serde_json`.
//!
//! `cargo run --release -p shmpipe-timeseries --example parse_bench -- [series]`

use shmpipe_timeseries::jsonl::parse_entry;
use shmpipe_timeseries::serde_reader::parse_entry_serde;
use shmpipe_timeseries::synth::{GenConfig, to_bytes};
use shmpipe_timeseries::workload::thread_cpu_time;
use shmpipe_timeseries::{DataEntry, Freq, ParseError};

/// One pass: (thread CPU seconds, points).
fn pass(
    lines: &[&[u8]],
    freq: Freq,
    f: fn(&[u8], Freq) -> Result<DataEntry, ParseError>,
) -> (f64, usize) {
    let t = thread_cpu_time();
    let mut points = 0;
    for l in lines {
        points += f(l, freq)
            .expect("valid line")
            .get("target")
            .unwrap()
            .time_len();
    }
    ((thread_cpu_time() - t).as_secs_f64(), points)
}

fn main() {
    let series = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let cfg = GenConfig {
        num_series: series,
        ..GenConfig::default()
    };
    let data = to_bytes(&cfg);
    let lines: Vec<&[u8]> = data
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let mb = data.len() as f64 / 1e6;
    for (a, b) in lines.iter().take(200).map(|l| {
        (
            parse_entry(l, cfg.freq).unwrap(),
            parse_entry_serde(l, cfg.freq).unwrap(),
        )
    }) {
        let (ta, tb) = (
            a.get("target").unwrap().data(),
            b.get("target").unwrap().data(),
        );
        assert!(
            ta.iter()
                .zip(tb)
                .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
        );
    }
    // Alternate the two parsers and keep the best pass of each (thread CPU time).
    let (mut t_fast, mut t_serde, mut points) = (f64::MAX, f64::MAX, 0);
    for _ in 0..9 {
        let (t, p) = pass(&lines, cfg.freq, parse_entry);
        t_fast = t_fast.min(t);
        points = p;
        t_serde = t_serde.min(pass(&lines, cfg.freq, parse_entry_serde).0);
    }
    println!(
        "{} series, {points} points, {mb:.1} MB of JSON lines",
        lines.len()
    );
    println!(
        "hand-written: {:7.1} MB/s  {:6.1} M points/s",
        mb / t_fast,
        points as f64 / t_fast / 1e6
    );
    println!(
        "serde_json:   {:7.1} MB/s  {:6.1} M points/s",
        mb / t_serde,
        points as f64 / t_serde / 1e6
    );
    println!("ratio hand-written / serde_json: {:.2}x", t_serde / t_fast);
}
