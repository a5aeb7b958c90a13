//! Encoding a message body (see the module doc of `message` for the format).

use smallvec::SmallVec;

use super::*;
use crate::ring::bytes::ShmBytesMut;

fn field_size(f: &FieldB<'_>, place: Place) -> usize {
    let name = f.name.len();
    match &f.src {
        FieldSrc::Meta(MetaValue::Str(s)) => FIELD_HEADER + pad8(name + s.len()),
        FieldSrc::Meta(_) => FIELD_HEADER + pad8(name),
        FieldSrc::Array { shape, data, .. } => {
            let inline = if place == Place::Inline {
                pad8(data.len())
            } else {
                0
            };
            FIELD_HEADER + 8 * shape.len() + pad8(name) + inline
        }
    }
}

/// Names must be unique within a record (or two lookups of one name could disagree).
#[cold]
fn check_unique(m: &MessageBuilder<'_>) -> Result<(), EncodeError> {
    let mut names = super::unique::UniqueNames::default();
    for r in 0..m.len() {
        names.clear();
        for f in &m.fields[m.record_range(r)] {
            if !names.insert(&f.name) {
                return Err(EncodeError::DuplicateField {
                    name: f.name.to_string(),
                    record: r,
                });
            }
        }
    }
    Ok(())
}

/// Checks limits of the encoding (name and string lengths, dimensions) before encoding.
pub(crate) fn check_limits(m: &MessageBuilder<'_>) -> Result<(), EncodeError> {
    if m.fields.len() > 1 {
        check_unique(m)?;
    }
    for f in &m.fields {
        if f.name.len() > EncodeError::MAX_NAME {
            return Err(EncodeError::NameTooLong {
                name: f.name.to_string(),
            });
        }
        match &f.src {
            FieldSrc::Meta(MetaValue::Str(s)) if s.len() > EncodeError::MAX_STR => {
                return Err(EncodeError::StringTooLong {
                    name: f.name.to_string(),
                    len: s.len(),
                });
            }
            FieldSrc::Array { shape, .. } if shape.len() > MAX_NDIM => {
                return Err(EncodeError::TooManyDims {
                    name: f.name.to_string(),
                    ndim: shape.len(),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// Encoded size of the body with the given placement of each field.
pub(crate) fn body_len(m: &MessageBuilder<'_>, places: &[Place]) -> usize {
    BODY_HEADER
        + RECORD_HEADER * m.len()
        + m.fields
            .iter()
            .zip(places)
            .map(|(f, &p)| field_size(f, p))
            .sum::<usize>()
}

/// Writes the body into `dst`: exactly the message's `body_len` bytes, which may be shared
/// memory the peer can write (they are only ever written, never read back). Arrays placed in
/// blocks are only referenced here; the caller copies their data.
///
/// # Panics
/// If `dst` is shorter than the body (a bug of the caller: it is `body_len` bytes).
pub(crate) fn encode(m: &MessageBuilder<'_>, places: &[Place], dst: ShmBytesMut<'_>) {
    let total = dst.len();
    let mut w = Writer { dst, pos: 0 };
    w.u32(BODY_MAGIC);
    w.u32(m.tag);
    w.u32(m.len() as u32);
    w.u32(total as u32);
    w.u32(
        places
            .iter()
            .filter(|p| matches!(p, Place::Block(_)))
            .count() as u32,
    );
    w.u32(0);
    for r in 0..m.len() {
        let range = m.record_range(r);
        let len = RECORD_HEADER
            + range
                .clone()
                .map(|i| field_size(&m.fields[i], places[i]))
                .sum::<usize>();
        w.u32(len as u32);
        w.u32(range.len() as u32);
        w.u64(m.tag_of(r));
        for i in range {
            let f = &m.fields[i];
            let name = f.name.as_bytes();
            match &f.src {
                FieldSrc::Meta(v) => {
                    let (kind, a, s): (u8, u64, &[u8]) = match v {
                        MetaValue::I64(x) => (KIND_I64, *x as u64, &[]),
                        MetaValue::F64(x) => (KIND_F64, x.to_bits(), &[]),
                        MetaValue::Str(s) => (KIND_STR, 0, s.as_bytes()),
                    };
                    w.bytes(&[kind, name.len() as u8, 0, 0, 0, 0, 0, 0]);
                    w.u64(a);
                    w.u64(s.len() as u64);
                    w.bytes(name);
                    w.bytes(s);
                    w.align8();
                }
                FieldSrc::Array { dtype, shape, data } => {
                    let (loc, a) = match places[i] {
                        Place::Block(b) => (LOC_BLOCK, b as u64),
                        _ => {
                            let data_at = w.pos + FIELD_HEADER + 8 * shape.len() + pad8(name.len());
                            (LOC_INLINE, data_at as u64)
                        }
                    };
                    w.bytes(&[
                        KIND_ARRAY,
                        name.len() as u8,
                        shape.len() as u8,
                        *dtype as u8,
                        loc,
                        0,
                        0,
                        0,
                    ]);
                    w.u64(a);
                    w.u64(data.len() as u64);
                    for &d in shape {
                        w.u64(d);
                    }
                    w.bytes(name);
                    w.align8();
                    if loc == LOC_INLINE {
                        debug_assert_eq!(w.pos as u64, a);
                        w.bytes(data.bytes());
                        w.align8();
                    }
                }
            }
        }
    }
    debug_assert_eq!(w.pos, total);
}

/// Writes a body, front to back, through a checked view (the destination may be shared
/// memory).
pub(super) struct Writer<'a> {
    dst: ShmBytesMut<'a>,
    pos: usize,
}

impl Writer<'_> {
    #[inline]
    pub(super) fn bytes(&mut self, b: &[u8]) {
        self.dst.write_from(self.pos, b);
        self.pos += b.len();
    }
    #[inline]
    pub(super) fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    #[inline]
    pub(super) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    #[inline]
    pub(super) fn align8(&mut self) {
        let n = pad8(self.pos) - self.pos;
        self.dst.zero(self.pos, n);
        self.pos += n;
    }
}

/// Encodes a message with every array inline into a fresh, 8-aligned buffer (for tests,
/// tools and process-local use) and returns the buffer and the body length.
pub fn encode_inline(m: &MessageBuilder<'_>) -> Result<(Vec<u64>, usize), EncodeError> {
    check_limits(m)?;
    if let Some(f) = m.fields.iter().find(|f| {
        matches!(
            f.src,
            FieldSrc::Array {
                data: ArraySrc::Loan(_),
                ..
            }
        )
    }) {
        return Err(EncodeError::Loaned {
            name: f.name.to_string(),
        });
    }
    let places: SmallVec<[Place; 8]> = m
        .fields
        .iter()
        .map(|f| match f.src {
            FieldSrc::Array { .. } => Place::Inline,
            _ => Place::None,
        })
        .collect();
    let len = body_len(m, &places);
    let mut buf = vec![0u64; len.div_ceil(8)];
    encode(
        m,
        &places,
        ShmBytesMut::private(&mut bytemuck::cast_slice_mut(&mut buf)[..len]),
    );
    Ok((buf, len))
}
