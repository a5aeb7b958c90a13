//! Payload pool: fixed-size blocks in the producer's segment, and the staged loan types that
//! let a producer fill an array in place.
//!
//! Only the producer allocates. Its free list is process-local; a block goes out with a message
//! (it is then "in flight" until the consumer hands its index back through the completion
//! ring), or out to the user as a loan (returned on drop if it is never sent).

use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ndarray::{ArrayViewD, ArrayViewMutD, IxDyn};

use crate::dtype::{DType, Element};
use crate::link::segment::Segment;

pub(crate) use crate::link::geometry::PoolGeom;

/// Shared by a [`crate::Sender`] and every loan it handed out.
#[derive(Debug)]
pub(crate) struct PoolHome {
    /// The process of the sender (a loan dropped in a forked child gives nothing back).
    pub owner: crate::fork::Owner,
    pub seg: Arc<Segment>,
    pub geom: PoolGeom,
    /// Blocks of loans dropped without being sent, and pinned blocks whose last pin went,
    /// waiting to go back on the free list.
    pub orphans: Mutex<Vec<u32>>,
    /// `pins[b]`: the number of live [`BlockPin`]s of block `b` (low 31 bits), plus
    /// [`RETURNED`] once the block came back (from the consumer, or its loan was dropped)
    /// while pinned: the last pin's drop then puts it on `orphans`. Process-local memory.
    pub pins: Box<[AtomicU32]>,
}

/// `PoolHome::pins` bit: the block came back while pinned.
const RETURNED: u32 = 1 << 31;

