//! Pipeline measurements that set the defaults (figures in docs/figures.md):
//! worker scaling on CPU-bound steps, fused vs staged, batch size sweep, and copy vs
//! zero-copy vs adaptive by array size. Prints ratios measured side by side in one run.
//!
//! `cargo run --release -p shmpipe --example pipeline_bench [quick]`

use std::process::ExitCode;
use std::time::Instant;

use shmpipe::{
    ChannelGeometry, Item, Pipeline, PipelineBuilder, Registry, Source, SourceError, StepError,
    Topology, Transfer, map, ndarray::Array1, part_range,
};

type BoxError = Box<dyn std::error::Error>;

/// Generates items on demand: `x` = `len` floats.
struct Gen {
    range: std::ops::Range<usize>,
    len: usize,
}

impl Source for Gen {
    fn len(&self) -> usize {
        self.range.len()
    }
    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        let i = self.range.start + index;
        Ok(Item::new().with_meta("i", i as i64).with(
            "x",
            Array1::from_shape_fn(self.len, |j| (i + j) as f32 * 1e-3),
        ))
    }
}

fn registry() -> Registry {
    Registry::new()
        .source("gen", |cx| {
            let n = cx.args["n"].as_u64().unwrap_or(1000) as usize;
            let len = cx.args["len"].as_u64().unwrap_or(64) as usize;
            Ok(Gen {
                range: part_range(n, cx.part, cx.parts),
                len,
            })
        })
        // CPU-bound: `iters` rounds of a cheap transcendental map over the array.
        .step("burn", |cx| {
            let iters = cx.args["iters"].as_u64().unwrap_or(0);
            Ok(map(move |mut it: Item| {
                let mut x = it
                    .array_mut::<f32>("x")
                    .ok_or_else(|| StepError::new("no x"))?;
                for _ in 0..iters {
                    x.mapv_inplace(|v| (v * 0.999 + 0.001).sin());
                }
                Ok(it)
            }))
        })
}

/// Steady-state items/s: from the first output to the last (process start-up excluded).
fn measure(b: PipelineBuilder, n: usize) -> Result<f64, BoxError> {
    let p = b.start()?;
    let mut t0 = None;
    let mut got = 0usize;
    for it in p {
        it?;
        t0.get_or_insert_with(Instant::now);
        got += 1;
    }
    if got != n {
        return Err(format!("{got} outputs for {n} inputs").into());
    }
    Ok((n - 1) as f64 / t0.map_or(1e-9, |t| t.elapsed().as_secs_f64()))
}

/// Best of `reps` runs (the VM is noisy; the best run is the least disturbed).
fn best(reps: usize, f: impl Fn() -> Result<f64, BoxError>) -> Result<f64, BoxError> {
    (0..reps).try_fold(0.0, |b, _| Ok(f()?.max(b)))
}

fn main() -> ExitCode {
    let reg = registry();
    shmpipe::init(&reg);
    match run(&reg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pipeline_bench: {e}"); // Display, not Debug: the message says what to change
            ExitCode::FAILURE
        }
    }
}

fn run(reg: &Registry) -> Result<(), BoxError> {
    // `small [n]`: only the small-item figure (16-float items, one trivial step, 2 workers,
    // default batch), best of 3, for profiling and quick comparisons.
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "small") {
        let n: usize = args
            .get(i + 1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(200_000);
        return small_items(reg, n);
    }
    let quick = args.iter().any(|a| a == "quick");
    let b = Bench {
        reg,
        quick,
        reps: if quick { 1 } else { 3 },
    };
    b.worker_scaling()?;
    b.fused_vs_staged()?;
    b.batch_sizes()?;
    b.transfer_modes()
}

/// The small-item figure alone: 16-float items, one trivial step, 2 workers, best of 3.
fn small_items(reg: &Registry, n: usize) -> Result<(), BoxError> {
    let r = best(3, || {
        measure(
            Pipeline::builder(reg)
                .source_named("gen", serde_json::json!({"n": n, "len": 16}))
                .child_args(vec!["small".to_owned(), n.to_string()])
                .step("burn")
                .workers(2),
            n,
        )
    })?;
    println!("small items (16 floats, trivial step, 2 workers, {n} items): {r:.0} items/s");
    Ok(())
}

/// The settings every table shares.
struct Bench<'a> {
    reg: &'a Registry,
    /// Fewer items and one run per figure.
    quick: bool,
    /// Runs per figure (the best is kept).
    reps: usize,
}

