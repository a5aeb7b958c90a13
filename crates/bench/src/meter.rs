//! Timing inside a worker without reading the clock on every message (a clock read costs about
//! as much as a whole 16-float handoff).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::contention::Snapshot;

/// Messages between two clock reads for arrays of `elements` floats: 1 for large arrays, up to
/// 1024 for tiny ones (about one clock read per 256 Ki elements moved).
pub fn stride_for(elements: usize) -> u32 {
    (262_144 / elements.max(1)).clamp(1, 1024) as u32
}

/// What a consumer (or a solo worker) measured; printed as one JSON line to the harness.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Messages received inside the measured window.
    pub messages: u64,
    /// Length of the measured window in seconds.
    pub seconds: f64,
    /// Sum of everything read in the window and before (keeps the reads observable).
    pub checksum: f64,
    /// Share of the window the workers lost to waiting for their CPUs or to steal (see
    /// [`crate::contention`]); NaN when not measured.
    #[serde(default = "nan")]
    pub contended: f64,
}

fn nan() -> f64 {
    f64::NAN
}

impl Outcome {
    /// Messages per second.
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.messages as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Fewest messages a producer sends, however long they take: enough for the consumer to
/// measure slow transports of huge arrays (a 40 MB pipe message takes ~0.1 s).
pub const MIN_MESSAGES: u64 = 12;

/// Fewest messages in a consumer's measured window; below it the window is widened to start at
/// the first message.
pub const MIN_WINDOW: u64 = 4;

/// Producer side: tells when the sending time is over (and at least [`MIN_MESSAGES`] were sent).
#[derive(Debug)]
pub struct Deadline {
    end: Instant,
    stride: u32,
    /// Messages left before the next clock read, in `1 ..= stride`.
    left: u32,
    /// Messages still owed to reach [`MIN_MESSAGES`].
    owed: u64,
}

impl Deadline {
    /// A deadline `run` from now, checked every `stride` calls.
    pub fn new(run: Duration, stride: u32) -> Deadline {
        Deadline {
            end: Instant::now() + run,
            stride: stride.max(1),
            left: 1,
            owed: MIN_MESSAGES,
        }
    }

    /// Whether to send one more message.
    #[inline]
    pub fn keep_going(&mut self) -> bool {
        if self.owed > 0 {
            self.owed -= 1;
            return true;
        }
        self.left -= 1;
        if self.left > 0 {
            return true;
        }
        self.left = self.stride;
        Instant::now() < self.end
    }
}

/// Consumer side: counts messages and opens the measured window once `warmup` has passed since
/// the first message (page faults, first touch of pool blocks and cold caches stay outside).
#[derive(Debug)]
pub struct Meter {
    warmup: Duration,
    stride: u32,
    /// Messages left before the next clock read, in `1 ..= stride`.
    left: u32,
    count: u64,
    first: Option<(Instant, Snapshot)>,
    /// Start of the measured window and the count at that instant.
    window: Option<(Instant, u64, Snapshot)>,
    checksum: f64,
}

impl Meter {
    /// A meter that skips `warmup` after the first message and reads the clock every `stride`
    /// messages.
    pub fn new(warmup: Duration, stride: u32) -> Meter {
        Meter {
            warmup,
            stride: stride.max(1),
            left: 1,
            count: 0,
            first: None,
            window: None,
            checksum: 0.0,
        }
    }

    /// Records one message whose elements summed to `sum`.
    #[inline]
    pub fn record(&mut self, sum: f64) {
        self.count += 1;
        self.checksum += sum;
        if self.window.is_some() {
            return;
        }
        self.left -= 1;
        if self.left > 0 {
            return;
        }
        self.left = self.stride;
        let now = Instant::now();
        match self.first {
            None => self.first = Some((now, Snapshot::take())),
            Some((first, _)) if now - first >= self.warmup => {
                self.window = Some((now, self.count, Snapshot::take()));
            }
            Some(_) => {}
        }
    }

    /// Messages recorded so far (the sequence number of the next one).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Closes the window now. When the warm-up left fewer than [`MIN_WINDOW`] messages in the
    /// window (huge arrays over slow transports), the window starts at the first message.
    pub fn finish(&self) -> Outcome {
        let now = Instant::now();
        let (start, at, snap) = match (self.window, self.first) {
            (Some((t, at, s)), _) if self.count - at >= MIN_WINDOW => (t, at, Some(s)),
            (_, Some((first, s))) => (first, 1, Some(s)),
            (_, None) => (now, 0, None),
        };
        Outcome {
            messages: self.count - at,
            seconds: (now - start).as_secs_f64(),
            checksum: self.checksum,
            contended: snap.map_or(f64::NAN, |s| s.share_since()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stride_shrinks_with_size() {
        assert_eq!(stride_for(16), 1024);
        assert_eq!(stride_for(1000), 262);
        assert_eq!(stride_for(1_000_000), 1);
        assert_eq!(stride_for(0), 1024);
    }

    #[test]
    fn deadline_stops_after_its_time() {
        let start = Instant::now();
        let mut d = Deadline::new(Duration::from_millis(30), 7);
        let mut n = 0u64;
        while d.keep_going() {
            n += 1;
        }
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(30), "{took:?}");
        assert!(n > 7);
        let mut expired = Deadline::new(Duration::ZERO, 1);
        for _ in 0..MIN_MESSAGES {
            assert!(expired.keep_going(), "the minimum is always sent");
        }
        assert!(!expired.keep_going());
    }

    #[test]
    fn meter_skips_warmup_messages() {
        let mut m = Meter::new(Duration::from_millis(20), 1);
        m.record(1.0);
        m.record(1.0);
        std::thread::sleep(Duration::from_millis(25));
        m.record(1.0); // opens the window: counted as its start
        for _ in 0..10 {
            m.record(2.0);
        }
        std::thread::sleep(Duration::from_millis(5));
        let o = m.finish();
        assert_eq!(m.count(), 13);
        assert_eq!(o.messages, 10);
        assert!(o.seconds >= 0.005, "{o:?}");
        assert_eq!(o.checksum, 23.0);
        assert!((o.rate() - 10.0 / o.seconds).abs() < 1e-9);
    }

    #[test]
    fn meter_widens_a_window_with_too_few_messages() {
        let mut m = Meter::new(Duration::from_millis(5), 1);
        m.record(1.0);
        std::thread::sleep(Duration::from_millis(6));
        m.record(1.0); // opens the window
        m.record(1.0);
        let o = m.finish();
        assert_eq!(
            o.messages, 2,
            "window widened to start at the first message"
        );
    }

    #[test]
    fn meter_without_warmup_window_starts_at_first_message() {
        let mut m = Meter::new(Duration::from_secs(100), 1);
        for _ in 0..5 {
            m.record(0.0);
        }
        let o = m.finish();
        assert_eq!(o.messages, 4);
        let empty = Meter::new(Duration::ZERO, 1).finish();
        assert_eq!((empty.messages, empty.rate()), (0, 0.0));
    }
}
