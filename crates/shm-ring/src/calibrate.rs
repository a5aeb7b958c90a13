//! Measures, on this machine, the array size from which zero-copy beats copying.

use std::time::{Duration, Instant};

use crate::channel::{ChannelConfig, Message, Receiver, RecvError, Sender};
use crate::error::Error;
use crate::message::MessageBuilder;
use crate::transfer::Transfer;

/// Result of [`calibrate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// `(array bytes, copy msgs/s, zero-copy msgs/s)` for every size measured.
    pub points: Vec<(usize, f64, f64)>,
    /// The smallest measured size at which zero-copy was at least as fast as copying (the
    /// largest size measured if it never was): use it as `Transfer::Adaptive { threshold }`.
    pub threshold: usize,
}

fn rate(transfer: Transfer, bytes: usize, budget: Duration) -> Result<f64, Error> {
    let cfg = ChannelConfig {
        slots: 1024,
        slot_size: 64,
        blocks: 16,
        block_size: bytes + 4096,
        transfer,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::anonymous(&cfg)?;
    let mut rx = Receiver::<Message>::from_fd(std::os::fd::AsFd::as_fd(&tx).try_clone_to_owned()?)?;
    let src = vec![1u8; bytes];
    let consumer = std::thread::spawn(move || -> Result<u64, Error> {
        let mut sum = 0u64;
        loop {
            match rx.recv() {
                Ok(m) => {
                    let r = m.record(0)?;
                    sum += r.array_bytes("a")?.iter().map(|&b| b as u64).sum::<u64>();
                }
                Err(RecvError::Disconnected) => return Ok(sum),
                Err(e) => return Err(e.into()),
            }
        }
    });
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        for _ in 0..16 {
            tx.send(MessageBuilder::new().array_raw("a", crate::DType::U8, &[bytes], &src)?)?;
            n += 1;
        }
    }
    drop(tx);
    let sum = consumer
        .join()
        .map_err(|_| Error::InvalidArgument("calibration thread panicked".into()))??;
    let secs = start.elapsed().as_secs_f64();
    if sum != n * bytes as u64 {
        return Err(Error::Corrupt(format!(
            "calibration lost data: {sum} != {}",
            n * bytes as u64
        )));
    }
    Ok(n as f64 / secs)
}

/// Measures copy and zero-copy throughput for array sizes from 1 KiB to 4 MiB between two
/// threads over a real shared-memory channel, and returns the crossover. Takes about
/// `2 * 7 * budget`.
///
/// # Errors
/// If a channel cannot be created (e.g. memory for its pool cannot be reserved).
///
/// # Examples
/// ```no_run
/// let cal = shm_ring::calibrate(std::time::Duration::from_millis(100))?;
/// let policy = shm_ring::Transfer::Adaptive { threshold: cal.threshold };
/// # Ok::<(), shm_ring::Error>(())
/// ```
pub fn calibrate(budget: Duration) -> Result<Calibration, Error> {
    let mut points = Vec::new();
    let mut threshold = None;
    let mut bytes = 1024;
    while bytes <= 4 << 20 {
        let c = rate(Transfer::Copy, bytes, budget)?;
        let z = rate(Transfer::ZeroCopy, bytes, budget)?;
        if threshold.is_none() && z >= c {
            threshold = Some(bytes);
        }
        points.push((bytes, c, z));
        bytes *= 4;
    }
    let last = points.last().map_or(4 << 20, |p| p.0);
    Ok(Calibration {
        points,
        threshold: threshold.unwrap_or(last),
    })
}
