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
    fn slots_len(&self) -> usize {
        self.0.len() - SLOTS_AT
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
    // A consumer index that runs ahead of the producer by more than capacity (as a hostile
    // consumer could publish).
    // SAFETY: deliberately broken contract; no slot is read afterwards.
    unsafe { c.skip(cap * 3) };
    c.release(0);
    assert!(p.free(cap + 1).is_err());
}

/// Chunks: a write chunk is at most the free slots, a read chunk at most the published ones;
/// `stage` publishes nothing until the next commit, which publishes both with one store;
/// values cross the wrap through `write_pod`/`read_pod`; `skip` then `release(0)` frees slots.
fn chunks_batch_and_wrap<S: Storage>(mut p: Producer<S>, mut c: Consumer<S>) {
    let cap = p.shape().capacity;
    assert_eq!(p.write_chunk_uninit(cap + 5).unwrap().len(), cap);
    assert!(c.read_chunk(4).unwrap().is_empty());
    let mut next_in = 0u64;
    let mut next_out = 0u64;
    for round in 0..100u32 {
        // Two staged bursts, then one commit: the consumer sees nothing before the commit.
        let a = round % 3 + 1;
        let mut w = p.write_chunk_uninit(a).unwrap();
        let a = w.len();
        for i in 0..a {
            w.write_pod(i, 0, next_in);
            w.write_pod(i, 8, !next_in);
            next_in += 1;
        }
        w.stage(a);
        assert_eq!(p.staged(), a);
        assert_eq!(
            c.read_chunk(cap).unwrap().len(),
            0,
            "staged slots are not published"
        );
        let mut w = p.write_chunk_uninit(2).unwrap();
        let b = w.len();
        for i in 0..b {
            w.write_pod(i, 0, next_in);
            w.write_pod(i, 8, !next_in);
            next_in += 1;
        }
        w.commit_all();
        assert_eq!(p.staged(), 0);
        let r = c.read_chunk(cap).unwrap();
        assert_eq!(r.len(), a + b);
        // Read some, release a few at once, skip the rest and release them later.
        let take = (round % 4).min(r.len());
        for i in 0..r.len() {
            assert_eq!(r.read_pod::<u64>(i, 0), next_out + i as u64);
            assert_eq!(r.read_pod::<u64>(i, 8), !(next_out + i as u64));
        }
        r.release(take);
        next_out += take as u64;
        let r = c.read_chunk(cap).unwrap();
        let rest = r.len();
        r.skip(rest);
        next_out += rest as u64;
        assert_eq!(
            p.free(cap).unwrap(),
            cap - rest,
            "skipped slots are not released yet"
        );
        c.release(0);
        assert_eq!(p.free(cap).unwrap(), cap);
    }
    assert_eq!(next_in, next_out);
    // A chunk is contiguous only up to the wrap; a value that would cross it is refused.
    let w = p.write_chunk_uninit(cap).unwrap();
    let to_wrap = w.contiguous(0);
    assert!(to_wrap >= 1 && to_wrap <= cap);
    assert_eq!(
        w.contiguous(to_wrap.min(cap - 1)),
        if to_wrap < cap { cap - to_wrap } else { 1 }
    );
}

/// Chunk accessors are bounds-checked: a slot outside the chunk panics instead of writing.
fn chunk_bounds_are_checked<S: Storage>(mut p: Producer<S>, _c: Consumer<S>) {
    let cap = p.shape().capacity;
    let slot = p.shape().slot_size as usize;
    p.commit(cap - 1);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut w = p.write_chunk_uninit(4).unwrap();
        assert_eq!(w.len(), 1);
        w.write_pod(1, 0, 0u64);
    }));
    assert!(r.is_err(), "slot 1 of a one-slot chunk must panic");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut w = p.write_chunk_uninit(1).unwrap();
        w.write_pod(0, slot - 4, 0u64);
    }));
    assert!(r.is_err(), "a value past the slot must panic");
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
#[test]
fn heap_chunks_batch_and_wrap() {
    let (p, c) = heap_ring(SHAPE);
    chunks_batch_and_wrap(p, c);
}
#[test]
fn shm_chunks_batch_and_wrap() {
    let (p, c) = seg_ring(SHAPE);
    chunks_batch_and_wrap(p, c);
}
#[test]
fn heap_chunk_bounds_are_checked() {
    let (p, c) = heap_ring(SHAPE);
    chunk_bounds_are_checked(p, c);
}
#[test]
fn shm_chunk_bounds_are_checked() {
    let (p, c) = seg_ring(SHAPE);
    chunk_bounds_are_checked(p, c);
}