impl Bench<'_> {
    /// A pipeline over `n` generated items of `len` floats.
    fn base(&self, n: usize, len: usize) -> PipelineBuilder {
        Pipeline::builder(self.reg)
            .source_named("gen", serde_json::json!({"n": n, "len": len}))
            .child_args(Vec::<String>::new())
    }

    /// Items of the CPU-bound tables.
    fn cpu_items(&self) -> usize {
        if self.quick { 1000 } else { 4000 }
    }

    /// Items of the trivial-step tables.
    fn light_items(&self) -> usize {
        if self.quick { 20_000 } else { 100_000 }
    }

    /// 1. Worker scaling, CPU-bound steps (~0.3 ms per item).
    fn worker_scaling(&self) -> Result<(), BoxError> {
        let (n, reps) = (self.cpu_items(), self.reps);
        let cpu = |w: usize| {
            best(reps, || {
                measure(
                    self.base(n, 256)
                        .step_with("burn", serde_json::json!({"iters": 200}))
                        .workers(w),
                    n,
                )
            })
        };
        let (w1, w2) = (cpu(1)?, cpu(2)?);
        println!("## worker scaling (CPU-bound step, {n} items)");
        println!(
            "(items/s: outputs per second at the consumer from the first output to the last, \
             best of {reps} runs, here and below; the step `burn` maps sin over 256 floats 200 \
             times)"
        );
        println!("| workers | items/s | vs 1 worker |\n|---|---|---|");
        println!("| 1 | {w1:.0} | 1.00x |\n| 2 | {w2:.0} | {:.2}x |", w2 / w1);
        Ok(())
    }

    /// 2. Fused vs staged: two steps of equal cost, two worker processes either way.
    fn fused_vs_staged(&self) -> Result<(), BoxError> {
        let (n, light, reps) = (self.cpu_items(), self.light_items(), self.reps);
        let two = |topo: Topology| {
            best(reps, || {
                measure(
                    self.base(n, 256)
                        .step_with("burn", serde_json::json!({"iters": 100}))
                        .step_with("burn", serde_json::json!({"iters": 100}))
                        .workers(2)
                        .topology(topo.clone()),
                    n,
                )
            })
        };
        let fused = two(Topology::Fused)?;
        let staged = two(Topology::Staged {
            workers: vec![1, 1],
        })?;
        let cheap = |topo: Topology| {
            best(reps, || {
                measure(
                    self.base(light, 16)
                        .step("burn")
                        .step("burn")
                        .workers(2)
                        .topology(topo.clone()),
                    light,
                )
            })
        };
        let fused_l = cheap(Topology::Fused)?;
        let staged_l = cheap(Topology::Staged {
            workers: vec![1, 1],
        })?;
        println!("\n## fused vs staged (2 steps, 2 worker processes)");
        println!(
            "(fused: each worker runs both steps; staged: one worker per step, with a queue \
             between them)"
        );
        println!(
            "| workload | fused items/s | staged items/s | staged / fused |\n|---|---|---|---|"
        );
        println!(
            "| CPU-bound ({n} items) | {fused:.0} | {staged:.0} | {:.2}x |",
            staged / fused
        );
        println!(
            "| trivial steps, 16 floats ({light} items) | {fused_l:.0} | {staged_l:.0} | {:.2}x |",
            staged_l / fused_l
        );
        Ok(())
    }

    /// 3. Batch size sweep: trivial step, small items (overhead-bound).
    fn batch_sizes(&self) -> Result<(), BoxError> {
        let light = self.light_items();
        println!("\n## batch size (trivial step, 16-float items, {light} items, 2 workers)");
        println!(
            "(batch bytes: items cross processes in batches of about this many bytes; vs best: \
             items/s over the fastest batch size)"
        );
        println!("| batch bytes | items/s | vs best |\n|---|---|---|");
        let sizes = [256usize, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10];
        let rates: Vec<f64> = sizes
            .iter()
            .map(|&bb| {
                best(self.reps, || {
                    measure(
                        self.base(light, 16).step("burn").workers(2).batch_bytes(bb),
                        light,
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        let top = rates.iter().copied().fold(0.0, f64::max);
        for (bb, r) in sizes.iter().zip(&rates) {
            println!("| {bb} | {r:.0} | {:.2}x |", r / top);
        }
        Ok(())
    }

    /// 4. Transfer mode by array size (trivial step).
    fn transfer_modes(&self) -> Result<(), BoxError> {
        println!("\n## transfer mode by array size (trivial step, 2 workers)");
        println!(
            "(copy: arrays copied into the channel; zero-copy: written once into a shared pool \
             block and read in place; adaptive: zero-copy from 64 KiB up; adaptive / best: \
             adaptive over the better of copy and zero-copy)"
        );
        println!(
            "| floats per array | copy items/s | zero-copy | adaptive (64 KiB) | zero-copy / copy | adaptive / best |"
        );
        println!("|---|---|---|---|---|---|");
        for len in [256usize, 4096, 65_536, 262_144] {
            let m = (if self.quick { 4_000_000 } else { 16_000_000 } / len).clamp(200, 20_000);
            let run = |t: Transfer| {
                best(self.reps, || {
                    measure(
                        self.base(m, len)
                            .step("burn")
                            .workers(2)
                            .transfer(t)
                            .channel(ChannelGeometry {
                                block_size: (len * 4 + 4096).max(1 << 20),
                                ..ChannelGeometry::default()
                            }),
                        m,
                    )
                })
            };
            let c = run(Transfer::Copy)?;
            let z = run(Transfer::ZeroCopy)?;
            let a = run(Transfer::Adaptive {
                threshold: 64 << 10,
            })?;
            println!(
                "| {len} | {c:.0} | {z:.0} | {a:.0} | {:.2}x | {:.2}x |",
                z / c,
                a / c.max(z)
            );
        }
        Ok(())
    }
}
