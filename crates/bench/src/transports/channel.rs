//! In-process upper bound: two pinned threads hand buffers over a bounded channel and recycle
//! them through a second one, so nothing is copied or allocated per message.

use std::sync::mpsc::sync_channel;
use std::time::Duration;

use crate::BoxError;
use crate::kernel;
use crate::meter::{Deadline, Meter, Outcome, stride_for};
use crate::sys;

/// Buffers in flight: about 16 MiB worth, at least 4 and at most 256.
pub fn pool_size(elements: usize) -> usize {
    ((16 << 20) / (elements.max(1) * 4)).clamp(4, 256)
}

/// Runs producer (on `cores.0`, this thread) and consumer (on `cores.1`, a new thread) for
/// `warmup + run`; returns the consumer's outcome.
///
/// # Errors
/// Data that fails the check, or a thread that panicked.
pub fn run(
    elements: usize,
    warmup: Duration,
    run: Duration,
    cores: (usize, usize),
) -> Result<Outcome, BoxError> {
    let pool = pool_size(elements);
    let (tx, rx) = sync_channel::<Vec<f32>>(pool);
    let (back_tx, back_rx) = sync_channel::<Vec<f32>>(pool);
    for _ in 0..pool {
        // Ones, not zeros: a zeroed allocation may stay untouched and fault in the window.
        back_tx.send(vec![1f32; elements])?;
    }
    let consumer = std::thread::spawn(move || -> Result<Outcome, kernel::DataError> {
        let _ = sys::pin_to_core(cores.1);
        let mut meter = Meter::new(warmup, stride_for(elements));
        for buf in rx {
            let sum = kernel::check(&buf, meter.count())?;
            meter.record(sum);
            // The producer may be gone at the end: then nobody needs the buffer back.
            let _ = back_tx.send(buf);
        }
        Ok(meter.finish())
    });
    sys::pin_to_core(cores.0)?;
    let mut deadline = Deadline::new(warmup + run, stride_for(elements));
    let mut seq = 0u64;
    while deadline.keep_going() {
        let Ok(mut buf) = back_rx.recv() else { break };
        kernel::fill(&mut buf, seq);
        if tx.send(buf).is_err() {
            break; // consumer failed: its error is reported below
        }
        seq += 1;
    }
    drop(tx);
    let outcome = consumer.join().map_err(|_| "channel consumer panicked")??;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_size_bounds() {
        assert_eq!(pool_size(16), 256);
        assert_eq!(pool_size(1_000_000), 4);
        assert_eq!(pool_size(1 << 20), 4);
        assert_eq!(pool_size(1 << 18), 16);
    }

    #[test]
    fn moves_checked_messages() {
        let o = run(
            1000,
            Duration::ZERO,
            Duration::from_millis(20),
            sys::core_pair(),
        )
        .unwrap();
        assert!(o.messages > 0 && o.seconds > 0.0, "{o:?}");
        assert!(o.checksum >= 1000.0 * o.messages as f64);
    }
}
