//! Seeded shuffling: a small generator, derived seeds, per-epoch permutations and a shuffle
//! buffer.

/// The SplitMix64 generator: small, seedable, good enough for permutations.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`), by multiply-shift.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
    /// Fisher-Yates shuffle.
    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// Derives a seed from a list of numbers (e.g. `(seed, epoch, rank, emitter)`).
///
/// # Examples
/// ```
/// use shmpipe::derive_seed;
/// assert_eq!(derive_seed(&[1, 2]), derive_seed(&[1, 2]));
/// assert_ne!(derive_seed(&[1, 2]), derive_seed(&[2, 1]));
/// ```
pub fn derive_seed(parts: &[u64]) -> u64 {
    let mut r = Rng::new(0x5348_4D50_4950_4531);
    let mut acc = r.next_u64();
    for &p in parts {
        r = Rng::new(acc ^ p);
        acc = r.next_u64();
    }
    acc
}

/// The order in which an emitter reads its part in one epoch: `0..len`, permuted with
/// `seed` when shuffling.
pub(crate) fn epoch_order(len: usize, shuffle: Option<u64>) -> Vec<usize> {
    let mut v: Vec<usize> = (0..len).collect();
    if let Some(seed) = shuffle {
        Rng::new(seed).shuffle(&mut v);
    }
    v
}

/// The order in which emitter `emitter` of rank `rank` reads the `len` records of its part in
/// epoch `epoch` (pipeline `seed`): `0..len`, or with `shuffle = Some(buffer)` the seeded
/// permutation of the epoch followed by a shuffle buffer of `buffer` records. The emitters
/// read in exactly this order (when no bad record is skipped); a caller that feeds a pipeline
/// from memory uses it to shuffle the same way.
///
/// # Examples
/// ```
/// use shmpipe::read_order;
/// assert_eq!(read_order(4, 7, 0, 0, 0, None), [0, 1, 2, 3]);
/// let a = read_order(100, 7, 0, 0, 0, Some(16));
/// assert_eq!(a, read_order(100, 7, 0, 0, 0, Some(16)));
/// assert_ne!(a, read_order(100, 7, 1, 0, 0, Some(16)), "each epoch has its own order");
/// let mut s = a.clone();
/// s.sort();
/// assert_eq!(s, (0..100).collect::<Vec<_>>());
/// ```
pub fn read_order(
    len: usize,
    seed: u64,
    epoch: u64,
    rank: usize,
    emitter: usize,
    shuffle: Option<usize>,
) -> Vec<usize> {
    let Some(buffer) = shuffle else {
        return (0..len).collect();
    };
    let base = derive_seed(&[seed, epoch, rank as u64, emitter as u64]);
    let order = epoch_order(len, Some(base));
    if buffer <= 1 {
        return order;
    }
    let mut buf = ShuffleBuffer::new(buffer, buffer_seed(base));
    let mut out: Vec<usize> = order.into_iter().filter_map(|i| buf.push(i)).collect();
    out.extend(buf.drain());
    out
}

/// The largest shuffle buffer [`PipelineBuilder::shuffle_buffer`](crate::PipelineBuilder::shuffle_buffer)
/// accepts, in items (2^32): far more than fits in memory as items, and a buffer as large as
/// an emitter's part is a full shuffle already.
pub const MAX_SHUFFLE_BUFFER: usize = 1 << 32;

/// The seed of an emitter's shuffle buffer, from the seed of its epoch (`base`).
pub(crate) fn buffer_seed(base: u64) -> u64 {
    derive_seed(&[base, 1])
}

/// A shuffle buffer of fixed capacity: push items, and once full each push releases a
/// uniformly chosen buffered item. Emitters put one after their per-epoch permutation; a
/// caller streaming items into a pipeline (which has no permutation of unknown length) can
/// shuffle with one alone.
///
/// # Examples
/// ```
/// use shmpipe::ShuffleBuffer;
/// let mut buf = ShuffleBuffer::new(4, 7);
/// let mut out: Vec<u32> = (0..10).filter_map(|i| buf.push(i)).collect();
/// assert_eq!(out.len(), 6, "four stay in the buffer");
/// out.extend(buf.drain());
/// out.sort();
/// assert_eq!(out, (0..10).collect::<Vec<_>>());
/// ```
#[derive(Debug)]
pub struct ShuffleBuffer<T> {
    buf: Vec<T>,
    cap: usize,
    rng: Rng,
}

impl<T> ShuffleBuffer<T> {
    /// A buffer of `cap` items (at least 1) whose releases are drawn with `seed`. Nothing is
    /// reserved up front: the buffer grows with what it holds (so a `cap` larger than the data
    /// costs only the data).
    pub fn new(cap: usize, seed: u64) -> ShuffleBuffer<T> {
        ShuffleBuffer {
            // Never `with_capacity(cap)`: `cap` is a user's number (review 18, hole 1).
            buf: Vec::new(),
            cap: cap.max(1),
            rng: Rng::new(seed),
        }
    }
    /// Adds `x`; returns a released item once the buffer is full.
    pub fn push(&mut self, x: T) -> Option<T> {
        self.buf.push(x);
        if self.buf.len() > self.cap {
            let j = self.rng.below(self.buf.len());
            Some(self.buf.swap_remove(j))
        } else {
            None
        }
    }
    /// Releases what is left, in random order.
    pub fn drain(&mut self) -> Vec<T> {
        let mut rest = std::mem::take(&mut self.buf);
        self.rng.shuffle(&mut rest);
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffling_is_a_seeded_permutation() {
        let a = epoch_order(1000, Some(7));
        let b = epoch_order(1000, Some(7));
        let c = epoch_order(1000, Some(8));
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut s = a.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
        let mut buf = ShuffleBuffer::new(16, 3);
        let mut out: Vec<usize> = (0..100).filter_map(|i| buf.push(i)).collect();
        out.extend(buf.drain());
        assert_ne!(out, (0..100).collect::<Vec<_>>());
        out.sort_unstable();
        assert_eq!(out, (0..100).collect::<Vec<_>>());
    }

    /// Review 18, hole 1: `ShuffleBuffer::new` reserved room for `cap` items up front, so a
    /// buffer of 2^40 items (a user's `shuffle_buffer`) aborted the process on the failed
    /// allocation. It grows with what it holds.
    #[test]
    fn a_huge_buffer_reserves_nothing_up_front() {
        let mut buf = ShuffleBuffer::new(1 << 40, 3);
        let mut out: Vec<u64> = (0..100).filter_map(|i| buf.push(i)).collect();
        assert!(
            out.is_empty(),
            "a buffer larger than the data releases nothing early"
        );
        out.extend(buf.drain());
        out.sort_unstable();
        assert_eq!(out, (0..100).collect::<Vec<_>>());
        let mut order = read_order(100, 7, 0, 0, 0, Some(1 << 40));
        order.sort_unstable();
        assert_eq!(order, (0..100).collect::<Vec<_>>());
    }
}
