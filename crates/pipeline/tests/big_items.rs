//! Items of any size the machine holds travel through a pipeline without settings (issue 18):
//! arrays far larger than a pool block, from an emitter, out of a step, through every
//! topology and transfer mode, with the memory they took given back afterwards.

mod common;

use common::ShmGuard;
use shmpipe::ndarray::Array1;
use shmpipe::{Epochs, Item, MemorySource, Pipeline, Registry, StepError, Topology, Transfer, map};

/// Floats per item of the `sized` source, in a mix that crosses the block size (1 MiB) in
/// both directions: small, just over a block, several blocks, tens of blocks.
const SIZES: [usize; 6] = [16, 300_000, 1_000, 700_000, 1_500_000, 262_144];

fn sized_items(n: usize) -> Vec<Item> {
    (0..n)
        .map(|i| {
            let len = SIZES[i % SIZES.len()];
            Item::new()
                .with_meta("i", i as i64)
                .with("x", Array1::from_shape_fn(len, |j| ((i + j) % 1000) as f32))
        })
        .collect()
}

/// The sum of item `i`'s array after `double`.
fn expected_sum(i: usize) -> f64 {
    let len = SIZES[i % SIZES.len()];
    (0..len).map(|j| 2.0 * ((i + j) % 1000) as f64).sum()
}

fn registry() -> Registry {
    Registry::new()
        .source("sized", |cx| {
            let n = cx.args["n"].as_u64().unwrap_or(12) as usize;
            Ok(MemorySource::new(sized_items(n)).part(cx.part, cx.parts))
        })
        .step("double", |_| {
            Ok(map(|mut it: Item| {
                let mut x = it
                    .array_mut::<f32>("x")
                    .ok_or_else(|| StepError::new("no x"))?;
                x.mapv_inplace(|v| v * 2.0);
                Ok(it)
            }))
        })
        // A small input becomes a large output: `grow` floats made by the worker.
        .step("grow", |cx| {
            let len = cx.args["len"].as_u64().unwrap_or(0) as usize;
            Ok(map(move |it: Item| {
                let i = it.i64("i").unwrap_or(0);
                Ok(it.with("big", Array1::from_elem(len, i as f32)))
            }))
        })
}

fn sums(out: &[Item]) -> Vec<(i64, f64)> {
    let mut v: Vec<(i64, f64)> = out
        .iter()
        .map(|it| {
            let x = it.array::<f32>("x").expect("x");
            (
                it.i64("i").expect("i"),
                x.iter().map(|&v| f64::from(v)).sum(),
            )
        })
        .collect();
    v.sort_by_key(|p| p.0);
    v
}

#[test]
fn arrays_many_blocks_large_cross_every_topology_without_settings() {
    let reg = registry();
    shmpipe::init(&reg);
    let n = 12;
    let want: Vec<(i64, f64)> = (0..n).map(|i| (i as i64, expected_sum(i))).collect();
    for (topology, transfer, ordered) in [
        (Topology::Fused, Transfer::default(), false),
        (Topology::Fused, Transfer::Copy, true),
        (Topology::Fused, Transfer::ZeroCopy, false),
        (
            Topology::Staged {
                workers: vec![2, 1],
            },
            Transfer::default(),
            true,
        ),
    ] {
        let what = format!("{topology:?} {transfer:?} ordered={ordered}");
        let p = Pipeline::builder(&reg)
            .source_named("sized", serde_json::json!({ "n": n }))
            .step("double")
            .step_with("grow", serde_json::json!({ "len": 0 }))
            .workers(2)
            .topology(topology)
            .transfer(transfer)
            .ordered(ordered)
            .start()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let _g = ShmGuard::containing(p.id().to_owned());
        let out: Vec<Item> = p
            .map(|r| r.unwrap_or_else(|e| panic!("{what}: {e}")))
            .collect();
        assert_eq!(sums(&out), want, "{what}");
        if ordered {
            let order: Vec<i64> = out.iter().map(|it| it.i64("i").unwrap()).collect();
            assert_eq!(order, (0..n as i64).collect::<Vec<_>>(), "{what}");
        }
    }
}

#[test]
fn a_step_may_make_outputs_far_larger_than_a_block() {
    let reg = registry();
    shmpipe::init(&reg);
    // 4M floats = 16 MB per output, from 16-float inputs.
    let len = 4_000_000usize;
    let mut p = Pipeline::builder(&reg)
        .step_with("grow", serde_json::json!({ "len": len }))
        .workers(2)
        .start()
        .unwrap();
    let _g = ShmGuard::containing(p.id().to_owned());
    for i in 0..6i64 {
        p.enqueue(Item::new().with_meta("i", i)).unwrap();
    }
    p.close_input();
    let mut seen = Vec::new();
    for r in p.by_ref() {
        let it = r.unwrap();
        let i = it.i64("i").unwrap();
        let big = it.array::<f32>("big").unwrap();
        assert_eq!(big.len(), len);
        assert!(big.iter().all(|&v| v == i as f32), "item {i}");
        seen.push(i);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..6).collect::<Vec<_>>());
    assert!(p.is_finished());
}

#[test]
fn an_endless_source_of_large_items_keeps_flowing() {
    // Blocks of the large size class come back and are used again: many more large items
    // than any channel could hold at once go through.
    let reg = registry();
    shmpipe::init(&reg);
    let mut p = Pipeline::builder(&reg)
        .source_named("sized", serde_json::json!({ "n": 6 }))
        .epochs(Epochs::Cycle)
        .step("double")
        .workers(2)
        .start()
        .unwrap();
    let _g = ShmGuard::containing(p.id().to_owned());
    let mut bytes = 0usize;
    for r in p.take_epoch(24) {
        let it = r.unwrap();
        let i = it.i64("i").unwrap() as usize;
        let x = it.array::<f32>("x").unwrap();
        let s: f64 = x.iter().map(|&v| f64::from(v)).sum();
        assert_eq!(s, expected_sum(i), "item {i}");
        bytes += x.len() * 4;
    }
    assert!(bytes > 20 << 20, "{bytes} bytes");
}

