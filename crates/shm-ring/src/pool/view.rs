//! The consumer's read access to the pool: array data referenced by block, checked against
//! the pool's geometry and the mapping before any byte is viewed.

use crate::error::{Error, corrupt};
use crate::link::segment::Segment;
use crate::pool::PoolGeom;
use crate::ring::bytes::ShmBytes;

/// The pool a message's block references resolve against: where the blocks and the large
/// size class's area lie (`geom`) in the mapped segment (`seg`, valid for `'a`). Made only
/// from a mapped segment (or empty), so every range it hands out lies in mapped memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolRef<'a> {
    seg: ShmBytes<'a>,
    geom: PoolGeom,
}

impl<'a> PoolRef<'a> {
    /// The pool of geometry `geom` in `seg`.
    pub(crate) fn new(seg: &'a Segment, geom: PoolGeom) -> Self {
        PoolRef {
            seg: seg.bytes(),
            geom,
        }
    }

    /// A pool with no blocks (messages that reference one are corrupt).
    pub(crate) fn empty() -> Self {
        PoolRef {
            seg: ShmBytes::private(&[]),
            geom: PoolGeom {
                off: 0,
                block_size: 0,
                blocks: 0,
                large_off: 0,
                large_len: 0,
            },
        }
    }

    /// The `len` bytes of block index `idx`: a block (up to `block_size` bytes) or an extent
    /// of the large size class (index `blocks + page`, up to the end of its area), as the
    /// documented zero-copy array view (the producer may change the values, never the range,
    /// which was validated on a private copy of the message).
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the range lies outside the pool (or the mapping).
    pub(crate) fn block(&self, idx: u64, len: u64) -> Result<&'a [u8], Error> {
        self.geom
            .locate(idx, len)
            .and_then(|at| self.seg.view(at, usize::try_from(len).ok()?))
            .ok_or_else(|| {
                corrupt(format!(
                    "array in block {idx} of {len} bytes (pool: {} blocks of {} bytes, large \
                     area of {} bytes)",
                    self.geom.blocks, self.geom.block_size, self.geom.large_len
                ))
            })
    }
}
