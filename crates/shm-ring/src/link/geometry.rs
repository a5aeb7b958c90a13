//! The pool's place in a segment: its geometry and the constants of its large size class.
//! Here, in the link layer, because the segment layout (`layout.rs`) places the pool; the pool
//! layer (`crate::pool`) allocates inside what this describes.

/// Largest [`ChannelConfig::large_pool`](crate::ChannelConfig::large_pool): 1 TiB.
pub const MAX_LARGE_POOL: usize = 1 << 40;

/// Bytes of a page: the granularity of commits and of the large size class's extents.
pub(crate) const PAGE: usize = 4096;

/// Most extents of the large size class out at once (in flight or loaned); the completion
/// ring has room for all of them besides every block.
pub(crate) const LARGE_OUT: u32 = 64;

/// Geometry of a pool inside a mapped segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolGeom {
    /// Offset of block 0 from the start of the segment (64-byte aligned).
    pub off: usize,
    /// Bytes per block (a multiple of 64).
    pub block_size: usize,
    /// Number of blocks.
    pub blocks: u32,
    /// Offset of the large size class's area (page-aligned, after the blocks).
    pub large_off: usize,
    /// Bytes of that area (0: no large size class). Extent `page` is block index
    /// `blocks + page`.
    pub large_len: usize,
}

impl PoolGeom {
    /// Where `len` bytes of block index `idx` (a block, or an extent of the large size class)
    /// start in the segment, if they lie inside the pool: blocks hold at most `block_size`
    /// bytes, extents anything up to the end of the area. Checked arithmetic: `idx` and `len`
    /// may come from a hostile peer.
    #[inline]
    pub(crate) fn locate(&self, idx: u64, len: u64) -> Option<usize> {
        if idx < u64::from(self.blocks) {
            return (len <= self.block_size as u64)
                .then(|| self.off + idx as usize * self.block_size);
        }
        let at = (idx - u64::from(self.blocks)).checked_mul(4096)?;
        let end = at.checked_add(len)?;
        (end <= self.large_len as u64).then(|| self.large_off + at as usize)
    }
}
