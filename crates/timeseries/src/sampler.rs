//! Instance samplers (`gluonts.transform.sampler`) and a small seeded PRNG.
//!
//! A sampler picks split points `i` in a series of length `T`, with
//! `a <= i <= b`, `a = min_past`, `b = T - min_future`.

use std::fmt;

/// xoshiro256++ (Blackman and Vigna), seeded through SplitMix64.
///
/// Small, fast and good enough for sampling; every stream is reproducible from its seed.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::sampler::Rng;
/// let (mut a, mut b) = (Rng::new(7), Rng::new(7));
/// assert_eq!(a.next_u64(), b.next_u64());
/// let x = a.next_f64();
/// assert!((0.0..1.0).contains(&x));
/// ```
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose whole stream is determined by `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut split_mix = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng {
            s: [split_mix(), split_mix(), split_mix(), split_mix()],
        }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`, 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `lo ..= hi` (Lemire's multiply-shift; bias below 2^-64 * range).
    ///
    /// # Panics
    /// If `lo > hi`.
    pub fn range_inclusive(&mut self, lo: usize, hi: usize) -> usize {
        assert!(lo <= hi);
        let span = (hi - lo) as u64 + 1;
        lo + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as usize
    }
}

/// Picks split points in a series.
pub trait InstanceSampler: Send + fmt::Debug {
    /// Appends the split points for a series of length `len` to `out`.
    /// Returns `false` when the sampler requires a point and there is none
    /// (only the test sampler does).
    fn sample(&mut self, len: usize, out: &mut Vec<usize>) -> bool;

    /// Sets the seed of the sampler's random stream (no-op for deterministic samplers).
    fn reseed(&mut self, _seed: u64) {}
}

/// `(a, b)` with `a = min_past`, `b = len - min_future` (may be `b < a`).
pub(crate) fn bounds(len: usize, min_past: usize, min_future: usize) -> (i64, i64) {
    (min_past as i64, len as i64 - min_future as i64)
}

/// Always the last admissible point `b` (`PredictionSplitSampler`).
///
/// GluonTS's `ValidationSplitSampler(min_past, min_future)` allows an empty
/// interval (returns nothing); `TestSplitSampler(min_past)` has `min_future = 0`
/// and requires a point.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::sampler::{InstanceSampler, PredictionSplitSampler};
/// let mut s = PredictionSplitSampler::validation(0, 24);
/// let mut out = vec![];
/// assert!(s.sample(100, &mut out));
/// assert_eq!(out, [76]);
/// ```
#[derive(Clone, Debug)]
pub struct PredictionSplitSampler {
    /// Minimum number of points before the split.
    pub min_past: usize,
    /// Minimum number of points after the split.
    pub min_future: usize,
    /// Whether a series without admissible point is allowed (yields nothing).
    pub allow_empty_interval: bool,
}

impl PredictionSplitSampler {
    /// GluonTS's `ValidationSplitSampler`.
    pub fn validation(min_past: usize, min_future: usize) -> Self {
        PredictionSplitSampler {
            min_past,
            min_future,
            allow_empty_interval: true,
        }
    }

    /// GluonTS's `TestSplitSampler`.
    pub fn test(min_past: usize) -> Self {
        PredictionSplitSampler {
            min_past,
            min_future: 0,
            allow_empty_interval: false,
        }
    }
}

impl InstanceSampler for PredictionSplitSampler {
    fn sample(&mut self, len: usize, out: &mut Vec<usize>) -> bool {
        let (a, b) = bounds(len, self.min_past, self.min_future);
        if a <= b {
            out.push(b as usize);
            true
        } else {
            self.allow_empty_interval
        }
    }
}

