//! One test suite for the SPSC ring, run over every storage: the process heap and a real
//! shared-memory segment (with producer and consumer on different threads).
#![cfg(not(loom))]

use std::sync::Arc;

use shm_ring::Segment;
use shm_ring::ring::{Consumer, HeapStorage, Producer, RingHeader, RingShape, Storage, split};

/// A ring placed in an anonymous shared-memory segment.
#[derive(Clone)]
struct SegStorage(Arc<Segment>);

const HEADER_AT: usize = 128;
const SLOTS_AT: usize = HEADER_AT + std::mem::size_of::<RingHeader>();

// SAFETY: the segment is sized for the header and slots at these 128-aligned offsets, is
// zero-filled (a valid initial RingHeader), and the Arc keeps it mapped.
unsafe impl Storage for SegStorage {
    fn header(&self) -> &RingHeader {
        // SAFETY: see the impl.
        unsafe { &*self.0.as_ptr().add(HEADER_AT).cast::<RingHeader>() }
    }
    fn slots(&self) -> *mut u8 {
        self.0.as_ptr().wrapping_add(SLOTS_AT)
    }
}

fn seg_ring(shape: RingShape) -> (Producer<SegStorage>, Consumer<SegStorage>) {
    let seg = Arc::new(Segment::anonymous(SLOTS_AT + shape.bytes()).unwrap());
    let s = SegStorage(seg);
    split(s.clone(), s, shape)
}

fn heap_ring(shape: RingShape) -> (Producer<HeapStorage>, Consumer<HeapStorage>) {
    let s = HeapStorage::new(shape);
    split(s.clone(), s, shape)
}

/// Fills, drains, wraps around many times, with batches of varying size.
fn fifo_with_batches<S: Storage>(mut p: Producer<S>, mut c: Consumer<S>) {
    let cap = p.shape().capacity;
    assert_eq!(p.free(1).unwrap(), cap);
    assert_eq!(c.available(1).unwrap(), 0);
    let mut next_in = 0u64;
    let mut next_out = 0u64;
    for round in 0..200u32 {
        let n = (round % cap) + 1;
        let free = p.free(n).unwrap();
        let n = n.min(free);
        for i in 0..n {
            // SAFETY: slot i is free and at least 8 bytes.
            unsafe { p.slot(i).cast::<u64>().write(next_in) };
            next_in += 1;
        }
        p.commit(n);
        let avail = c.available(1).unwrap();
        let take = (round % 3 + 1).min(avail);
        for i in 0..take {
            // SAFETY: slot i is published.
            assert_eq!(unsafe { c.slot(i).cast::<u64>().read() }, next_out);
            next_out += 1;
        }
        c.release(take);
    }
    // `available(cap)` reloads the producer's index unless the cached one already shows a full ring.
    let avail = c.available(cap).unwrap();
    for i in 0..avail {
        // SAFETY: slot i is published.
        assert_eq!(unsafe { c.slot(i).cast::<u64>().read() }, next_out);
        next_out += 1;
    }
    c.release(avail);
    assert_eq!(next_in, next_out);
    assert_eq!(p.free(cap).unwrap(), cap);
}

/// Never more than `capacity` in flight; full means full.
fn full_is_full<S: Storage>(mut p: Producer<S>, mut c: Consumer<S>) {
    let cap = p.shape().capacity;
    p.commit(cap);
    assert_eq!(p.free(1).unwrap(), 0);
    assert_eq!(c.available(1).unwrap(), cap);
    c.release(1);
    assert_eq!(p.free(1).unwrap(), 1);
}

/// Producer and consumer on two threads, 200k values through a small ring.
fn threads<S: Storage + Send + 'static>(mut p: Producer<S>, mut c: Consumer<S>) {
    const N: u64 = 200_000;
    let t = std::thread::spawn(move || {
        let mut i = 0;
        while i < N {
            let free = p.free(1).unwrap();
            let n = free.min((N - i) as u32);
            for k in 0..n {
                // SAFETY: slot k is free.
                unsafe { p.slot(k).cast::<u64>().write(i + k as u64) };
            }
            p.commit(n);
            i += n as u64;
            if n == 0 {
                std::hint::spin_loop();
            }
        }
    });
    let mut want = 0;
    while want < N {
        let n = c.available(1).unwrap();
        for k in 0..n {
            // SAFETY: slot k is published.
            assert_eq!(unsafe { c.slot(k).cast::<u64>().read() }, want);
            want += 1;
        }
        c.release(n);
    }
    t.join().unwrap();
}

/// A consumer index more than `capacity` behind is reported, not used.
fn corrupt_index_is_an_error<S: Storage>(mut p: Producer<S>, mut c: Consumer<S>) {
    let cap = p.shape().capacity;
    p.commit(1);
    c.release(1);
    // A consumer index that runs ahead of the producer by more than capacity.
    c.skip(cap * 3);
    c.release(0);
    assert!(p.free(cap + 1).is_err());
}

const SHAPE: RingShape = RingShape {
    capacity: 8,
    slot_size: 64,
};

#[test]
fn heap_fifo_with_batches() {
    let (p, c) = heap_ring(SHAPE);
    fifo_with_batches(p, c);
}
#[test]
fn shm_fifo_with_batches() {
    let (p, c) = seg_ring(SHAPE);
    fifo_with_batches(p, c);
}
#[test]
fn heap_full_is_full() {
    let (p, c) = heap_ring(SHAPE);
    full_is_full(p, c);
}
#[test]
fn shm_full_is_full() {
    let (p, c) = seg_ring(SHAPE);
    full_is_full(p, c);
}
#[test]
fn heap_threads() {
    let (p, c) = heap_ring(SHAPE);
    threads(p, c);
}
#[test]
fn shm_threads() {
    let (p, c) = seg_ring(SHAPE);
    threads(p, c);
}
#[test]
fn heap_corrupt_index_is_an_error() {
    let (p, c) = heap_ring(SHAPE);
    corrupt_index_is_an_error(p, c);
}
#[test]
fn shm_corrupt_index_is_an_error() {
    let (p, c) = seg_ring(SHAPE);
    corrupt_index_is_an_error(p, c);
}
