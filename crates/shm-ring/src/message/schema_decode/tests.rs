//! Every corruption of a data-only body is a specific `Error::Corrupt`: offsets come from the
//! encoder's constants (`schema_encode`), never from hard-coded numbers.

use std::marker::PhantomData;

use super::*;
use crate::dtype::DType;
use crate::message::SchemaMessage;
use crate::message::schema_encode::encode_data_inline;

fn schema() -> Schema {
    Schema::new()
        .array("t", DType::F32, &[4])
        .array_dyn("d", DType::U16, 2)
        .meta("s")
}

/// A pool of `blocks` blocks of `size` bytes, backed by `buf`.
fn pool(buf: &[u64], blocks: u32, size: usize) -> PoolRef<'_> {
    assert!(blocks as usize * size <= buf.len() * 8);
    PoolRef {
        base: buf.as_ptr().cast(),
        geom: crate::pool::PoolGeom {
            off: 0,
            block_size: size,
            blocks,
            large_off: 0,
            large_len: 0,
        },
        _life: PhantomData,
    }
}

/// The body of one record: t = [1, 2, 3, 4], d = 2 x 3, s = "hi". Returns it (as bytes) and
/// where each value starts.
fn body() -> (Vec<u8>, usize, usize, usize, usize) {
    let s = schema();
    let t = [1.0f32, 2.0, 3.0, 4.0];
    let d = ndarray::Array2::<u16>::from_shape_fn((2, 3), |(i, j)| (i * 3 + j) as u16);
    let m = SchemaMessage::new(&s)
        .slice(s.field("t").unwrap(), &t)
        .array(s.field("d").unwrap(), &d)
        .meta_str(s.field("s").unwrap(), "hi");
    let (buf, len) = encode_data_inline(&m, &s).unwrap();
    let bytes = bytemuck::cast_slice::<u64, u8>(&buf)[..len].to_vec();
    let t_ref = DATA_HEADER;
    let d_dims = t_ref + ARRAY_REF + 16;
    let d_ref = d_dims + 2 * 8;
    let s_ref = d_ref + ARRAY_REF + 16; // 12 bytes of u16, padded
    assert_eq!(s_ref + META_REF + 8, len);
    (bytes, t_ref, d_dims, d_ref, s_ref)
}

fn parse_err(b: &[u8]) -> String {
    parse_err_pool(b, PoolRef::empty())
}