/// Each admissible point with a probability tuned so that, on average,
/// `num_instances` points are drawn per series (`ExpectedNumInstanceSampler`).
///
/// Like GluonTS, it keeps a running average of the admissible window size over the
/// series it has seen (per sampler instance, i.e. per worker) and uses
/// `p = num_instances / average`. When fewer than `min_instances` points were
/// drawn, `min_instances - drawn` uniform points are prepended.
///
/// GluonTS draws one uniform number per admissible point; this draws the gaps
/// between selected points from the geometric distribution instead, which gives
/// the same distribution with one draw per selected point.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::sampler::{ExpectedNumInstanceSampler, InstanceSampler};
/// let mut s = ExpectedNumInstanceSampler::new(1.0, 0, 24, 42);
/// let mut out = vec![];
/// for _ in 0..1000 { s.sample(500, &mut out); }
/// let mean = out.len() as f64 / 1000.0;
/// assert!((0.85..1.15).contains(&mean), "{mean}");
/// assert!(out.iter().all(|&i| i <= 476));
/// ```
#[derive(Clone, Debug)]
pub struct ExpectedNumInstanceSampler {
    /// Average number of points per series.
    pub num_instances: f64,
    /// Minimum number of points per series.
    pub min_instances: usize,
    /// Minimum number of points before a split.
    pub min_past: usize,
    /// Minimum number of points after a split.
    pub min_future: usize,
    /// Sum of admissible window sizes seen so far.
    total_length: u64,
    /// Number of series with a non-empty window seen so far.
    n: u64,
    /// The mean admissible window to divide `num_instances` by, when known in advance
    /// ([`ExpectedNumInstanceSampler::with_mean_window`]); else the running mean.
    mean_window: Option<f64>,
    rng: Rng,
}

impl ExpectedNumInstanceSampler {
    /// A sampler with `min_instances = 0` and the given seed.
    pub fn new(num_instances: f64, min_past: usize, min_future: usize, seed: u64) -> Self {
        ExpectedNumInstanceSampler {
            num_instances,
            min_instances: 0,
            min_past,
            min_future,
            total_length: 0,
            n: 0,
            mean_window: None,
            rng: Rng::new(seed),
        }
    }

    /// Divides `num_instances` by this mean admissible window (the dataset's, computed
    /// before the run: [`mean_window`](crate::workload::mean_window)) instead of the running
    /// mean of the series seen so far. GluonTS's estimate converges to it; using it from the
    /// start makes each series' windows depend on that series and the seed alone, not on
    /// which series the same sampler saw before (in a pipeline: which worker got what).
    pub fn with_mean_window(mut self, mean: f64) -> Self {
        self.mean_window = (mean > 0.0).then_some(mean);
        self
    }

    /// Sets `min_instances`.
    pub fn with_min_instances(mut self, min_instances: usize) -> Self {
        self.min_instances = min_instances;
        self
    }
}

impl InstanceSampler for ExpectedNumInstanceSampler {
    fn sample(&mut self, len: usize, out: &mut Vec<usize>) -> bool {
        let (a, b) = bounds(len, self.min_past, self.min_future);
        let window = b - a + 1;
        if window <= 0 {
            return true;
        }
        let (a, window) = (a as usize, window as usize);
        self.n += 1;
        self.total_length += window as u64;
        let avg = self
            .mean_window
            .unwrap_or(self.total_length as f64 / self.n as f64);
        let p = self.num_instances / avg;
        let first = out.len();
        if p >= 1.0 {
            out.extend(a..a + window);
        } else if p > 0.0 {
            // Bernoulli(p) trials as geometric gaps: P(gap = k) = (1-p)^k p.
            let ln_q = (-p).ln_1p();
            let mut i = 0usize;
            loop {
                let u = 1.0 - self.rng.next_f64(); // (0, 1]
                let gap = (u.ln() / ln_q).floor();
                if gap >= (window - i) as f64 {
                    break;
                }
                i += gap as usize;
                out.push(a + i);
                i += 1;
                if i >= window {
                    break;
                }
            }
        }
        let drawn = out.len() - first;
        if drawn < self.min_instances {
            let extra: Vec<usize> = (0..self.min_instances - drawn)
                .map(|_| self.rng.range_inclusive(a, a + window - 1))
                .collect();
            out.splice(first..first, extra);
        }
        true
    }

