//! Loom models of the SPSC descriptor ring and of the pool's completion-ring protocol.
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p shm-ring --test loom --release`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use shm_ring::ring::{RingShape, heap_ring};

/// Three values through a ring of two slots: FIFO, nothing lost or duplicated, no data race on
/// slots (the storage records every slot access in a loom cell).
#[test]
fn spsc_ring_is_fifo() {
    loom::model(|| {
        let (mut p, mut c) = heap_ring(RingShape {
            capacity: 2,
            slot_size: 8,
        });
        let t = loom::thread::spawn(move || {
            let mut i = 0u64;
            while i < 3 {
                if p.free(1).unwrap() >= 1 {
                    // SAFETY: slot 0 is free.
                    unsafe { p.slot(0).cast::<u64>().write(i + 10) };
                    p.commit(1);
                    i += 1;
                } else {
                    loom::thread::yield_now();
                }
            }
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            let n = c.available(1).unwrap();
            if n == 0 {
                loom::thread::yield_now();
                continue;
            }
            for k in 0..n {
                // SAFETY: slot k is published.
                got.push(unsafe { c.slot(k).cast::<u64>().read() });
            }
            c.release(n);
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
                if desc_c.available(1).unwrap() == 0 {
                    loom::thread::yield_now();
                    continue;
                }
                // SAFETY: slot 0 is published.
                let b = unsafe { desc_c.slot(0).cast::<u64>().read() } as usize;
                desc_c.release(1);
                seen.push(cons_blocks[b].with(|v| unsafe { *v }));
                // Hand the block back.
                while comp_p.free(1).unwrap() == 0 {
                    loom::thread::yield_now();
                }
                // SAFETY: slot 0 is free.
                unsafe { comp_p.slot(0).cast::<u64>().write(b as u64) };
                comp_p.commit(1);
            }
            seen
        });
        let mut free = vec![0usize];
        for value in [7u64, 8] {
            let b = loop {
                if let Some(b) = free.pop() {
                    break b;
                }
                if comp_c.available(1).unwrap() > 0 {
                    // SAFETY: slot 0 is published.
                    free.push(unsafe { comp_c.slot(0).cast::<u64>().read() } as usize);
                    comp_c.release(1);
                } else {
                    loom::thread::yield_now();
                }
            };
            // SAFETY (loom cell): the block is ours: free, or returned by the consumer.
            blocks[b].with_mut(|v| unsafe { *v = value });
            while desc_p.free(1).unwrap() == 0 {
                loom::thread::yield_now();
            }
            // SAFETY: slot 0 is free.
            unsafe { desc_p.slot(0).cast::<u64>().write(b as u64) };
            desc_p.commit(1);
        }
        assert_eq!(consumer.join().unwrap(), vec![7, 8]);
    });
}