fn parse_err_pool(b: &[u8], p: PoolRef<'_>) -> String {
    let s = schema();
    // An 8-aligned private copy (the receiver's scratch is).
    let mut buf = vec![0u64; b.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[..b.len()].copy_from_slice(b);
    let body = &bytemuck::cast_slice::<u64, u8>(&buf)[..b.len()];
    match PositionalView::parse(body, DataRef::private(body), p, &s) {
        Err(Error::Corrupt(w)) => w,
        other => panic!("accepted a corrupt body: {other:?}"),
    }
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn a_valid_body_reads_back_by_position() {
    let (b, ..) = body();
    let s = schema();
    let v = PositionalView::parse(&b, DataRef::private(&b), PoolRef::empty(), &s).unwrap();
    let r = v.record(0).unwrap();
    assert_eq!(
        r.slice::<f32>(s.field("t").unwrap()).unwrap(),
        &[1.0, 2.0, 3.0, 4.0]
    );
    let d = r.array::<u16>(s.field("d").unwrap()).unwrap();
    assert_eq!((d.shape(), d[[1, 2]]), (&[2, 3][..], 5));
    assert_eq!(r.meta_str(s.field("s").unwrap()).unwrap(), "hi");
}

#[test]
fn every_header_corruption_is_a_specific_error() {
    let (good, ..) = body();
    let len = good.len();
    let mut b = good.clone();
    put32(&mut b, DATA_MAGIC_AT, super::super::BODY_MAGIC);
    assert!(parse_err(&b).contains("magic"));
    assert!(parse_err(&good[..DATA_HEADER - 1]).contains("data-only body of"));
    let mut b = good.clone();
    put32(&mut b, DATA_LEN_AT, len as u32 + 8);
    assert!(parse_err(&b).contains("claims"));
    let mut b = good.clone();
    put32(&mut b, DATA_FIELDS_AT, 2);
    assert!(parse_err(&b).contains("fields per record"));
    let mut b = good.clone();
    put32(&mut b, DATA_RECORDS_AT, u32::MAX);
    assert!(parse_err(&b).contains("records of"));
    let mut b = good.clone();
    put32(&mut b, DATA_RECORDS_AT, 2);
    assert!(parse_err(&b).contains("run past the body"));
    let mut b = good.clone();
    put32(&mut b, DATA_BLOCK_REFS_AT, 1);
    assert!(parse_err(&b).contains("block arrays"));
    // Trailing bytes: the body claims 8 more than its values use.
    let mut b = good.clone();
    b.extend_from_slice(&[0; 8]);
    put32(&mut b, DATA_LEN_AT, len as u32 + 8);
    assert!(parse_err(&b).contains("ends its values at"));
}

#[test]
fn every_value_corruption_is_a_specific_error() {
    let (good, t_ref, d_dims, d_ref, s_ref) = body();
    // A byte length that is not the fixed shape's.
    let mut b = good.clone();
    put64(&mut b, t_ref + ARRAY_LEN_AT, 12);
    assert!(parse_err(&b).contains("bytes for"));
    // A dynamic dim changed (2 x 4 x u16 = 16 != 12 bytes), or overflowing.
    let mut b = good.clone();
    put64(&mut b, d_dims + 8, 4);
    assert!(parse_err(&b).contains("field 'd'"));
    let mut b = good.clone();
    put64(&mut b, d_dims, u64::MAX);
    assert!(parse_err(&b).contains("None elements"));
    // An unknown location.
    let mut b = good.clone();
    put32(&mut b, t_ref + ARRAY_LOC_AT, 7);
    assert!(parse_err(&b).contains("array location 7"));
    // A block past the pool, or a length over a block.
    let mut b = good.clone();
    put32(&mut b, t_ref + ARRAY_LOC_AT, LOC_BLOCK as u32);
    put32(&mut b, t_ref + ARRAY_BLOCK_AT, 2);
    let backing = vec![0u64; 64];
    assert!(parse_err_pool(&b, pool(&backing, 2, 64)).contains("array in block 2"));
    put32(&mut b, t_ref + ARRAY_BLOCK_AT, 1);
    assert!(parse_err_pool(&b, pool(&backing, 2, 8)).contains("array in block 1 of 16 bytes"));
    // Metadata: an unknown kind, an i64 with a string length, a string past the end.
    let mut b = good.clone();
    put32(&mut b, s_ref + META_KIND_AT, 9);
    assert!(parse_err(&b).contains("metadata kind 9"));
    let mut b = good.clone();
    put32(&mut b, s_ref + META_KIND_AT, META_I64);
    assert!(parse_err(&b).contains("metadata kind 1 (string length 2)"));
    let mut b = good.clone();
    put32(&mut b, s_ref + META_STR_LEN_AT, 9);
    assert!(parse_err(&b).contains("run past the body"));
    let mut b = good.clone();
    b[s_ref + META_REF] = 0xff;
    assert!(parse_err(&b).contains("not UTF-8"));
    // The inline array ref cut off.
    assert!(
        parse_err(&{
            let mut b = good[..d_ref + 8].to_vec();
            put32(&mut b, DATA_LEN_AT, (d_ref + 8) as u32);
            b
        })
        .contains("run past the body")
    );
}

#[test]
fn a_dynamic_rank_over_16_is_refused() {
    let s = Schema::new().array_dyn("big", DType::U8, DATA_MAX_NDIM + 1);
    let mut b = vec![0u8; DATA_HEADER + 8 * (DATA_MAX_NDIM + 1) + ARRAY_REF];
    put32(&mut b, DATA_MAGIC_AT, DATA_MAGIC);
    let n = b.len() as u32;
    put32(&mut b, DATA_LEN_AT, n);
    put32(&mut b, DATA_RECORDS_AT, 1);
    put32(&mut b, DATA_FIELDS_AT, 1);
    let mut buf = vec![0u64; b.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[..b.len()].copy_from_slice(&b);
    let body = &bytemuck::cast_slice::<u64, u8>(&buf)[..b.len()];
    let e = PositionalView::parse(body, DataRef::private(body), PoolRef::empty(), &s);
    assert!(matches!(e, Err(Error::Corrupt(w)) if w.contains("rank 17")));
}