    fn reseed(&mut self, seed: u64) {
        self.rng = Rng::new(seed);
    }
}

/// Exactly `n` uniform points per series, with replacement (`NumInstanceSampler`).
#[derive(Clone, Debug)]
pub struct NumInstanceSampler {
    /// Points per series.
    pub n: usize,
    /// Minimum number of points before a split.
    pub min_past: usize,
    /// Minimum number of points after a split.
    pub min_future: usize,
    rng: Rng,
}

impl NumInstanceSampler {
    /// A sampler with the given seed.
    pub fn new(n: usize, min_past: usize, min_future: usize, seed: u64) -> Self {
        NumInstanceSampler {
            n,
            min_past,
            min_future,
            rng: Rng::new(seed),
        }
    }
}

impl InstanceSampler for NumInstanceSampler {
    fn sample(&mut self, len: usize, out: &mut Vec<usize>) -> bool {
        let (a, b) = bounds(len, self.min_past, self.min_future);
        if a <= b {
            for _ in 0..self.n {
                out.push(self.rng.range_inclusive(a as usize, b as usize));
            }
        }
        true
    }

    fn reseed(&mut self, seed: u64) {
        self.rng = Rng::new(seed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_num_instances_statistics() {
        // Over many series of one length, the count per series is Binomial(W, 1/W)
        // with mean 1 and every admissible index is equally likely.
        let mut s = ExpectedNumInstanceSampler::new(1.0, 10, 5, 1);
        let len = 60;
        let (a, b) = (10, 55);
        let mut hist = vec![0u32; len + 1];
        let mut total = 0usize;
        let trials = 40_000;
        let mut out = Vec::new();
        for _ in 0..trials {
            out.clear();
            s.sample(len, &mut out);
            total += out.len();
            assert!(out.windows(2).all(|w| w[0] < w[1]), "sorted, distinct");
            for &i in &out {
                assert!((a..=b).contains(&i));
                hist[i] += 1;
            }
        }
        let mean = total as f64 / trials as f64;
        assert!((mean - 1.0).abs() < 0.03, "mean {mean}");
        let per_index = total as f64 / (b - a + 1) as f64;
        for (i, &h) in hist.iter().enumerate().take(b + 1).skip(a) {
            let z = (f64::from(h) - per_index) / per_index.sqrt();
            assert!(z.abs() < 5.0, "index {i}: {h} vs {per_index}");
        }
    }

    /// Upper critical value of chi-square with `df` degrees of freedom at about
    /// `z` standard deviations (Wilson-Hilferty).
    fn chi2_critical(df: f64, z: f64) -> f64 {
        let a = 2.0 / (9.0 * df);
        df * (1.0 - a + z * a.sqrt()).powi(3)
    }

    /// Chi-square statistic of observed counts against expected counts, pooling
    /// bins (in order) until each expects at least 10; returns (statistic, bins).
    fn chi2(observed: &[f64], expected: &[f64]) -> (f64, usize) {
        let (mut stat, mut bins, mut o, mut e) = (0.0, 0, 0.0, 0.0);
        for (&ob, &ex) in observed.iter().zip(expected) {
            o += ob;
            e += ex;
            if e >= 10.0 {
                stat += (o - e) * (o - e) / e;
                bins += 1;
                (o, e) = (0.0, 0.0);
            }
        }
        if e > 0.0 {
            stat += (o - e) * (o - e) / e;
            bins += 1;
        }
        (stat, bins)
    }

    /// GluonTS's `ExpectedNumInstanceSampler` draws one uniform per admissible
    /// position and keeps those below `p = num_instances / running average`: the
    /// count of series `s` is Binomial(W_s, p_s) and each position is kept with
    /// probability p_s. Given the lengths, W_s and p_s are known exactly, so the
    /// expected histogram of counts per series and of hits per position follow;
    /// the geometric-gap sampler must match both (chi-square, fixed seed).
    #[test]
    fn expected_num_instances_matches_gluonts_distribution() {
        let (min_past, min_future, num_instances) = (5usize, 7usize, 2.5);
        let mut s = ExpectedNumInstanceSampler::new(num_instances, min_past, min_future, 11);
        let mut lengths = Rng::new(5);
        let max_w = 150;
        let max_k = 40;
        let mut count_obs = vec![0.0; max_k + 1];
        let mut count_exp = vec![0.0; max_k + 1];
        let mut pos_obs = vec![0.0; max_w];
        let mut pos_exp = vec![0.0; max_w];
        let (mut total, mut n) = (0u64, 0u64);
        let mut out = Vec::new();
        for _ in 0..30_000 {
            let len = lengths.range_inclusive(0, min_past + min_future + max_w - 1);
            out.clear();
            s.sample(len, &mut out);
            let w = (len as i64 - (min_past + min_future) as i64 + 1).max(0) as usize;
            if w == 0 {
                assert!(out.is_empty());
                continue;
            }
            n += 1;
            total += w as u64;
            let p = (num_instances / (total as f64 / n as f64)).min(1.0);
            // Binomial(w, p) probabilities by the recurrence on k.
            if p >= 1.0 {
                count_exp[w.min(max_k)] += 1.0;
            } else {
                let mut pk = (1.0 - p).powi(w as i32);
                for (k, e) in count_exp.iter_mut().enumerate().take(max_k.min(w) + 1) {
                    *e += pk;
                    pk *= (w - k) as f64 / (k + 1) as f64 * p / (1.0 - p);
                }
            }
            count_obs[out.len().min(max_k)] += 1.0;
            for e in &mut pos_exp[..w] {
                *e += p;
            }
            for &i in &out {
                assert!((min_past..min_past + w).contains(&i));
                pos_obs[i - min_past] += 1.0;
            }
        }
        let (stat, bins) = chi2(&count_obs, &count_exp);
        let crit = chi2_critical((bins - 1) as f64, 4.0);
        assert!(
            stat < crit,
            "counts per series: chi2 {stat:.1} over {bins} bins (< {crit:.1})"
        );
        let (stat, bins) = chi2(&pos_obs, &pos_exp);
        let crit = chi2_critical((bins - 1) as f64, 4.0);
        assert!(
            stat < crit,
            "hits per position: chi2 {stat:.1} over {bins} bins (< {crit:.1})"
        );
    }

    #[test]
    fn running_average_and_min_instances() {
        // After a long series the average window grows, so a short series gets p < 1.
        let mut s = ExpectedNumInstanceSampler::new(2.0, 0, 0, 3).with_min_instances(3);
        let mut out = Vec::new();
        s.sample(999, &mut out);
        assert!(out.len() >= 3);
        out.clear();
        s.sample(1, &mut out); // window 2, avg 500.5
        assert_eq!(out.len(), 3, "padded up to min_instances");
        assert!(out.iter().all(|&i| i <= 1));
        out.clear();
        assert!(s.sample(0, &mut out) && !out.is_empty());
    }

    #[test]
    fn same_seed_same_stream() {
        let run = |seed| {
            let mut s = ExpectedNumInstanceSampler::new(3.0, 0, 0, seed);
            let mut out = Vec::new();
            for len in 10..200 {
                s.sample(len, &mut out);
            }
            out
        };
        assert_eq!(run(9), run(9));
        assert_ne!(run(9), run(10));
    }

    #[test]
    fn prediction_samplers() {
        let mut out = Vec::new();
        assert!(PredictionSplitSampler::validation(0, 24).sample(10, &mut out));
        assert!(out.is_empty());
        assert!(!PredictionSplitSampler::test(20).sample(10, &mut out));
        assert!(PredictionSplitSampler::test(0).sample(10, &mut out));
        assert_eq!(out, [10]);
    }
}
