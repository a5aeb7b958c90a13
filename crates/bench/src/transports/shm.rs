//! shm-ring transports. All three share one producer loop and one consumer loop and differ in
//! how the producer hands an array over:
//! - `shm-zero-copy`: loans a pool block, writes the array in place, sends the loan;
//! - `shm-copy`: writes the array into its own buffer, which `Transfer::Copy` copies into the
//!   message body;
//! - `shm-adaptive`: asks the default policy (`Transfer::Adaptive`, [`DEFAULT_THRESHOLD`])
//!   whether an array of this size goes zero-copy, and does the one or the other.
//!
//! The consumer reads every message in place (`Receiver::recv_batch`, up to [`RECV_BATCH`]
//! messages per release), sums and checks it.

use std::time::{Duration, Instant};

use shm_ring::{
    ChannelConfig, DEFAULT_THRESHOLD, Message, MessageBuilder, Receiver, RecvError,
    RecvTimeoutError, Sender, Transfer,
};

use crate::BoxError;
use crate::kernel;
use crate::meter::{Deadline, Meter, Outcome, stride_for};
use crate::transport::Transport;
use crate::transports::channel::pool_size;

/// Most messages the consumer reads before releasing them together.
pub const RECV_BATCH: usize = 64;

/// Name of the array in every message.
const ARRAY: &str = "x";

/// Channel geometry for arrays of `elements` floats under `transport`'s policy: room for
/// about 16 MiB of arrays in flight (4 to 256 pool blocks), each block big enough for one
/// array plus its message header.
///
/// # Panics
/// If `transport` is not an shm-ring transport.
pub fn config(transport: Transport, elements: usize) -> ChannelConfig {
    let transfer = match transport {
        Transport::ShmZeroCopy => Transfer::ZeroCopy,
        Transport::ShmCopy => Transfer::Copy,
        Transport::ShmAdaptive => Transfer::Adaptive {
            threshold: DEFAULT_THRESHOLD,
        },
        t => panic!("{t} is not an shm-ring transport"),
    };
    let bytes = elements * 4;
    ChannelConfig {
        blocks: pool_size(elements) as u32,
        block_size: (bytes + 4096).next_multiple_of(4096),
        transfer,
        ..ChannelConfig::default()
    }
}

/// Creates the channel `name` and sends `elements`-float arrays for `run`, then closes it.
///
/// # Errors
/// shm-ring errors (e.g. the consumer died).
pub fn produce(
    transport: Transport,
    name: &str,
    elements: usize,
    run: Duration,
) -> Result<(), BoxError> {
    let cfg = config(transport, elements);
    let zero_copy = cfg.transfer.zero_copy(elements * 4) && transport != Transport::ShmCopy;
    let mut tx = Sender::<Message>::create(name, &cfg)?;
    let mut own = vec![0f32; elements];
    let mut deadline = Deadline::new(run, stride_for(elements));
    let mut seq = 0u64;
    while deadline.keep_going() {
        let msg = MessageBuilder::new().tag(seq as u32);
        let msg = if zero_copy {
            let mut loan = tx.loan::<f32>(&[elements])?;
            kernel::fill_uninit(loan.as_uninit_mut(), seq);
            // SAFETY: `fill_uninit` wrote every element of the loan just above.
            msg.array_loan(ARRAY, unsafe { loan.assume_init() })
        } else {
            kernel::fill(&mut own, seq);
            msg.array_slice(ARRAY, &[elements], &own)?
        };
        tx.send(msg)?;
        seq += 1;
    }
    drop(tx); // closes the channel: the consumer drains, then sees Disconnected
    Ok(())
}

/// Opens the channel `name` (waiting at most `patience` for it to exist) and reads, sums and
/// checks every message until the producer closes.
///
/// # Errors
/// shm-ring errors, a missing channel after `patience`, or data that fails the check.
pub fn consume(
    name: &str,
    elements: usize,
    warmup: Duration,
    patience: Duration,
) -> Result<Outcome, BoxError> {
    let start = Instant::now();
    let mut rx = loop {
        match Receiver::<Message>::open(name) {
            Ok(rx) => break rx,
            Err(e) if start.elapsed() > patience => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    let mut meter = Meter::new(warmup, stride_for(elements));
    let mut failure: Option<BoxError> = None;
    loop {
        let read = rx.recv_batch(RECV_BATCH, None, |m| {
            if failure.is_some() {
                return;
            }
            let seq = meter.count();
            let xs = m
                .record(0)
                .and_then(|r| r.array::<f32>(ARRAY))
                .map_err(BoxError::from)
                .and_then(|a| {
                    let xs = a.as_slice().ok_or("array not contiguous")?;
                    if xs.len() != elements {
                        return Err(
                            format!("array of {} floats, expected {elements}", xs.len()).into()
                        );
                    }
                    if m.tag() != seq as u32 {
                        return Err(format!("message tagged {}, expected {seq}", m.tag()).into());
                    }
                    Ok(kernel::check(xs, seq)?)
                });
            match xs {
                Ok(sum) => meter.record(sum),
                Err(e) => failure = Some(e),
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        match read {
            Ok(_) => {}
            Err(RecvTimeoutError::Failed(RecvError::Disconnected)) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(meter.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_fits_one_array_per_block() {
        for (t, n) in [
            (Transport::ShmCopy, 16),
            (Transport::ShmZeroCopy, 1_000_000),
        ] {
            let cfg = config(t, n);
            assert!(cfg.block_size >= n * 4 + 64, "{cfg:?}");
            assert_eq!(cfg.block_size % 4096, 0);
            assert!((4..=256).contains(&cfg.blocks));
        }
        assert_eq!(config(Transport::ShmCopy, 16).transfer, Transfer::Copy);
        assert!(!config(Transport::ShmAdaptive, 16).transfer.zero_copy(64));
        assert!(
            config(Transport::ShmAdaptive, 1_000_000)
                .transfer
                .zero_copy(4_000_000)
        );
    }

    #[test]
    fn moves_checked_messages_between_threads() {
        for t in [
            Transport::ShmZeroCopy,
            Transport::ShmCopy,
            Transport::ShmAdaptive,
        ] {
            let name = format!("bench-unit-{}-{}", std::process::id(), t.name());
            let consumer = {
                let name = name.clone();
                std::thread::spawn(move || {
                    consume(&name, 5000, Duration::ZERO, Duration::from_secs(10))
                })
            };
            produce(t, &name, 5000, Duration::from_millis(30)).unwrap();
            let o = consumer.join().unwrap().unwrap();
            assert!(o.messages > 0, "{t}: {o:?}");
            assert!(
                !shm_ring::Rendezvous::default()
                    .socket_dir()
                    .join(&name)
                    .exists()
            );
        }
    }
}
