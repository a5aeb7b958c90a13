//! The input side of enqueue mode: an `Input` handle whose drop closes the input, `run` for
//! the common case, and a word on stderr when the caller forgot to close it.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use shmpipe::{Error, Item, Pipeline};

#[test]
fn dropping_the_input_handle_closes_the_input() {
    let reg = registry();
    shmpipe::init(&reg);
    let (mut p, _g) = start_killing_on_drop(Pipeline::builder(&reg).step("inc").workers(2));
    let mut input = p.input().unwrap();
    // A second handle, or enqueue beside the handle, is refused.
    assert!(matches!(p.input(), Err(Error::Closed(_))));
    assert!(matches!(p.enqueue(Item::new()), Err(Error::Closed(_))));
    // The handle is Send: feed from another thread, as with a channel sender.
    let feeder = std::thread::spawn(move || {
        for n in 0..100 {
            input.send(Item::new().with_meta("n", n)).unwrap();
        }
        // dropped here: the input closes
    });
    let mut got: Vec<i64> = within(Duration::from_secs(10), "the run", move || {
        p.map(|r| r.unwrap().i64("n").unwrap()).collect()
    });
    feeder.join().unwrap();
    got.sort_unstable();
    assert_eq!(got, (1..101).collect::<Vec<_>>());
}

#[test]
fn run_feeds_closes_and_collects() {
    let reg = registry();
    shmpipe::init(&reg);
    let (p, _g) = start_killing_on_drop(Pipeline::builder(&reg).step("inc").workers(2));
    let items = (0..50).map(|n| Item::new().with_meta("n", n));
    let out = within(Duration::from_secs(10), "run", move || p.run(items));
    let mut got: Vec<i64> = out.unwrap().iter().map(|i| i.i64("n").unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, (1..51).collect::<Vec<_>>());
}

/// In a helper: enqueues one item, takes its output, then waits for more without having
/// closed the input (the forgotten `close_input()`).
fn helper_forgot_close() {
    let reg = registry();
    let mut p = Pipeline::builder(&reg)
        .step("inc")
        .workers(1)
        .warn_idle_after(Duration::from_millis(300))
        .start()
        .unwrap();
    print_ready(&p);
    p.enqueue(Item::new().with_meta("n", 1)).unwrap();
    assert_eq!(p.dequeue().unwrap().unwrap().i64("n"), Some(2));
    let _ = p.dequeue(); // waits forever: the test kills us
}

/// Issue 12: a pipeline idle waiting for input while its caller waits for output says so on
/// stderr, once.
#[test]
fn a_forgotten_close_input_is_reported_once() {
    let reg = registry();
    shmpipe::init(&reg);
    if helper_mode().is_some() {
        return helper_forgot_close();
    }
    let mut cmd = helper_command("a_forgotten_close_input_is_reported_once", "forgot");
    cmd.stderr(Stdio::piped());
    let mut h = Helper::spawn(cmd);
    let mut stderr = h.child.stderr.take().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        h.child.try_wait().unwrap().is_none(),
        "the helper should still wait"
    );
    let _ = h.child.kill();
    let _ = h.child.wait();
    let mut err = String::new();
    stderr.read_to_string(&mut err).unwrap();
    let warnings = err.matches("close_input").count();
    assert_eq!(warnings, 1, "{err}");
    assert!(err.contains("waiting for input"), "{err}");
}

/// The input's queue is what a caller streaming from a generator watches for back-pressure:
/// it grows while the workers' channels are full and is empty once everything went out.
#[test]
fn queued_items_count_what_the_input_thread_has_not_yet_sent() {
    let reg = registry();
    shmpipe::init(&reg);
    // One slow worker, small batches: its channel fills after a few items.
    let (mut p, _g) = start_killing_on_drop(
        Pipeline::builder(&reg)
            .step_with("sleep_ms", serde_json::json!({"ms": 10}))
            .workers(1)
            .batch_bytes(64)
            .channel(shmpipe::ChannelGeometry {
                slots: 4,
                blocks: 2,
                block_size: 4096,
                large_pool: 0,
            }),
    );
    let mut input = p.input().unwrap();
    assert_eq!((input.queued_items(), input.queued_bytes()), (0, 0));
    let item = |n: i64| {
        Item::new()
            .with_meta("n", n)
            .with("x", ndarray::Array1::<f32>::zeros(4))
    };
    input.send_batch((0..50).map(item).collect()).unwrap();
    for n in 50..150 {
        input.send(item(n)).unwrap();
    }
    // The stalled worker holds a few; the rest wait in front of the input thread.
    std::thread::sleep(Duration::from_millis(200));
    let (items, bytes) = (input.queued_items(), input.queued_bytes());
    assert!(items > 80, "{items} queued");
    assert_eq!(bytes, items * 16);
    drop(input);
    let n = within(Duration::from_secs(30), "the run", move || {
        let mut n = 0;
        for r in p.by_ref() {
            r.unwrap();
            n += 1;
        }
        (n, p)
    });
    assert_eq!(n.0, 150);
}

/// An item the input thread cannot send (too large for an explicitly small channel) is the
/// error the consumer gets, not the worker that lost its input because of it.
#[test]
fn an_item_the_input_cannot_send_is_the_error_not_the_worker_it_starved() {
    let reg = registry();
    shmpipe::init(&reg);
    for _ in 0..5 {
        let (mut p, _g) =
            start_killing_on_drop(Pipeline::builder(&reg).step("inc").workers(1).channel(
                shmpipe::ChannelGeometry {
                    slots: 0,
                    blocks: 4,
                    block_size: 64 << 10,
                    // No large size class: the item cannot travel at all.
                    large_pool: 0,
                },
            ));
        let big = ndarray::Array1::<f32>::zeros(100_000);
        p.enqueue(Item::new().with_meta("n", 1).with("x", big))
            .unwrap();
        p.close_input();
        let err = within(Duration::from_secs(10), "the failure", move || {
            p.find_map(Result::err).expect("the run must fail")
        });
        let msg = err.to_string();
        assert!(matches!(err, Error::Transport { .. }), "{msg}");
        assert!(
            msg.contains("enqueue") && msg.contains("400000 bytes"),
            "{msg}"
        );
    }
}
