//! 1M-element f32 arrays (4 MB each) through two steps with 2 workers, in copy, zero-copy and
//! adaptive transfer modes; prints a comparison table.
//!
//! `cargo run --release -p shmpipe --example pipeline_1m [items]`

use std::process::ExitCode;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use shmpipe::{
    Item, Pipeline, Registry, Source, SourceError, StepError, Transfer, map, ndarray::Array1,
    part_range,
};

const LEN: usize = 1 << 20;

/// Generates item `i` when it is read (a custom [`Source`]).
struct Big {
    range: std::ops::Range<usize>,
}

impl Source for Big {
    fn len(&self) -> usize {
        self.range.len()
    }
    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        let i = self.range.start + index;
        Ok(Item::new()
            .with_meta("i", i as i64)
            .with("x", Array1::from_elem(LEN, i as f32)))
    }
}

fn registry() -> Registry {
    Registry::new()
        .source("big", |cx| {
            let n = cx.args["n"].as_u64().unwrap_or(100) as usize;
            Ok(Big {
                range: part_range(n, cx.part, cx.parts),
            })
        })
        .step("scale", |_| {
            Ok(map(|mut it: Item| {
                it.array_mut::<f32>("x")
                    .ok_or_else(|| StepError::new("no x"))?
                    .mapv_inplace(|v| v * 2.0);
                Ok(it)
            }))
        })
        .step("offset", |_| {
            Ok(map(|mut it: Item| {
                it.array_mut::<f32>("x")
                    .ok_or_else(|| StepError::new("no x"))?
                    .mapv_inplace(|v| v + 1.0);
                Ok(it)
            }))
        })
}

fn main() -> ExitCode {
    let reg = registry();
    shmpipe::init(&reg);
    match run(&reg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pipeline_1m: {e}"); // Display, not Debug: the message says what to change
            ExitCode::FAILURE
        }
    }
}

fn run(reg: &Registry) -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let modes = [
        ("copy", Transfer::Copy),
        ("zero-copy", Transfer::ZeroCopy),
        (
            "adaptive (64 KiB)",
            Transfer::Adaptive {
                threshold: 64 << 10,
            },
        ),
    ];
    let mut rows = Vec::new();
    for (name, transfer) in modes {
        rows.push(run_mode(reg, n, name, transfer)?);
    }
    print_table(n, &rows);
    Ok(())
}

/// One row of the table: mode, items/s, GB/s, arrays zero-copied, arrays copied, ms per item
/// in `scale`, ms per item in `offset`.
type Row = (&'static str, f64, f64, u64, u64, f64, f64);

/// Runs `n` items through the pipeline with arrays moved by `transfer`, checking every output.
fn run_mode(
    reg: &Registry,
    n: u64,
    name: &'static str,
    transfer: Transfer,
) -> Result<Row, Box<dyn std::error::Error>> {
    let mut p = Pipeline::builder(reg)
        .source_named("big", serde_json::json!({"n": n}))
        .step("scale")
        .step("offset")
        .workers(2)
        .transfer(transfer)
        .batch_bytes(1)
        // One 4 MB array (or one 4 MB message body) per pool block.
        .channel(shmpipe::ChannelGeometry {
            blocks: 6,
            block_size: (LEN * 4) + (64 << 10),
            ..Default::default()
        })
        .child_args(Vec::<String>::new())
        .start()?;
    let bar = ProgressBar::new(n).with_style(
        ProgressStyle::with_template("{prefix:>18} {bar:40} {pos}/{len} {per_sec}")
            .expect("template"),
    );
    bar.set_prefix(name);
    let t0 = Instant::now();
    let mut checked = 0u64;
    while let Some(it) = p.dequeue()? {
        let i = it.i64("i").unwrap_or(-1) as f32;
        let x = it
            .array::<f32>("x")
            .ok_or("an output item has no f32 array x")?;
        if x[LEN - 1] != i * 2.0 + 1.0 {
            let want = i * 2.0 + 1.0;
            return Err(format!("item {i}: x[{}] is {}, not {want}", LEN - 1, x[LEN - 1]).into());
        }
        checked += 1;
        bar.inc(1);
    }
    let secs = t0.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let m = p.metrics();
    if checked != n {
        return Err(format!("{checked} outputs for {n} inputs").into());
    }
    let per_item = |step: &str| {
        m.steps
            .iter()
            .find(|s| s.0 == step)
            .map_or(0.0, |s| s.2.as_secs_f64() * 1e3 / s.1.max(1) as f64)
    };
    Ok((
        name,
        n as f64 / secs,
        n as f64 * (LEN * 4) as f64 / secs / 1e9,
        m.arrays_zero_copy,
        m.arrays_copied,
        per_item("scale"),
        per_item("offset"),
    ))
}

/// Prints the table of `rows` and its legend.
fn print_table(n: u64, rows: &[Row]) {
    println!("{n} items of {LEN} f32 through 2 steps, 2 workers");
    println!(
        "{:<18} {:>9} {:>7} {:>12} {:>7} {:>12} {:>13} {:>8}",
        "mode",
        "items/s",
        "GB/s",
        "zero-copied",
        "copied",
        "scale ms/it",
        "offset ms/it",
        "vs copy"
    );
    let base = rows[0].1;
    for (name, ips, gbs, zc, cp, sc, off) in rows {
        println!(
            "{name:<18} {ips:>9.1} {gbs:>7.2} {zc:>12} {cp:>7} {sc:>12.2} {off:>13.2} {:>7.2}x",
            ips / base
        );
    }
    println!(
        "(items/s, GB/s: arrays delivered to the consumer per second; zero-copied, copied: array \
         transfers between processes without / with a copy (each item crosses twice); scale ms/it, offset ms/it: time \
         per item inside the steps `scale` (x*2) and `offset` (x+1); vs copy: items/s over the \
         copy row)"
    );
}
