//! End-to-end runs with real worker processes.

mod common;

use common::*;
use shmpipe::{Item, Pipeline, Topology};

fn sorted_ns(items: &[Item]) -> Vec<(i64, i64)> {
    let mut v: Vec<_> = items
        .iter()
        .map(|i| (i.i64("n").unwrap(), i.i64("sub").unwrap_or(-1)))
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn enqueue_dequeue_like_the_seed() {
    let reg = registry();
    shmpipe::init(&reg);
    for socket in [true, false] {
        let mut p = Pipeline::builder(&reg)
            .step("inc")
            .step("inc")
            .workers(2)
            .socket_transport(socket)
            .start()
            .unwrap();
        let _g = ShmGuard::containing(p.id().to_owned());
        p.enqueue(Item::new().with_meta("n", 3)).unwrap();
        let out = p.dequeue().unwrap().unwrap();
        assert_eq!(out.i64("n"), Some(5));
        for n in 0..100 {
            p.enqueue(Item::new().with_meta("n", n)).unwrap();
        }
        p.close_input();
        let mut got: Vec<i64> = p.by_ref().map(|r| r.unwrap().i64("n").unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, (2..102).collect::<Vec<_>>());
        assert!(p.is_finished());
        let id = p.id().to_owned();
        drop(p);
        assert!(shm_entries(&id).is_empty());
    }
}

#[test]
fn source_fan_out_exact_end_of_stream() {
    let reg = registry();
    shmpipe::init(&reg);
    let n = 500i64;
    let mut expected = Vec::new();
    for i in 0..n {
        for j in 0..fan_count(i, 4) {
            expected.push((i, j));
        }
    }
    for (topo, socket) in [
        (Topology::Fused, false),
        (
            Topology::Staged {
                workers: vec![1, 3],
            },
            false,
        ),
        (Topology::Fused, true),
    ] {
        let p = Pipeline::builder(&reg)
            .source_named("range", serde_json::json!({"n": n, "len": 8}))
            .emitters(3)
            .step_with("fan", serde_json::json!({"max": 4}))
            .step("tag_worker")
            .workers(2)
            .topology(topo.clone())
            .batch_bytes(1000)
            .socket_transport(socket)
            .start()
            .unwrap();
        let id = p.id().to_owned();
        let _g = ShmGuard::containing(id.clone());
        let items: Vec<Item> = p.map(|r| r.unwrap()).collect();
        assert_eq!(sorted_ns(&items), expected, "{topo:?}");
        assert!(shm_entries(&id).is_empty(), "leaked segments of {id}");
    }
}

#[test]
fn empty_source_ends_cleanly() {
    let reg = registry();
    shmpipe::init(&reg);
    let p = Pipeline::builder(&reg)
        .source_named("range", serde_json::json!({"n": 0, "len": 3}))
        .emitters(1)
        .workers(1)
        .step_with("fan", serde_json::json!({"max": 3}))
        .step("inc")
        .start()
        .unwrap();
    let got: Vec<Item> = p.map(|r| r.unwrap()).collect();
    assert!(got.is_empty());
}

#[test]
fn channels_larger_than_memory_are_a_clear_error_at_start() {
    let reg = registry();
    shmpipe::init(&reg);
    // Far more than any machine holds: 64 channels' pools of 4096 blocks of 1 GiB. Channels
    // are anonymous shared memory (RAM), so the check is against available memory, before
    // any process starts or any page is reserved.
    let err = Pipeline::builder(&reg)
        .source_named("range", serde_json::json!({"n": 10}))
        .emitters(8)
        .workers(8)
        .step("inc")
        .channel(shmpipe::ChannelGeometry {
            slots: 0,
            blocks: 4096,
            block_size: 1 << 30,
            ..shmpipe::ChannelGeometry::default()
        })
        .start()
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("of memory") && msg.contains("PipelineBuilder::channel"),
        "{msg}"
    );
}

