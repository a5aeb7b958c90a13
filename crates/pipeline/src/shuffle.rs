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

/// A shuffle buffer of fixed capacity: push items, and once full each push releases a
/// uniformly chosen buffered item.
#[derive(Debug)]
pub(crate) struct ShuffleBuffer<T> {
    buf: Vec<T>,
    cap: usize,
    rng: Rng,
}

impl<T> ShuffleBuffer<T> {
    pub(crate) fn new(cap: usize, seed: u64) -> ShuffleBuffer<T> {
        ShuffleBuffer {
            buf: Vec::with_capacity(cap),
            cap: cap.max(1),
            rng: Rng::new(seed),
        }
    }
    /// Adds `x`; returns a released item once the buffer is full.
    pub(crate) fn push(&mut self, x: T) -> Option<T> {
        self.buf.push(x);
        if self.buf.len() > self.cap {
            let j = self.rng.below(self.buf.len());
            Some(self.buf.swap_remove(j))
        } else {
            None
        }
    }
    /// Releases what is left, in random order.
    pub(crate) fn drain(&mut self) -> Vec<T> {
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
}
