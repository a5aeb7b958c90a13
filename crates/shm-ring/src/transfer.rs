//! How arrays travel: copied inline, or zero-copy through the pool, or chosen by size.

/// Arrays of at least this many bytes go zero-copy under [`Transfer::Adaptive`] by default.
///
/// Chosen with `shmpipe-bench transport` (producer filling loans in place above the threshold,
/// copying below): copying wins for small arrays, zero-copy from about 1,000 floats. The
/// figures and the date of the run are in `docs/figures.md`. Pipelines of heap arrays use a
/// higher threshold (`shmpipe::DEFAULT_PIPELINE_THRESHOLD`). See ARCHITECTURE.md.
pub const DEFAULT_THRESHOLD: usize = 1024;

/// Per-array transfer policy of a [`crate::Sender`]. Loaned arrays ([`crate::ArrayLoan`]) are
/// always zero-copy, whatever the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// Arrays are copied into the message body (inline in the ring, or in a body block when
    /// the body is large); an owned [`crate::Message`] copies the body out of shared memory.
    Copy,
    /// Arrays are placed in pool blocks of their own, which the consumer reads in place and
    /// hands back when the message is dropped.
    ZeroCopy,
    /// Arrays smaller than `threshold` bytes are copied, larger ones go zero-copy.
    Adaptive {
        /// Size in bytes from which an array goes zero-copy.
        threshold: usize,
    },
}

impl Default for Transfer {
    fn default() -> Self {
        Transfer::Adaptive {
            threshold: DEFAULT_THRESHOLD,
        }
    }
}

impl Transfer {
    /// Whether an array of `bytes` bytes goes zero-copy under this policy.
    pub fn zero_copy(&self, bytes: usize) -> bool {
        match *self {
            Transfer::Copy => false,
            Transfer::ZeroCopy => bytes > 0,
            Transfer::Adaptive { threshold } => bytes >= threshold && bytes > 0,
        }
    }
}
