//! Loom models of the SPSC ring (publish path: chunk commit, staged slots, batched release),
//! of the pool's completion-ring protocol, and of the futex sleep/wake handshake.
//! Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p shm-ring --test loom --release`.
//!
//! Under `cfg(loom)` the ring's atomics and fences are loom's, every slot access is recorded in
//! a loom cell (data races on slots are caught), and the futex is a loom mutex + condition
//! variable that, like the kernel's, refuses to sleep if the word moved: a lost wake-up leaves
//! a thread asleep for good, which loom reports as a deadlock.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use shm_ring::ring::{Consumer, HeapStorage, Producer, RingShape, futex_wait, heap_ring};

/// Three values through a ring of two slots, published as one staged slot plus one committed
/// (a burst: one store of `tail` for both) and then one more, and read back with one slot
/// skipped and released together with the next (one store of `head`): FIFO, nothing lost or
/// duplicated, no data race on slots.
#[test]
fn chunk_publish_and_batched_release_are_fifo() {
    loom::model(|| {
        let (mut p, mut c) = heap_ring(RingShape {
            capacity: 2,
            slot_size: 8,
        });
        let t = loom::thread::spawn(move || {
            // A burst of two: the first slot staged, the second committed with it.
            let mut w = p.write_chunk_uninit(2).unwrap();
            assert_eq!(w.len(), 2, "an empty ring has every slot free");
            w.write_pod(0, 0, 10u64);
            w.stage(1);
            let mut w = p.write_chunk_uninit(1).unwrap();
            w.write_pod(0, 0, 11u64);
            w.commit_all();
            // Then one more, once a slot is free again.
            loop {
                let mut w = p.write_chunk_uninit(1).unwrap();
                if w.len() == 1 {
                    w.write_pod(0, 0, 12u64);
                    w.commit_all();
                    break;
                }
                drop(w);
                loom::thread::yield_now();
            }
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            let r = c.read_available().unwrap();
            let n = r.len();
            if n == 0 {
                drop(r);
                loom::thread::yield_now();
                continue;
            }
            for k in 0..n {
                got.push(r.read_pod::<u64>(k, 0));
            }
            // Batched release: skip the slots now, publish them with the next release.
            r.skip(n);
            c.release(0);
        }
        t.join().unwrap();
        assert_eq!(got, vec![10, 11, 12]);
    });
}

/// The pool protocol: the producer writes a block, sends its index on the descriptor ring; the
/// consumer reads the block and returns the index on the completion ring; the producer reuses
/// the block only after taking it back. Loom checks the block accesses never race.
#[test]
fn completion_ring_hands_blocks_back_safely() {
    loom::model(|| {
        let blocks: Arc<Vec<UnsafeCell<u64>>> =
            Arc::new((0..1).map(|_| UnsafeCell::new(0)).collect());
        let shape = RingShape {
            capacity: 2,
            slot_size: 8,
        };
        let (mut desc_p, mut desc_c) = heap_ring(shape);
        let (mut comp_p, mut comp_c) = heap_ring(shape);
        let cons_blocks = blocks.clone();
        let consumer = loom::thread::spawn(move || {
            let mut seen = Vec::new();
            while seen.len() < 2 {
                let r = desc_c.read_chunk(1).unwrap();
                if r.is_empty() {
                    drop(r);
                    loom::thread::yield_now();
                    continue;
                }
                let b = r.read_pod::<u64>(0, 0) as usize;
                r.release_all();
                // SAFETY (loom cell): the block was handed to us with its index.
                seen.push(cons_blocks[b].with(|v| unsafe { *v }));
                // Hand the block back (the completion ring always has room).
                let mut w = comp_p.write_chunk_uninit(1).unwrap();
                w.write_pod(0, 0, b as u64);
                w.commit_all();
            }
            seen
        });
        let mut free = vec![0usize];
        for value in [7u64, 8] {
            let b = loop {
                if let Some(b) = free.pop() {
                    break b;
                }
                let r = comp_c.read_available().unwrap();
                if r.is_empty() {
                    drop(r);
                    loom::thread::yield_now();
                } else {
                    free.push(r.read_pod::<u64>(0, 0) as usize);
                    r.release(1);
                }
            };
            // SAFETY (loom cell): the block is ours: free, or returned by the consumer.
            blocks[b].with_mut(|v| unsafe { *v = value });
            let mut w = desc_p.write_chunk_uninit(1).unwrap();
            assert_eq!(w.len(), 1, "two slots, at most one record out");
            w.write_pod(0, 0, b as u64);
            w.commit_all();
        }
        assert_eq!(consumer.join().unwrap(), vec![7, 8]);
    });
}

/// A consumer that finds the ring empty and goes to sleep the way `link/wait.rs` does
/// (raise the flag, re-read the index, sleep only if it did not move), against a producer that
/// publishes (store `tail`, fence, read the flag, wake if raised). The sleep has no timeout:
/// if the two sides ever miss each other, the consumer sleeps forever and loom reports a
/// deadlock. Weakening either side of the handshake (the fence in `Producer::publish` or in
/// `Consumer::begin_wait`) makes this model fail.
#[test]
fn sleeping_consumer_is_always_woken() {
    loom::model(|| {
        let (mut p, mut c) = heap_ring(RingShape {
            capacity: 2,
            slot_size: 8,
        });
        let t = loom::thread::spawn(move || {
            let mut w = p.write_chunk_uninit(1).unwrap();
            w.write_pod(0, 0, 42u64);
            w.commit_all();
        });
        assert_eq!(recv_sleeping(&mut c), 42);
        t.join().unwrap();
    });
}

/// The same handshake the other way round: a producer that finds the ring full sleeps on the
/// consumer's `head` until the consumer's release wakes it.
#[test]
fn sleeping_producer_is_always_woken() {
    loom::model(|| {
        let (mut p, mut c) = heap_ring(RingShape {
            capacity: 1,
            slot_size: 8,
        });
        let mut w = p.write_chunk_uninit(1).unwrap();
        w.write_pod(0, 0, 1u64);
        w.commit_all();
        let t = loom::thread::spawn(move || {
            let r = c.read_available().unwrap();
            assert_eq!(r.read_pod::<u64>(0, 0), 1);
            r.release_all();
        });
        send_sleeping(&mut p, 2);
        t.join().unwrap();
    });
}

/// Receives one u64, sleeping on the futex while the ring is empty (the wait loop's sleep
/// phase, without its timeout).
fn recv_sleeping(c: &mut Consumer<HeapStorage>) -> u64 {
    loop {
        let r = c.read_available().unwrap();
        if !r.is_empty() {
            let v = r.read_pod::<u64>(0, 0);
            r.release_all();
            return v;
        }
        drop(r);
        let (word, expected) = c.begin_wait();
        if expected == c.position() {
            futex_wait(word, expected);
        }
        c.end_wait();
    }
}

/// Sends one u64, sleeping on the futex while the ring is full.
fn send_sleeping(p: &mut Producer<HeapStorage>, v: u64) {
    let cap = p.shape().capacity;
    loop {
        let mut w = p.write_chunk_uninit(1).unwrap();
        if w.len() == 1 {
            w.write_pod(0, 0, v);
            w.commit_all();
            return;
        }
        drop(w);
        let (word, expected) = p.begin_wait();
        // Full means the consumer's head is `capacity` behind our position.
        if p.position().wrapping_sub(expected) >= cap {
            futex_wait(word, expected);
        }
        p.end_wait();
    }
}
