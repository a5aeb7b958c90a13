//! `shm-typed`: shm-ring's typed path. The channel carries `[f32; N]` values, one per ring
//! slot (`Sender<[f32; N]>::send`: one slot write and one index publish per message), with no
//! message description; the consumer reads each value with `Receiver<[f32; N]>::recv` (one
//! copy out of the slot, then the sum) and checks it.
//!
//! The value type is fixed at compile time and a typed slot holds at most 64 KiB, so only the
//! sizes of [`SIZES`] are measured; at other sizes the row is left out.

use std::time::Duration;

use shm_ring::{ChannelConfig, Receiver, RecvError, Sender};

use crate::BoxError;
use crate::kernel;
use crate::meter::{Deadline, Meter, Outcome, stride_for};

pub use crate::transport::TYPED_SIZES as SIZES;

/// Whether arrays of `elements` floats can go through the typed transport.
pub fn supports(elements: usize) -> bool {
    crate::transport::Transport::ShmTyped.supports(elements)
}

/// Calls `$f::<N>($args)` for the `N` equal to `$elements` (one of [`SIZES`]).
macro_rules! dispatch {
    ($elements:expr, $f:ident ( $($arg:expr),* )) => {
        match $elements {
            16 => $f::<16>($($arg),*),
            64 => $f::<64>($($arg),*),
            256 => $f::<256>($($arg),*),
            1000 => $f::<1000>($($arg),*),
            1024 => $f::<1024>($($arg),*),
            4000 => $f::<4000>($($arg),*),
            4096 => $f::<4096>($($arg),*),
            16_000 => $f::<16_000>($($arg),*),
            16_384 => $f::<16_384>($($arg),*),
            n => Err(format!("shm-typed is not built for {n} floats (sizes: {SIZES:?})").into()),
        }
    };
}

/// Creates the typed channel `name` and sends `elements`-float values for `run`, then closes
/// it.
///
/// # Errors
/// shm-ring errors; a size not in [`SIZES`].
pub fn produce(name: &str, elements: usize, run: Duration) -> Result<(), BoxError> {
    dispatch!(elements, produce_n(name, run))
}

fn produce_n<const N: usize>(name: &str, run: Duration) -> Result<(), BoxError> {
    let mut tx = Sender::<[f32; N]>::create(name, &ChannelConfig::default())?;
    let mut value = [0f32; N];
    let mut deadline = Deadline::new(run, stride_for(N));
    let mut seq = 0u64;
    while deadline.keep_going() {
        kernel::fill(&mut value, seq);
        tx.send(&value)?;
        seq += 1;
    }
    drop(tx); // closes the channel: the consumer drains, then sees Disconnected
    Ok(())
}

/// Opens the typed channel `name` (waiting at most `patience`) and reads, sums and checks
/// every value until the producer closes.
///
/// # Errors
/// shm-ring errors, no channel within `patience`, data that fails the check, a size not in
/// [`SIZES`].
pub fn consume(
    name: &str,
    elements: usize,
    warmup: Duration,
    patience: Duration,
) -> Result<Outcome, BoxError> {
    dispatch!(elements, consume_n(name, warmup, patience))
}

fn consume_n<const N: usize>(
    name: &str,
    warmup: Duration,
    patience: Duration,
) -> Result<Outcome, BoxError> {
    let mut rx = Receiver::<[f32; N]>::open_timeout(name, patience)?;
    let mut meter = Meter::new(warmup, stride_for(N));
    loop {
        let seq = meter.count();
        match rx.recv() {
            Ok(xs) => meter.record(kernel::check(&xs, seq)?),
            Err(RecvError::Disconnected) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(meter.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_checked_values_between_threads() {
        for n in [16, 1000] {
            let name = format!("bench-unit-typed-{}-{n}", std::process::id());
            let consumer = {
                let name = name.clone();
                std::thread::spawn(move || {
                    consume(&name, n, Duration::ZERO, Duration::from_secs(10))
                })
            };
            produce(&name, n, Duration::from_millis(30)).unwrap();
            let o = consumer.join().unwrap().unwrap();
            assert!(o.messages > 0, "{n}: {o:?}");
            assert_eq!(o.checksum.fract(), 0.0);
            assert!(
                !shm_ring::Rendezvous::default()
                    .socket_dir()
                    .join(&name)
                    .exists()
            );
        }
    }

    #[test]
    fn other_sizes_are_refused() {
        assert!(supports(16) && supports(1000) && !supports(1_000_000));
        let err = produce("unused", 17, Duration::ZERO).unwrap_err();
        assert!(err.to_string().contains("not built for 17"), "{err}");
    }
}
