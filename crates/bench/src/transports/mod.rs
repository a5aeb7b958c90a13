//! Implementations of the transports, one module each.

pub mod channel;
#[cfg(feature = "iceoryx2")]
pub mod iox;
pub mod ring;
pub mod shm;
pub mod stream;
pub mod typed;

use crate::transport::Transport;

/// Cleans up what a failed measurement of `transport` with rendezvous `name` may have left
/// behind (killed producers cannot unlink their shared-memory objects, nor remove the sockets
/// of their named channels).
pub fn cleanup_after_failure(transport: Transport, name: &str) {
    if matches!(
        transport,
        Transport::ShmZeroCopy | Transport::ShmCopy | Transport::ShmAdaptive | Transport::ShmTyped
    ) {
        let _ = shm_ring::Rendezvous::default().remove_stale(name);
    }
}
