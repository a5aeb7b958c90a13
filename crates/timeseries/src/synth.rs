//! Synthetic GluonTS-format datasets: series of varied lengths with missing values.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use crate::period::{DateTime, Freq, Period};
use crate::sampler::Rng;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// Number of series (lines).
    pub num_series: usize,
    /// Shortest series.
    pub min_len: usize,
    /// Longest series (inclusive).
    pub max_len: usize,
    /// Frequency of the `start` timestamps.
    pub freq: Freq,
    /// Probability that a point is missing (`null`, or `"NaN"` for a quarter of them).
    pub missing_prob: f64,
    /// Number of categories of `feat_static_cat`.
    pub num_categories: usize,
    /// Seed: the same seed gives the same file.
    pub seed: u64,
    /// How values are written.
    pub floats: FloatFormat,
}

/// How [`write_series`] writes values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatFormat {
    /// Three decimals (`123.457`): short lines.
    Fixed3,
    /// The shortest text that reads back as the same `f64`, as Python's `json`
    /// (`repr`) writes float64 values: 16-17 significant digits for most
    /// (`123.45678901234567`). What GluonTS datasets saved from numpy look like.
    Shortest,
}

impl Default for GenConfig {
    /// 1000 hourly series of 400..=1600 points, 2% missing.
    fn default() -> Self {
        GenConfig {
            num_series: 1000,
            min_len: 400,
            max_len: 1600,
            freq: Freq {
                unit: crate::period::FreqUnit::Hour,
                multiple: 1,
            },
            missing_prob: 0.02,
            num_categories: 10,
            seed: 0,
            floats: FloatFormat::Fixed3,
        }
    }
}

impl GenConfig {
    /// The long-series, full-precision dataset of the README's performance section:
    /// 2,000 hourly series of 500-5,000 points, 1% missing, 17-digit floats (~100 MB).
    pub fn long_series() -> Self {
        GenConfig {
            num_series: 2000,
            min_len: 500,
            max_len: 5000,
            missing_prob: 0.01,
            floats: FloatFormat::Shortest,
            ..GenConfig::default()
        }
    }
}

/// Appends series `i` as one JSON line (with the trailing newline) to `buf`.
pub fn write_series(cfg: &GenConfig, i: usize, buf: &mut Vec<u8>) {
    let mut rng = Rng::new(cfg.seed ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let len = rng.range_inclusive(cfg.min_len, cfg.max_len.max(cfg.min_len));
    let base = DateTime::parse("2020-01-01 00:00:00").expect("constant timestamp");
    let start = Period::containing(base, cfg.freq).shifted(rng.range_inclusive(0, 2000) as i64);
    let level = 10.0 + 990.0 * rng.next_f64();
    let amp = 0.5 * rng.next_f64();
    let period = 24.0;
    let cat = if cfg.num_categories > 0 {
        i % cfg.num_categories
    } else {
        0
    };
    // `write!` to a Vec cannot fail.
    let _ = write!(
        buf,
        r#"{{"start": "{}", "item_id": "item_{i}", "feat_static_cat": [{cat}], "target": ["#,
        start.start_time()
    );
    for t in 0..len {
        if t > 0 {
            buf.extend_from_slice(b", ");
        }
        let u = rng.next_f64();
        if u < cfg.missing_prob {
            buf.extend_from_slice(if u < cfg.missing_prob / 4.0 {
                b"\"NaN\""
            } else {
                b"null"
            });
        } else {
            let season = (std::f64::consts::TAU * t as f64 / period).sin();
            let noise = rng.next_f64() - 0.5;
            let v = level * (1.0 + amp * season) + 0.1 * level * noise;
            let _ = match cfg.floats {
                FloatFormat::Fixed3 => write!(buf, "{v:.3}"),
                // Rust's `Display` for f64 is the shortest round-trip text, as
                // Python's `repr`; the values here (1..2000) need no exponent.
                FloatFormat::Shortest => write!(buf, "{v}"),
            };
        }
    }
    buf.extend_from_slice(b"]}\n");
}

/// Writes the whole dataset to `w`; returns the number of bytes.
///
/// # Errors
/// I/O errors from `w`.
pub fn write_dataset(cfg: &GenConfig, mut w: impl Write) -> io::Result<u64> {
    let mut buf = Vec::with_capacity(1 << 16);
    let mut total = 0u64;
    for i in 0..cfg.num_series {
        buf.clear();
        write_series(cfg, i, &mut buf);
        w.write_all(&buf)?;
        total += buf.len() as u64;
    }
    w.flush()?;
    Ok(total)
}

/// Writes the dataset to a file; returns the number of bytes.
///
/// # Errors
/// I/O errors.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::synth::{write_file, GenConfig};
/// let path = std::env::temp_dir().join(format!("gen-doc-{}.jsonl", std::process::id()));
/// let cfg = GenConfig { num_series: 3, min_len: 10, max_len: 20, ..GenConfig::default() };
/// let bytes = write_file(&cfg, &path).unwrap();
/// let entries = shmpipe_timeseries::jsonl::read_file(&path, cfg.freq).unwrap();
/// std::fs::remove_file(&path).unwrap();
/// assert_eq!(entries.len(), 3);
/// assert!(bytes > 0);
/// ```
pub fn write_file(cfg: &GenConfig, path: impl AsRef<Path>) -> io::Result<u64> {
    let f = File::create(path)?;
    write_dataset(cfg, BufWriter::with_capacity(1 << 20, f))
}

/// The dataset as one in-memory buffer.
pub fn to_bytes(cfg: &GenConfig) -> Vec<u8> {
    let mut v = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = write_dataset(cfg, &mut v);
    v
}
