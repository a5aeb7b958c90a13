//! The small arrays of one received batch, copied together into one heap buffer: decoding a
//! batch of small items costs one allocation, not two per array (an `ndarray` buffer and its
//! box). Items refer to their arrays by index ([`crate::item`]'s `Slot::Batch`); the buffer
//! lives until the last item of the batch referring to it is dropped. Writing to such an array
//! (`Item::array_mut`, `Item::remove`) copies it to the heap first, as for shared memory.

use std::sync::{Arc, OnceLock};

use shm_ring::DType;
use smallvec::SmallVec;

/// Largest array (payload bytes) kept in a batch buffer; larger ones get their own heap array,
/// so that one kept item never holds a large batch in memory.
pub(crate) const MAX_ARRAY: usize = 1024;

/// A batch's shared buffer: filled while the batch is decoded, then frozen (the cell is set
/// once, at the end of decoding; items are only handed out after that).
pub(crate) type Shared = Arc<OnceLock<BatchArrays>>;

#[derive(Debug, Default)]
pub(crate) struct BatchArrays {
    /// 8-byte words: every array starts 8-byte aligned (aligned for every dtype).
    words: Vec<u64>,
    arrays: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    dtype: DType,
    shape: SmallVec<[usize; 2]>,
    start: usize,
    len: usize,
}

impl BatchArrays {
    /// Copies an array in; returns its index. Bool arrays are refused (`None`: their bytes
    /// must be checked, [`crate::array::Array::from_bytes`] does), as are arrays over
    /// [`MAX_ARRAY`] bytes and byte counts that do not match the shape.
    pub(crate) fn push(&mut self, dtype: DType, shape: &[usize], bytes: &[u8]) -> Option<u32> {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if dtype == DType::Bool
            || bytes.len() > MAX_ARRAY
            || n.and_then(|n| n.checked_mul(dtype.size())) != Some(bytes.len())
        {
            return None;
        }
        let start = self.words.len() * 8;
        self.words
            .resize(self.words.len() + bytes.len().div_ceil(8), 0);
        bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[start..start + bytes.len()]
            .copy_from_slice(bytes);
        self.arrays.push(Entry {
            dtype,
            shape: shape.into(),
            start,
            len: bytes.len(),
        });
        Some(self.arrays.len() as u32 - 1)
    }

    /// Array `i`: dtype, shape, row-major bytes (empty for an index not pushed).
    pub(crate) fn get(&self, i: u32) -> (DType, &[usize], &[u8]) {
        match self.arrays.get(i as usize) {
            Some(e) => (
                e.dtype,
                &e.shape,
                &bytemuck::cast_slice::<u64, u8>(&self.words)[e.start..e.start + e.len],
            ),
            None => (DType::U8, &[0], &[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_come_back_aligned_and_unchanged_and_bool_or_large_ones_are_refused() {
        let mut b = BatchArrays::default();
        let a = b.push(DType::U8, &[3], &[1, 2, 3]).unwrap();
        let x: Vec<u8> = bytemuck::cast_slice(&[1.5f64, -2.0]).to_vec();
        let c = b.push(DType::F64, &[2, 1], &x).unwrap();
        assert_eq!(b.get(a), (DType::U8, &[3usize][..], &[1u8, 2, 3][..]));
        let (dtype, shape, bytes) = b.get(c);
        assert_eq!(
            (dtype, shape, bytes),
            (DType::F64, &[2usize, 1][..], &x[..])
        );
        assert_eq!(bytes.as_ptr() as usize % 8, 0);
        assert_eq!(b.push(DType::Bool, &[1], &[1]), None);
        assert_eq!(
            b.push(DType::U8, &[MAX_ARRAY + 1], &[0; MAX_ARRAY + 1]),
            None
        );
        assert_eq!(b.push(DType::F32, &[2], &[0; 4]), None);
        assert_eq!(b.get(7).2, &[] as &[u8]);
    }
}
