//! `Sender` / `Receiver` / `Message` / `Records`: shm-ring channels for numpy arrays.
//!
//! Blocking calls first try without releasing the GIL (nothing to wait for: the common case
//! of a stream that keeps up), then release it and wait in slices of [`SLICE`], checking for
//! signals (Ctrl-C) between slices. Numpy memory is only ever read with the GIL held: a message
//! that must wait owns its data first (`outgoing.rs`).
//!
//! Arrays handed to Python are numpy views whose base object holds what they point into: a
//! [`Loan`] (the sender's pool block, pinned while any view lives) or a [`Lease`] (the
//! received message and its pool blocks). numpy collapses base chains, so views of views,
//! `np.asarray`, memoryviews, DLPack capsules and torch tensors all keep that object alive.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

mod errors;
mod loan;
mod message;
mod outgoing;
mod receiver;
mod records;
mod send_many;
mod sender;
mod view;

pub use loan::Loan;
pub use message::Message;
pub use receiver::{Lease, Receiver};
pub use records::Records;
pub use sender::{Sender, SenderStats};

/// How long a blocked call waits with the GIL released before it checks for signals.
pub const SLICE: Duration = Duration::from_millis(50);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn closed() -> PyErr {
    PyValueError::new_err("the channel end is closed")
}

use crate::timeout::deadline;

/// The next wait slice before `deadline`; `None` once it has passed.
fn slice(deadline: Option<Instant>) -> Option<Duration> {
    match deadline {
        None => Some(SLICE),
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| left.min(SLICE))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_cut_into_slices_that_end_at_the_deadline() {
        assert_eq!(slice(None), Some(SLICE));
        assert_eq!(slice(Some(Instant::now() - Duration::from_millis(1))), None);
        let s = slice(Some(Instant::now() + Duration::from_millis(10))).unwrap();
        assert!(s <= Duration::from_millis(10) && s > Duration::ZERO);
        let s = slice(Some(Instant::now() + Duration::from_secs(10))).unwrap();
        assert_eq!(s, SLICE);
    }
}
