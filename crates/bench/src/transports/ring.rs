//! `ring-min`: a hand-written minimal shared-memory SPSC ring, the brief's "minimal
//! hand-written shm ring" anchor measured in the same run. No messages, metadata, validation
//! of peers, futexes or pools: one memory file holding two indices and `depth` fixed-size
//! slots of one array each (made by the harness, handed to both processes as their stdin:
//! nothing named, nothing in `/dev/shm`); the producer writes the array in its slot in place, the
//! consumer sums it in place; both spin (yielding now and then) while the ring is full or empty.
//!
//! Layout (offsets in bytes):
//! ```text
//! 0    magic (u64, written last by the producer)   8 elements (u64)   16 depth (u64)
//! 64   head: messages published by the producer (AtomicU64, own cache line)
//! 128  tail: messages released by the consumer  (AtomicU64, own cache line)
//! 192  closed: 1 once the producer has sent its last message (AtomicU64)
//! 256  slot 0, slot 1, ... slot depth-1: each `elements * 4` bytes rounded up to 64
//! ```
//! Invariant: `tail <= head <= tail + depth`; slots `tail .. head` (mod depth) belong to the
//! consumer, all others to the producer.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::BoxError;
use crate::kernel;
use crate::meter::{Deadline, Meter, Outcome, stride_for};
use crate::sys::Mapping;
use crate::transports::channel::pool_size;

const MAGIC: u64 = u64::from_le_bytes(*b"BENCHRNG");
const HEAD: usize = 64;
const TAIL: usize = 128;
const CLOSED: usize = 192;
const SLOTS: usize = 256;
/// Spins between two `yield_now` calls while waiting (the cores are shared on this VM).
const SPINS_PER_YIELD: u32 = 256;

/// Bytes of one slot for `elements` floats.
pub fn slot_bytes(elements: usize) -> usize {
    (elements * 4).next_multiple_of(64)
}

/// Total bytes of a ring of `depth` slots.
pub fn ring_bytes(elements: usize, depth: usize) -> usize {
    SLOTS + depth * slot_bytes(elements)
}

/// A mapped ring with its geometry.
#[derive(Debug)]
struct Ring {
    map: Mapping,
    elements: usize,
    depth: usize,
}

impl Ring {
    fn atomic(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= SLOTS && SLOTS <= self.map.len());
        // SAFETY: `offset` is 8-aligned inside the header of a live, page-aligned mapping
        // (asserted above); AtomicU64 has u64's layout, and every process touches these
        // words only through atomics.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn slot_ptr(&self, i: u64) -> *mut f32 {
        let k = (i % self.depth as u64) as usize;
        let off = SLOTS + k * slot_bytes(self.elements);
        assert!(off + self.elements * 4 <= self.map.len());
        // SAFETY: `off` is inside the mapping (asserted above) and 64-aligned (slots are
        // multiples of 64 bytes after a 256-byte header of a page-aligned mapping).
        unsafe { self.map.as_ptr().add(off).cast::<f32>() }
    }

    /// Waits (spinning, yielding now and then) until `ready()` holds.
    fn wait(mut ready: impl FnMut() -> bool) {
        let mut spins = 0u32;
        while !ready() {
            spins += 1;
            if spins.is_multiple_of(SPINS_PER_YIELD) {
                std::thread::yield_now();
            } else {
                spin_loop();
            }
        }
    }
}

/// Lays out the ring in `file` (a fresh, zero-filled memory file of at least
/// [`ring_bytes`]`(elements, pool_size(elements))` bytes that the consumer maps too) and sends
/// `elements`-float arrays for `run`, then marks it closed. Fails after `patience` if no
/// consumer ever took a message.
///
/// # Errors
/// OS errors; no consumer within `patience`.
pub fn produce(
    file: &std::fs::File,
    elements: usize,
    run: Duration,
    patience: Duration,
) -> Result<(), BoxError> {
    let depth = pool_size(elements);
    let ring = Ring {
        map: Mapping::of(file, ring_bytes(elements, depth))?,
        elements,
        depth,
    };
    let header = ring.map.as_ptr().cast::<u64>();
    // SAFETY: the header's first 24 bytes are in the mapping and 8-aligned; nobody reads them
    // before `magic` is published below.
    unsafe {
        header.add(1).write(elements as u64);
        header.add(2).write(depth as u64);
    }
    // SYNC POINT: geometry visible to a consumer that reads MAGIC (Acquire).
    ring.atomic(0).store(MAGIC, Ordering::Release);
    let (head, tail) = (ring.atomic(HEAD), ring.atomic(TAIL));
    let mut deadline = Deadline::new(run, stride_for(elements));
    let mut seq = 0u64;
    let start = Instant::now();
    while deadline.keep_going() {
        let mut timed_out = false;
        // SYNC POINT: the consumer's reads of released slots are done (Release on tail).
        Ring::wait(|| {
            if seq < tail.load(Ordering::Acquire) + depth as u64 {
                return true;
            }
            // Nothing consumed yet after `patience`: the consumer never came.
            timed_out = tail.load(Ordering::Relaxed) == 0 && start.elapsed() > patience;
            timed_out
        });
        if timed_out {
            return Err("no ring-min consumer showed up".into());
        }
        // SAFETY: slot `seq` is outside `tail .. head` (checked above: `seq - tail < depth`),
        // so the consumer does not touch it until `head` passes it; it holds `elements` f32.
        let slot = unsafe { std::slice::from_raw_parts_mut(ring.slot_ptr(seq), elements) };
        kernel::fill(slot, seq);
        seq += 1;
        // SYNC POINT: slot contents visible to the consumer (Release on head).
        head.store(seq, Ordering::Release);
    }
    // SYNC POINT: the final head is visible before `closed`.
    ring.atomic(CLOSED).store(1, Ordering::Release);
    Ok(())
}