#[test]
fn consumer_reads_zero_copy_arrays_in_place_and_never_starves_the_pool() {
    let reg = registry();
    shmpipe::init(&reg);
    let p = Pipeline::builder(&reg)
        .source_named("range", serde_json::json!({"n": 120, "len": 50_000}))
        .step("inc")
        .workers(2)
        .transfer(shmpipe::Transfer::ZeroCopy)
        .start()
        .unwrap();
    let id = p.id().to_owned();
    let _g = ShmGuard::containing(id.clone());
    // Holding every item: leases are capped (half of each worker's pool blocks), the rest is
    // copied, so the pipeline cannot stall on its own outputs.
    let items: Vec<Item> = p.map(|r| r.unwrap()).collect();
    assert_eq!(items.len(), 120);
    let shared = items
        .iter()
        .filter(|i| i.get("x").unwrap().is_shared())
        .count();
    assert!(shared >= 1, "no array was read in place");
    assert!(
        shared <= 6,
        "{shared} leases exceed the cap (3 blocks per worker)"
    );
    // Readable after the pipeline is gone (the mapping lives as long as the items).
    assert!(shm_entries(&id).is_empty());
    for it in &items {
        let n = it.i64("n").unwrap() - 1;
        let x = it.array::<f32>("x").unwrap();
        assert_eq!(x.len(), 50_000);
        assert!(x.iter().all(|&v| v == n as f32));
        assert_eq!(it.get("x").unwrap().nbytes(), 200_000);
        // Listing the arrays copies nothing: a leased array is still viewed in place.
        for (name, a) in it.arrays() {
            assert_eq!(name, "x");
            assert_eq!(a.bytes().as_ptr(), x.as_ptr().cast::<u8>());
            assert_eq!(a.is_shared(), it.get("x").unwrap().is_shared());
        }
    }
    let mut one = items[0].clone();
    if one.get("x").unwrap().is_shared() {
        one.array_mut::<f32>("x").unwrap()[0] = -1.0;
        assert!(!one.get("x").unwrap().is_shared());
        assert_ne!(one, items[0]);
    }
}

#[test]
fn an_item_too_large_for_the_channel_is_a_clear_error() {
    let reg = registry();
    shmpipe::init(&reg);
    let mut p = Pipeline::builder(&reg)
        .step("inc")
        .workers(1)
        .transfer(shmpipe::Transfer::ZeroCopy)
        .channel(shmpipe::ChannelGeometry {
            slots: 64,
            blocks: 4,
            block_size: 64 << 10,
            // Explicitly limited: without a large pool, an array must fit a block.
            large_pool: 0,
        })
        .start()
        .unwrap();
    let _g = ShmGuard::containing(p.id().to_owned());
    let big = ndarray::Array1::<f32>::zeros(1 << 20); // 4 MiB, blocks hold 64 KiB
    // Enqueueing never blocks: the error surfaces either at a later enqueue or at the consumer.
    let mut err = None;
    for _ in 0..50 {
        if let Err(e) = p.enqueue(Item::new().with_meta("n", 0).with("x", big.clone())) {
            err = Some(e);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let err = match err {
        Some(e) => e,
        None => {
            p.close_input();
            p.by_ref()
                .find_map(|r| r.err())
                .expect("the consumer must get an error")
        }
    };
    let text = err.to_string();
    assert!(
        text.contains("PipelineBuilder::channel"),
        "unclear error: {text}"
    );
    assert!(
        text.contains("4194304 bytes"),
        "error should name the size: {text}"
    );
    let id = p.id().to_owned();
    drop(p);
    assert!(shm_entries(&id).is_empty());
}

#[test]
fn step_metrics_count_every_input_and_at_least_its_time() {
    // A one-step chain is timed per run of a batch's inputs, a longer one per call: both
    // must count every input and at least the time the step spent.
    let reg = registry();
    shmpipe::init(&reg);
    let n = 30u64;
    for steps in [1usize, 2] {
        let mut b = Pipeline::builder(&reg)
            .source_named("range", serde_json::json!({"n": n, "len": 4}))
            .workers(2);
        for _ in 0..steps {
            b = b.step_with("sleep_ms", serde_json::json!({"ms": 1}));
        }
        let mut p = b.start().unwrap();
        let _g = guarded(&p);
        let got: Vec<Item> = p.by_ref().map(|r| r.unwrap()).collect();
        assert_eq!(got.len() as u64, n);
        let m = p.metrics();
        assert_eq!(m.steps.len(), 1, "{:?}", m.steps);
        let (name, calls, time) = &m.steps[0];
        assert_eq!(name, "sleep_ms");
        assert_eq!(*calls, n * steps as u64);
        assert!(
            *time >= std::time::Duration::from_millis(n * steps as u64),
            "{steps} step(s): {time:?} for {calls} calls of 1 ms"
        );
    }
}

/// Review 18, hole 1: a shuffle buffer of 2^40 items was accepted, and each emitter aborted
/// on reserving room for it (a caller feeding the pipeline from memory, the Python package's
/// in-memory sources, aborted itself). It is refused at start, naming the setting.
#[test]
fn a_shuffle_buffer_out_of_range_is_refused_at_start() {
    let reg = registry();
    shmpipe::init(&reg);
    let err = Pipeline::builder(&reg)
        .source_named("range", serde_json::json!({"n": 10}))
        .shuffle(true)
        .shuffle_buffer(1 << 40)
        .step("inc")
        .workers(1)
        .start()
        .map(|_| ())
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, shmpipe::Error::Config(_))
            && msg.contains("PipelineBuilder::shuffle_buffer")
            && msg.contains(&shmpipe::MAX_SHUFFLE_BUFFER.to_string()),
        "{msg}"
    );
}
