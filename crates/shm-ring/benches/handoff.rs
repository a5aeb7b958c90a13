//! Cross-process handoff: messages/s for one f32 array of 16, 1,000 and 1,000,000 elements,
//! copy vs zero-copy vs adaptive. The consumer is a separate process (`shm-ring-peer sink`)
//! pinned to the other core, reading every element (a sum). A batch of `iters` messages counts
//! as done when the consumer has consumed all of them and handed back every block.
//!
//! `cargo bench -p shm-ring` (the full side-by-side comparison with peers is `shmpipe-bench`).
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use shm_ring::{ChannelConfig, Message, MessageBuilder, Sender, Transfer};

struct Sink(Child);
impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pin(core: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(core);
    let _ = rustix::thread::sched_setaffinity(None, &set);
}

fn drain(tx: &mut Sender, blocks: usize) {
    loop {
        let idle = tx.queued_slots().unwrap() == 0 && tx.free_blocks().unwrap() == blocks;
        if idle {
            return;
        }
        std::hint::spin_loop();
    }
}

fn bench(c: &mut Criterion) {
    pin(0);
    let mut group = c.benchmark_group("handoff");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for &elems in &[16usize, 1000, 1_000_000] {
        group.throughput(Throughput::Elements(1)); // one message per iteration: elements/s = msgs/s
        let src: Vec<f32> = (0..elems).map(|i| i as f32).collect();
        for (label, transfer) in [
            ("copy", Transfer::Copy),
            ("zero-copy", Transfer::ZeroCopy),
            ("adaptive", Transfer::default()),
        ] {
            let name = format!("bench-{}-{elems}-{label}", std::process::id());
            let cfg = ChannelConfig {
                blocks: 16,
                block_size: (elems * 4).max(4096) + 4096,
                transfer,
                ..ChannelConfig::default()
            };
            let blocks = cfg.blocks as usize;
            let mut tx = Sender::<Message>::create(&name, &cfg).unwrap();
            let _sink = Sink(
                Command::new(env!("CARGO_BIN_EXE_shm-ring-peer"))
                    .args(["sink", &name, "1"])
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            tx.wait_for_consumer(Duration::from_secs(10)).unwrap();
            group.bench_function(BenchmarkId::new(label, elems), |b| {
                b.iter_custom(|iters| {
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        if transfer == Transfer::ZeroCopy && elems >= 1000 {
                            // Zero-copy proper: fill a loan in place.
                            let loan = tx.loan::<f32>(&[elems]).unwrap().copy_from_slice(&src);
                            tx.send(MessageBuilder::new().array_loan("x", loan))
                                .unwrap();
                        } else {
                            tx.send(
                                MessageBuilder::new()
                                    .array_slice("x", &[elems], &src)
                                    .unwrap(),
                            )
                            .unwrap();
                        }
                    }
                    drain(&mut tx, blocks);
                    t0.elapsed()
                })
            });
        }
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
