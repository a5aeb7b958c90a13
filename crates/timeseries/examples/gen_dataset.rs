//! Writes a synthetic GluonTS-format JSON-lines dataset.
//!
//! `cargo run --release -p shmpipe-timeseries --example gen_dataset -- --out data.jsonl --series 5000`

use clap::Parser;
use shmpipe_timeseries::synth::{FloatFormat, GenConfig, write_file};

/// Synthetic series of varied lengths with missing values, one JSON object per line.
#[derive(Parser, Debug)]
struct Args {
    /// Output file.
    #[arg(long)]
    out: std::path::PathBuf,
    /// Number of series.
    #[arg(long, default_value_t = 5000)]
    series: usize,
    /// Shortest series.
    #[arg(long, default_value_t = 400)]
    min_len: usize,
    /// Longest series.
    #[arg(long, default_value_t = 1600)]
    max_len: usize,
    /// Frequency.
    #[arg(long, default_value = "h")]
    freq: String,
    /// Probability that a point is missing.
    #[arg(long, default_value_t = 0.02)]
    missing: f64,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write floats as Python's `json` writes float64 (shortest round trip,
    /// 16-17 digits) instead of with 3 decimals.
    #[arg(long)]
    full_precision: bool,
    /// The long-series preset: 2,000 series of 500-5,000 points, 1% missing,
    /// full precision (~100 MB); other options given explicitly are ignored.
    #[arg(long)]
    long: bool,
}

/// Prints the error's message (not its `Debug` form) and exits with status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("gen_dataset: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let cfg = if a.long {
        GenConfig {
            seed: a.seed,
            ..GenConfig::long_series()
        }
    } else {
        GenConfig {
            num_series: a.series,
            min_len: a.min_len,
            max_len: a.max_len,
            freq: a.freq.parse()?,
            missing_prob: a.missing,
            seed: a.seed,
            floats: if a.full_precision {
                FloatFormat::Shortest
            } else {
                FloatFormat::Fixed3
            },
            ..GenConfig::default()
        }
    };
    let t = std::time::Instant::now();
    let bytes = write_file(&cfg, &a.out)?;
    println!(
        "wrote {} series, {:.1} MB to {} in {:.2}s",
        cfg.num_series,
        bytes as f64 / 1e6,
        a.out.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