#[test]
fn an_item_too_large_for_an_explicitly_small_channel_names_the_setting_in_the_parent() {
    let reg = registry();
    shmpipe::init(&reg);
    // From a worker's step (16 MiB outputs, channels without a large pool), and from an
    // emitter (its 6 MB items into a large pool of 4 MiB).
    for (large_pool, from_source, role) in [(0usize, false, "worker"), (4 << 20, true, "emitter")] {
        let b = Pipeline::builder(&reg)
            .workers(2)
            .channel(shmpipe::ChannelGeometry {
                large_pool,
                ..shmpipe::ChannelGeometry::default()
            });
        let b = if from_source {
            b.source_named("sized", serde_json::json!({ "n": 6 }))
                .step("double")
        } else {
            b.source_named("sized", serde_json::json!({ "n": 1 }))
                .step_with("grow", serde_json::json!({ "len": 4 << 20 }))
        };
        let p = b.start().unwrap();
        let _g = ShmGuard::containing(p.id().to_owned());
        let err = p
            .map(|r| r.map(|_| ()))
            .find_map(Result::err)
            .expect("an error");
        let msg = err.to_string();
        assert!(
            matches!(err, shmpipe::Error::TooLarge { .. }),
            "{large_pool}: {err:?}"
        );
        assert!(msg.contains("ChannelGeometry::large_pool"), "{msg}");
        assert!(msg.contains(role), "{msg}");
        assert!(!msg.contains("lost a peer"), "{msg}");
    }
}

#[test]
fn a_child_that_fails_at_start_gives_the_parent_its_reason() {
    let reg = registry();
    shmpipe::init(&reg);
    // Emitters and workers create their channels themselves: an address-space size that is
    // not a whole number of pages makes each of them fail before the pipeline starts.
    let err = Pipeline::builder(&reg)
        .source_named("sized", serde_json::json!({ "n": 1 }))
        .step("double")
        .workers(2)
        .channel(shmpipe::ChannelGeometry {
            large_pool: 4095,
            ..shmpipe::ChannelGeometry::default()
        })
        .start()
        .map(|_| ())
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("large_pool = 4095"), "{msg}");
    assert!(!msg.contains("see its stderr"), "{msg}");
}

/// Three 24 MB items, then small ones: made when read, so the source can be long.
struct BigThenSmall(usize);

impl shmpipe::Source for BigThenSmall {
    fn len(&self) -> usize {
        self.0
    }
    fn read(&mut self, i: usize) -> Result<Item, shmpipe::SourceError> {
        let len = if i < 3 { 6_000_000 } else { 16 };
        Ok(Item::new()
            .with_meta("i", i as i64)
            .with("x", Array1::from_elem(len, 1.0f32)))
    }
}

#[test]
fn memory_taken_by_large_items_is_given_back_once_they_stop() {
    let reg = registry().source("big_then_small", |_| Ok(BigThenSmall(2_000_000)));
    shmpipe::init(&reg);
    let mut p = Pipeline::builder(&reg)
        .source_named("big_then_small", serde_json::json!({}))
        .ordered(true)
        .step("double")
        .workers(2)
        .start()
        .unwrap();
    let _g = ShmGuard::containing(p.id().to_owned());
    let mut pids = p.pids();
    pids.push(std::process::id());
    let mut peak = 0;
    let mut held = Vec::new();
    for r in p.by_ref().take(3) {
        held.push(r.unwrap());
        peak = peak.max(common::proc::memfd_bytes(&pids));
    }
    assert!(peak >= 24 << 20, "the large items took {peak} bytes");
    drop(held);
    // Small items keep flowing: once the large ones have been unused for a while, the
    // channels give their pages back.
    let t0 = std::time::Instant::now();
    let mut after = u64::MAX;
    while t0.elapsed() < std::time::Duration::from_secs(5) {
        let it = p.next().unwrap().unwrap();
        assert_eq!(it.array::<f32>("x").unwrap().len(), 16);
        after = common::proc::memfd_bytes(&pids);
        if t0.elapsed() > 3 * shm_ring::LARGE_KEEP && after < 8 << 20 {
            break;
        }
    }
    assert!(
        after < 8 << 20,
        "{after} bytes still held ({peak} at the peak)"
    );
}

/// Peak resident memory of process `pid` (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

#[test]
fn a_worker_does_not_hold_every_output_of_a_received_batch() {
    // Small inputs arrive a hundred to a message; each becomes a 4 MB output. A worker that
    // ran the whole message before sending anything held hundreds of megabytes (issue 18: the
    // shared time-series store's memory grew with the workers for this reason).
    let reg = registry();
    shmpipe::init(&reg);
    let mut p = Pipeline::builder(&reg)
        .step_with("grow", serde_json::json!({ "len": 1 << 20 }))
        .workers(1)
        .start()
        .unwrap();
    let _g = ShmGuard::containing(p.id().to_owned());
    let worker = p.pids()[0];
    for i in 0..120i64 {
        p.enqueue(Item::new().with_meta("i", i)).unwrap();
    }
    p.close_input();
    let mut n = 0;
    for r in p {
        let it = r.unwrap();
        assert_eq!(it.array::<f32>("big").unwrap().len(), 1 << 20);
        n += 1;
        if n == 100 {
            let peak = peak_rss(worker);
            assert!(peak < 100 << 20, "the worker's peak RSS is {peak} bytes");
        }
    }
    assert_eq!(n, 120);
}