/// Maps the ring in `file` (waiting at most `patience` for the producer to lay it out), and
/// sums and checks every array until the producer has closed and the ring is drained.
///
/// # Errors
/// OS errors, no ring within `patience`, a ring of another geometry, or data that fails the
/// check.
pub fn consume(
    file: &std::fs::File,
    elements: usize,
    warmup: Duration,
    patience: Duration,
) -> Result<Outcome, BoxError> {
    let depth = pool_size(elements);
    let start = Instant::now();
    let map = Mapping::of(file, ring_bytes(elements, depth))?;
    let ring = Ring {
        map,
        elements,
        depth,
    };
    // SYNC POINT: pairs with the producer's Release store of MAGIC (geometry visible).
    Ring::wait(|| ring.atomic(0).load(Ordering::Acquire) == MAGIC || start.elapsed() > patience);
    let header = ring.map.as_ptr().cast::<u64>();
    // SAFETY: the header words are in the mapping, 8-aligned, and final once MAGIC is set.
    let geometry = unsafe { (header.add(1).read(), header.add(2).read()) };
    if ring.atomic(0).load(Ordering::Acquire) != MAGIC
        || geometry != (elements as u64, depth as u64)
    {
        return Err(format!("the memory file is not a ring of {depth} x {elements} floats").into());
    }
    let (head, tail, closed) = (ring.atomic(HEAD), ring.atomic(TAIL), ring.atomic(CLOSED));
    let mut meter = Meter::new(warmup, stride_for(elements));
    let mut next = 0u64;
    loop {
        let mut published = head.load(Ordering::Acquire);
        if published == next {
            let mut done = false;
            Ring::wait(|| {
                // SYNC POINT: pairs with the producer's Release on head (slot contents).
                published = head.load(Ordering::Acquire);
                // SYNC POINT: pairs with the Release on closed (final head already stored).
                done = published == next && closed.load(Ordering::Acquire) == 1 && {
                    published = head.load(Ordering::Acquire);
                    published == next
                };
                published != next || done
            });
            if done {
                break;
            }
        }
        if published > next + depth as u64 {
            return Err(
                format!("ring head {published} runs ahead of tail {next} + {depth}").into(),
            );
        }
        while next < published {
            // SAFETY: slot `next` is in `tail .. head`: the producer published it (Acquire on
            // head above) and does not write it again until `tail` passes it.
            let xs = unsafe { std::slice::from_raw_parts(ring.slot_ptr(next), elements) };
            meter.record(kernel::check(xs, next)?);
            next += 1;
            // SYNC POINT: our reads of the slot are done before the producer reuses it.
            tail.store(next, Ordering::Release);
        }
    }
    Ok(meter.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry() {
        assert_eq!(slot_bytes(16), 64);
        assert_eq!(slot_bytes(17), 128);
        assert_eq!(ring_bytes(16, 4), 256 + 4 * 64);
    }

    #[test]
    fn moves_checked_arrays_between_threads() {
        for elements in [16, 1000, 100_000] {
            let file = crate::sys::shared_memfd(ring_bytes(elements, pool_size(elements))).unwrap();
            let consumer = {
                let file = file.try_clone().unwrap();
                std::thread::spawn(move || {
                    consume(&file, elements, Duration::ZERO, Duration::from_secs(10))
                })
            };
            produce(
                &file,
                elements,
                Duration::from_millis(20),
                Duration::from_secs(10),
            )
            .unwrap();
            let o = consumer.join().unwrap().unwrap();
            assert!(o.messages > 0, "{o:?}");
        }
    }

    #[test]
    fn producer_without_consumer_gives_up() {
        let file = crate::sys::shared_memfd(ring_bytes(16, pool_size(16))).unwrap();
        let err =
            produce(&file, 16, Duration::from_secs(5), Duration::from_millis(50)).unwrap_err();
        assert!(err.to_string().contains("no ring-min consumer"), "{err}");
    }
}
