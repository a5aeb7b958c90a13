//! Review 17 (the byte views, the claim and the loans against a hostile peer and safe callers):
//! one test per confirmed finding. Each fails on the code it was written against
//! (db0d88d); the report on branch review17 says what the fix is.
#![cfg(not(loom))]

use shm_ring::ring::{HeapStorage, RingShape, split};

/// R17-2. `ring::split` (safe, public with unstable-internals) attaches both ends of a heap
/// ring with any valid shape, whatever shape the storage was made for: the chunks then check
/// slot indices against the claimed shape, not the memory, so safe code reads and writes past
/// the allocation (here: 1024 slots of 4 KiB over a 16-byte allocation). Attaching a shape the
/// storage does not hold must panic (or the storage must carry its shape). Nothing is written.
#[test]
#[should_panic(expected = "ring shape")]
fn a_ring_shape_larger_than_its_storage_is_refused() {
    let storage = HeapStorage::new(RingShape {
        capacity: 2,
        slot_size: 8,
    });
    let big = RingShape {
        capacity: 1 << 10,
        slot_size: 4096,
    };
    let (mut p, _c) = split(storage.clone(), storage, big);
    let w = p.write_chunk_uninit(1024).expect("a fresh ring");
    // Accepted: safe code now holds 1024 "free" slots, 4 MiB, over 16 bytes of heap.
    assert_eq!(w.len(), 1024);
}

// R17-3 (an `Element` the pool cannot align: `Element` was a safe, unsealed trait, so a
// 128-aligned Pod type could be loaned from a 64-aligned pool block and `as_uninit_mut` made
// a misaligned `&mut [T]`; this file's test of it saw the loan handed out) is now a compile
// error: `Element` is sealed, see the `compile_fail` example in its documentation.