impl PoolHome {
    /// A pool home over `seg` with no block pinned, for the sender of process `owner`.
    pub fn new(owner: crate::fork::Owner, seg: Arc<Segment>, geom: PoolGeom) -> PoolHome {
        PoolHome {
            owner,
            seg,
            geom,
            orphans: Mutex::new(Vec::new()),
            pins: (0..geom.blocks).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Start of block `idx` (a block, or an extent of the large size class).
    pub fn block_ptr(&self, idx: u32) -> *mut u8 {
        let at = self.geom.locate(u64::from(idx), 0);
        debug_assert!(at.is_some(), "block {idx} outside the pool");
        self.seg.as_ptr().wrapping_add(at.unwrap_or(0))
    }

    /// Block `b` came back to the producer (returned by the consumer, reclaimed from a dead
    /// one, or its loan dropped unsent): whether it may be reused now. If a [`BlockPin`]
    /// holds it, no: the last pin's drop puts it on `orphans` instead.
    ///
    /// A pin is made only from a live loan, so no pin can appear on a block that is in flight
    /// or free: a count seen as 0 here stays 0.
    #[inline]
    pub fn release(&self, b: u32) -> bool {
        let Some(p) = self.pins.get(b as usize) else {
            return true;
        };
        // SYNC POINT: Acquire pairs with the Release of the last pin's `fetch_sub`: the pin
        // holder's last reads of the block happen before we hand the block out again.
        if p.load(Ordering::Acquire) == 0 {
            return true;
        }
        // SYNC POINT: AcqRel orders this mark against the pins' `fetch_sub` (one total order
        // on the word): exactly one side sees the other and frees the block.
        let old = p.fetch_or(RETURNED, Ordering::AcqRel);
        if old & !RETURNED == 0 {
            p.store(0, Ordering::Relaxed); // the last pin went meanwhile: ours to free
            true
        } else {
            false
        }
    }
}

/// Keeps a loaned pool block from being reused, and the pool mapped, while it lives: after
/// the loan was sent and the consumer released the block, and after the [`crate::Sender`] is
/// gone. Made with [`ArrayLoan::pin`] for code that keeps pointers into the block beyond the
/// loan (a Python binding's arrays, say): while the pin lives, the block's bytes stay mapped
/// and hold the message sent in them; the consumer's process may still write them (values
/// may change, never bounds). The block returns to the pool when both the consumer released
/// it and the last pin is dropped. `Send` and `Sync`.
#[derive(Debug)]
pub struct BlockPin {
    home: Arc<PoolHome>,
    block: u32,
}

impl BlockPin {
    /// Start of the pinned block (mapped for as long as the pin lives).
    pub fn as_ptr(&self) -> *const u8 {
        self.home.block_ptr(self.block)
    }

    /// Bytes in the block.
    pub fn block_size(&self) -> usize {
        self.home.geom.block_size
    }
}

impl Drop for BlockPin {
    fn drop(&mut self) {
        if !self.home.owner.is_current() {
            return; // a forked child's copy: the block is the parent's business
        }
        let p = &self.home.pins[self.block as usize];
        // SYNC POINT: Release publishes this holder's last use of the block to whoever reuses
        // it (`PoolHome::release` loads with Acquire); Acquire sees its `RETURNED` mark.
        let old = p.fetch_sub(1, Ordering::AcqRel);
        if old == RETURNED | 1 {
            // The block came back while we held it, and we were the last pin: free it.
            p.store(0, Ordering::Relaxed);
            if let Ok(mut o) = self.home.orphans.lock() {
                o.push(self.block);
            }
        }
    }
}

/// A type-erased loan: one block holding one array.
#[derive(Debug)]
pub(crate) struct LoanToken {
    pub home: Arc<PoolHome>,
    pub block: u32,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Number of elements.
    pub len: usize,
    /// Still ours to return on drop (false once the block went out with a message).
    pub live: bool,
}

impl LoanToken {
    pub fn bytes(&self) -> usize {
        self.len * self.dtype.size()
    }

    /// Gives up ownership of the block (it travels with a message now).
    pub fn take(mut self) -> u32 {
        self.live = false;
        self.block
    }
}

impl Drop for LoanToken {
    fn drop(&mut self) {
        if self.live
            && self.home.owner.is_current()
            && self.home.release(self.block)
            && let Ok(mut o) = self.home.orphans.lock()
        {
            o.push(self.block);
        }
    }
}

/// An array loaned from the sender's pool, not yet initialised: fill it, then turn it into an
/// [`ArrayLoan`] and send it with `MessageBuilder::array_loan`. Zero-copy: the consumer reads
/// the very memory written here. Dropping it unsent returns the block to the pool.
///
/// # Shared memory
/// The slices and views this hands out are zero-copy views of shared memory. The consumer's
/// process maps the same pages writable: a buggy or hostile consumer can change the values
/// while you fill or read them (so re-read nothing you need to trust), never their bounds or
/// where they are (a block of this sender's pool, sized when loaned).
#[derive(Debug)]
pub struct ArrayLoanUninit<T: Element> {
    pub(crate) token: LoanToken,
    _t: PhantomData<T>,
}

/// An initialised array in the sender's pool, ready to send (see [`ArrayLoanUninit`]).
#[derive(Debug)]
pub struct ArrayLoan<T: Element> {
    pub(crate) token: LoanToken,
    _t: PhantomData<T>,
}

impl<T: Element> ArrayLoanUninit<T> {
    pub(crate) fn new(token: LoanToken) -> Self {
        ArrayLoanUninit {
            token,
            _t: PhantomData,
        }
    }

    /// The array's shape.
    pub fn shape(&self) -> &[usize] {
        &self.token.shape
    }

    /// The elements, in row-major order, to be written.
    pub fn as_uninit_mut(&mut self) -> &mut [MaybeUninit<T>] {
        let ptr = self
            .token
            .home
            .block_ptr(self.token.block)
            .cast::<MaybeUninit<T>>();
        // SAFETY: the block is at least `len * size_of::<T>()` bytes long (checked at loan
        // time), 64-byte aligned and mapped while the loan holds its `PoolHome`. No other
        // handle of ours touches it until it is sent. The consumer's process could write it
        // (it maps the pool): this is the documented zero-copy view, whose values a hostile
        // consumer may change and whose bounds it cannot; T is plain old data, so any bytes
        // it writes are valid values.
        unsafe { std::slice::from_raw_parts_mut(ptr, self.token.len) }
    }

    /// Declares every element written.
    ///
    /// # Safety
    /// Every element of [`ArrayLoanUninit::as_uninit_mut`] must have been written. (The bytes
    /// are shared memory and never truly uninitialised, but they may hold a previous message.)
    pub unsafe fn assume_init(self) -> ArrayLoan<T> {
        ArrayLoan {
            token: self.token,
            _t: PhantomData,
        }
    }

    /// Writes element `i` (row-major) as `f(i)` for every `i`.
    pub fn write_with(mut self, mut f: impl FnMut(usize) -> T) -> ArrayLoan<T> {
        for (i, x) in self.as_uninit_mut().iter_mut().enumerate() {
            x.write(f(i));
        }
        // SAFETY: every element was written just above.
        unsafe { self.assume_init() }
    }

    /// Copies `src` (row-major, same number of elements) into the loan.
    ///
    /// # Panics
    /// If `src.len()` differs from the loan's length.
    pub fn copy_from_slice(mut self, src: &[T]) -> ArrayLoan<T> {
        let dst = self.as_uninit_mut();
        assert_eq!(
            dst.len(),
            src.len(),
            "loan has {} elements, source {}",
            dst.len(),
            src.len()
        );
        // SAFETY: MaybeUninit<T> has T's layout; the slices have equal length and cannot overlap
        // (the loan's block is not memory the caller can otherwise reach).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<T>(), src.len())
        };
        // SAFETY: every element was written by the copy.
        unsafe { self.assume_init() }
    }

    /// Sets every element to `value`.
    pub fn fill(self, value: T) -> ArrayLoan<T> {
        self.write_with(|_| value)
    }
}

impl<T: Element> ArrayLoan<T> {
    /// The array's shape.
    pub fn shape(&self) -> &[usize] {
        &self.token.shape
    }

