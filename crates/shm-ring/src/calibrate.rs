//! Measures, on this machine, the array size from which zero-copy beats copying.

use std::fmt;
use std::io;
use std::time::{Duration, Instant};

use crate::channel::{
    ChannelConfig, CreateError, Message, OpenError, Receiver, RecvError, SendError, Sender,
};
use crate::message::MessageBuilder;
use crate::schema::FieldError;
use crate::transfer::Transfer;

/// Why [`calibrate`] failed: the step of a measurement that went wrong, with its own error.
#[derive(Debug)]
#[non_exhaustive]
pub enum CalibrateError {
    /// A measuring channel could not be created (e.g. memory for its pool is used up).
    Create(CreateError),
    /// The measuring channel's descriptor could not be duplicated for its receiver.
    Os(io::Error),
    /// The receiving end of a measuring channel could not be opened.
    Open(OpenError),
    /// A measuring send failed.
    Send(SendError),
    /// A measuring receive failed.
    Recv(RecvError),
    /// A received measuring message could not be read.
    Read(FieldError),
    /// The measuring consumer thread panicked.
    ConsumerPanicked,
    /// The consumer received other bytes than were sent.
    LostData {
        /// Sum of the bytes sent.
        sent: u64,
        /// Sum of the bytes received.
        received: u64,
    },
}

impl fmt::Display for CalibrateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("calibration failed: ")?;
        match self {
            CalibrateError::Create(e) => write!(f, "creating a measuring channel: {e}"),
            CalibrateError::Os(e) => write!(
                f,
                "duplicating a channel descriptor: {e} (raise the open-file limit, ulimit -n)"
            ),
            CalibrateError::Open(e) => write!(f, "opening a measuring channel: {e}"),
            CalibrateError::Send(e) => write!(f, "sending: {e}"),
            CalibrateError::Recv(e) => write!(f, "receiving: {e}"),
            CalibrateError::Read(e) => write!(f, "reading a received message: {e}"),
            CalibrateError::ConsumerPanicked => f.write_str(
                "the consumer thread panicked (a bug in shm-ring: report it with its \
                 panic message)",
            ),
            CalibrateError::LostData { sent, received } => write!(
                f,
                "{sent} sent but {received} received (a bug in shm-ring, or another process \
                 writing into the channel: report it; the figures were not used)"
            ),
        }
    }
}

impl std::error::Error for CalibrateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CalibrateError::Create(e) => std::error::Error::source(e),
            CalibrateError::Os(e) => std::error::Error::source(e),
            CalibrateError::Open(e) => std::error::Error::source(e),
            CalibrateError::Send(e) => std::error::Error::source(e),
            CalibrateError::Recv(e) => std::error::Error::source(e),
            CalibrateError::Read(e) => std::error::Error::source(e),
            CalibrateError::ConsumerPanicked | CalibrateError::LostData { .. } => None,
        }
    }
}

/// Result of [`calibrate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// `(array bytes, copy msgs/s, zero-copy msgs/s)` for every size measured.
    pub points: Vec<(usize, f64, f64)>,
    /// The smallest measured size at which zero-copy was at least as fast as copying (the
    /// largest size measured if it never was): use it as `Transfer::Adaptive { threshold }`.
    pub threshold: usize,
}

fn rate(transfer: Transfer, bytes: usize, budget: Duration) -> Result<f64, CalibrateError> {
    let cfg = ChannelConfig {
        slots: 1024,
        slot_size: 64,
        blocks: 16,
        block_size: bytes + 4096,
        transfer,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::anonymous(&cfg).map_err(CalibrateError::Create)?;
    let fd = std::os::fd::AsFd::as_fd(&tx)
        .try_clone_to_owned()
        .map_err(CalibrateError::Os)?;
    let mut rx = Receiver::<Message>::from_fd(fd).map_err(CalibrateError::Open)?;
    let src = ndarray::Array1::from_elem(bytes, 1u8);
    let consumer = std::thread::spawn(move || -> Result<u64, CalibrateError> {
        let mut sum = 0u64;
        loop {
            match rx.recv() {
                Ok(m) => {
                    let r = m.record(0).map_err(CalibrateError::Read)?;
                    let a = r.array_bytes("a").map_err(CalibrateError::Read)?;
                    sum += a.iter().map(|&b| b as u64).sum::<u64>();
                }
                Err(RecvError::Disconnected) => return Ok(sum),
                Err(e) => return Err(CalibrateError::Recv(e)),
            }
        }
    });
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        for _ in 0..16 {
            tx.send(MessageBuilder::new().array("a", &src))
                .map_err(CalibrateError::Send)?;
            n += 1;
        }
    }
    drop(tx);
    let received = consumer
        .join()
        .map_err(|_| CalibrateError::ConsumerPanicked)??;
    let secs = start.elapsed().as_secs_f64();
    let sent = n * bytes as u64;
    if received != sent {
        return Err(CalibrateError::LostData { sent, received });
    }
    Ok(n as f64 / secs)
}

/// Measures copy and zero-copy throughput for array sizes from 1 KiB to 4 MiB between two
/// threads over a real shared-memory channel, and returns the crossover. Takes about
/// `2 * 7 * budget`.
///
/// # Errors
/// [`CalibrateError`]: the step that failed, e.g. [`CalibrateError::Create`] if a channel
/// cannot be created (memory for its pool cannot be reserved).
///
/// # Examples
/// ```no_run
/// let cal = shm_ring::calibrate(std::time::Duration::from_millis(100))?;
/// let policy = shm_ring::Transfer::Adaptive { threshold: cal.threshold };
/// # Ok::<(), shm_ring::Error>(())
/// ```
pub fn calibrate(budget: Duration) -> Result<Calibration, CalibrateError> {
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
