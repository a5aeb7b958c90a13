//! The per-message work every transport does: the producer writes every element, the consumer
//! reads every element (a sum) and checks it, so the data is really moved.
//!
//! Message `seq` carries the value [`value_for`]`(seq)` (1..=4) in every element. The values are
//! small so that [`sum_f32`] is exact up to [`MAX_ELEMENTS`], which makes the check strict: a
//! message that was torn, lost, duplicated or reordered fails it (3 times in 4 for a single
//! misplaced message).

use std::fmt;
use std::mem::MaybeUninit;

/// Independent accumulators in [`sum_f32`]: enough for the compiler to vectorise the loop.
pub const LANES: usize = 16;

/// Largest array the exact check supports: each lane sums at most `MAX_ELEMENTS / LANES`
/// values of at most 4, which stays below 2^24 (the last exact integer of `f32`).
pub const MAX_ELEMENTS: usize = LANES * (1 << 22);

/// The value every element of message number `seq` carries.
pub fn value_for(seq: u64) -> f32 {
    (seq % 4 + 1) as f32
}

/// Writes message `seq` into `xs`.
pub fn fill(xs: &mut [f32], seq: u64) {
    xs.fill(value_for(seq));
}

/// Writes message `seq` into uninitialised memory (a zero-copy loan); every element is written.
pub fn fill_uninit(xs: &mut [MaybeUninit<f32>], seq: u64) {
    let v = value_for(seq);
    for x in xs {
        x.write(v);
    }
}

/// Sums `xs` with [`LANES`] independent `f32` accumulators, reduced in `f64`.
///
/// A plain `iter().sum()` of floats cannot be vectorised (one dependency chain); this reads
/// at memory speed.
pub fn sum_f32(xs: &[f32]) -> f64 {
    let mut acc = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += *x;
        }
    }
    let mut total: f64 = acc.iter().map(|&a| f64::from(a)).sum();
    for &x in rest {
        total += f64::from(x);
    }
    total
}

/// A message whose contents are not what its producer wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct DataError {
    /// Sequence number the consumer expected.
    pub seq: u64,
    /// Number of elements in the message.
    pub elements: usize,
    /// The sum that was read.
    pub sum: f64,
    /// The sum that was expected.
    pub expected: f64,
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message {} ({} elements) sums to {}, expected {}: data was not moved intact",
            self.seq, self.elements, self.sum, self.expected
        )
    }
}

impl std::error::Error for DataError {}

/// Reads every element of message `seq` and checks it; returns the sum.
///
/// # Errors
/// [`DataError`] when the sum is not the one the producer wrote.
pub fn check(xs: &[f32], seq: u64) -> Result<f64, DataError> {
    check_scaled(xs, seq, 1.0)
}

/// Like [`check`], for message `seq` after every element was multiplied by `factor` (a small
/// power of two keeps the sum exact).
///
/// # Errors
/// [`DataError`] when the sum is not the expected one.
pub fn check_scaled(xs: &[f32], seq: u64, factor: f32) -> Result<f64, DataError> {
    let sum = sum_f32(xs);
    let expected = xs.len() as f64 * f64::from(value_for(seq)) * f64::from(factor);
    if sum == expected {
        Ok(sum)
    } else {
        Err(DataError {
            seq,
            elements: xs.len(),
            sum,
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_matches_naive_sum_for_odd_lengths() {
        for n in [0usize, 1, 15, 16, 17, 33, 1000] {
            let xs: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
            let naive: f64 = xs.iter().map(|&x| f64::from(x)).sum();
            assert_eq!(sum_f32(&xs), naive, "n = {n}");
        }
    }

    #[test]
    fn check_accepts_what_fill_wrote() {
        let mut xs = vec![0f32; 1001];
        for seq in 0..8 {
            fill(&mut xs, seq);
            assert_eq!(check(&xs, seq), Ok(1001.0 * f64::from(value_for(seq))));
        }
    }

    #[test]
    fn sum_stays_exact_past_the_f32_integer_limit() {
        // 20M ones sum past 2^24, the last integer up to which f32 counts exactly.
        let n = 20_000_000;
        let xs = vec![1f32; n];
        assert_eq!(sum_f32(&xs), n as f64);
    }

    #[test]
    fn check_rejects_a_torn_or_misplaced_message() {
        let mut xs = vec![0f32; 64];
        fill(&mut xs, 5);
        xs[63] = value_for(6);
        let err = check(&xs, 5).unwrap_err();
        assert_eq!(err.seq, 5);
        assert_ne!(err.sum, err.expected);
        fill(&mut xs, 5);
        assert!(
            check(&xs, 6).is_err(),
            "a message read under the wrong number"
        );
    }

    #[test]
    fn scaled_check() {
        let mut xs = vec![0f32; 100];
        fill(&mut xs, 3);
        xs.iter_mut().for_each(|x| *x *= 2.0);
        assert_eq!(check_scaled(&xs, 3, 2.0), Ok(800.0));
        assert!(check(&xs, 3).is_err());
    }

    #[test]
    fn fill_uninit_writes_every_element() {
        let mut xs = vec![MaybeUninit::<f32>::uninit(); 37];
        fill_uninit(&mut xs, 2);
        // SAFETY: `fill_uninit` wrote every element just above.
        let xs: Vec<f32> = xs.into_iter().map(|x| unsafe { x.assume_init() }).collect();
        assert_eq!(check(&xs, 2), Ok(37.0 * 3.0));
    }
}