    /// A pin of the loan's block: the block is not reused (and the pool stays mapped) until
    /// the pin is dropped, even after the loan was sent and consumed (see [`BlockPin`]).
    /// `None` for a loan in an extent of the large size class
    /// ([`ChannelConfig::large_pool`](crate::ChannelConfig::large_pool)), which pins do not
    /// cover.
    pub fn pin(&self) -> Option<BlockPin> {
        let p = self.token.home.pins.get(self.token.block as usize)?;
        // Relaxed: the count is only read by `release`/`drop`, which synchronise through the
        // orphans lock or their own AcqRel operations; no data is published by pinning.
        p.fetch_add(1, Ordering::Relaxed);
        Some(BlockPin {
            home: self.token.home.clone(),
            block: self.token.block,
        })
    }

    /// The elements in row-major order.
    pub fn as_slice(&self) -> &[T] {
        let ptr = self.token.home.block_ptr(self.token.block).cast::<T>();
        // SAFETY: as in `as_uninit_mut`; the elements are initialised (type-state).
        unsafe { std::slice::from_raw_parts(ptr, self.token.len) }
    }

    /// The elements in row-major order, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        let ptr = self.token.home.block_ptr(self.token.block).cast::<T>();
        // SAFETY: as in `as_uninit_mut`; the elements are initialised (type-state).
        unsafe { std::slice::from_raw_parts_mut(ptr, self.token.len) }
    }

    /// An ndarray view.
    pub fn view(&self) -> ArrayViewD<'_, T> {
        ArrayViewD::from_shape(IxDyn(&self.token.shape), self.as_slice())
            .expect("loan shape matches its length")
    }

    /// A mutable ndarray view.
    pub fn view_mut(&mut self) -> ArrayViewMutD<'_, T> {
        let shape = self.token.shape.clone();
        ArrayViewMutD::from_shape(IxDyn(&shape), self.as_mut_slice())
            .expect("loan shape matches its length")
    }
}
