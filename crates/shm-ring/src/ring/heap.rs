//! [`HeapStorage`]: a ring on the process heap, for tests, loom models and in-process use.

use super::{Consumer, Producer, RingHeader, RingShape, Storage, split};

/// A ring on the process heap: for tests, loom models and in-process use.
#[derive(Debug, Clone)]
pub struct HeapStorage {
    inner: std::sync::Arc<HeapInner>,
}

#[derive(Debug)]
struct HeapInner {
    header: RingHeader,
    slots: Box<[std::cell::UnsafeCell<u64>]>,
    /// One loom cell per slot, touched on every slot access so loom sees who owns which slot.
    #[cfg(loom)]
    tracks: Box<[loom::cell::UnsafeCell<()>]>,
}

// SAFETY: the slot cells are only accessed through the ring protocol: the producer writes slots
// it owns (free ones), the consumer reads slots it owns (published ones), and ownership moves
// with the Release/Acquire index stores and loads.
unsafe impl Sync for HeapInner {}
// SAFETY: as above; the raw cells hold plain u64s.
unsafe impl Send for HeapInner {}

impl HeapStorage {
    /// Allocates a zeroed ring of the given shape.
    ///
    /// # Panics
    /// If the shape is invalid.
    pub fn new(shape: RingShape) -> Self {
        assert!(shape.is_valid());
        let words = shape.bytes() / 8;
        HeapStorage {
            inner: std::sync::Arc::new(HeapInner {
                header: RingHeader::default(),
                slots: (0..words).map(|_| std::cell::UnsafeCell::new(0)).collect(),
                #[cfg(loom)]
                tracks: (0..shape.capacity)
                    .map(|_| loom::cell::UnsafeCell::new(()))
                    .collect(),
            }),
        }
    }
}

// SAFETY: the header and the boxed slice live as long as the Arc, which every handle holds;
// the slice is `capacity * slot_size / 8` u64 cells, hence 8-aligned.
unsafe impl Storage for HeapStorage {
    fn header(&self) -> &RingHeader {
        &self.inner.header
    }
    fn slots(&self) -> *mut u8 {
        self.inner.slots.as_ptr() as *mut u8
    }
    fn slots_len(&self) -> usize {
        self.inner.slots.len() * 8
    }
    #[cfg(loom)]
    fn track(&self, idx: u32, write: bool) {
        let cell = &self.inner.tracks[idx as usize];
        if write {
            cell.with_mut(|_| ());
        } else {
            cell.with(|_| ());
        }
    }
}

/// A heap ring split into its two halves.
///
/// # Examples
/// ```
/// use shm_ring::ring::{heap_ring, RingShape};
/// let (mut p, mut c) = heap_ring(RingShape { capacity: 4, slot_size: 8 });
/// assert_eq!(p.free(1).unwrap(), 4);
/// // SAFETY: slot 0 is free and 8 bytes long.
/// unsafe { p.slot(0).cast::<u64>().write(42) };
/// p.commit(1);
/// assert_eq!(c.available(1).unwrap(), 1);
/// // SAFETY: slot 0 is published and 8 bytes long.
/// assert_eq!(unsafe { c.slot(0).cast::<u64>().read() }, 42);
/// c.release(1);
/// ```
pub fn heap_ring(shape: RingShape) -> (Producer<HeapStorage>, Consumer<HeapStorage>) {
    let s = HeapStorage::new(shape);
    split(s.clone(), s, shape)
}
