//! A received message that owns its body (copied out of the ring) and leases its blocks.

use std::sync::Arc;

use smallvec::SmallVec;

use super::receiver::RxShared;
use crate::FieldError;
use crate::message::{MessageView, RecordView};

/// A received message, owned: its body was copied out of the ring, and the pool blocks of its
/// zero-copy arrays stay leased to it until it is dropped. `Send`.
#[derive(Debug)]
pub struct Message {
    pub(super) body: Vec<u64>,
    pub(super) body_len: usize,
    pub(super) blocks: SmallVec<[u32; 4]>,
    /// Bytes of its arrays in extents of the large size class.
    pub(super) large_bytes: usize,
    pub(super) shared: Arc<RxShared>,
}

impl Message {
    /// The message, read in place.
    pub fn view(&self) -> MessageView<'_> {
        let bytes = &bytemuck::cast_slice::<u64, u8>(&self.body)[..self.body_len];
        MessageView::parse(bytes, self.shared.pool()).expect("validated when received")
    }

    /// The tag.
    pub fn tag(&self) -> u32 {
        self.view().tag()
    }

    /// Record `i`.
    ///
    /// # Errors
    /// [`FieldError::NoSuchRecord`] past the end, [`FieldError::Corrupt`] (not after a
    /// validated receive).
    pub fn record(&self, i: usize) -> Result<RecordView<'_>, FieldError> {
        self.view().record(i)
    }

    /// Pool blocks this message holds (zero-copy arrays), extents of the large size class
    /// included.
    pub fn leased_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Bytes of the arrays this message holds in extents of the large size class
    /// ([`ChannelConfig::large_pool`](crate::ChannelConfig::large_pool)). A consumer that
    /// keeps messages should keep at most [`LARGE_IN_FLIGHT`](crate::LARGE_IN_FLIGHT)` / 2` of
    /// them (copy the rest): the producer then always finds room for its next item.
    pub fn leased_large_bytes(&self) -> usize {
        self.large_bytes
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        self.shared.release(&self.blocks);
    }
}
