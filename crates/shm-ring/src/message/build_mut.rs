//! In-place (`&mut self`) forms of the [`MessageBuilder`] methods, for callers that add many
//! fields in a loop (a batch of small records): the by-value builder methods move the whole
//! builder (a few hundred bytes) on every call, these do not. Same fields, same encoding.

use std::borrow::Cow;

use super::EncodeError;
use super::{ArraySrc, FieldB, FieldSrc, MessageBuilder, MetaValue};
use crate::dtype::DType;

impl<'a> MessageBuilder<'a> {
    /// Sets the message tag in place (as [`MessageBuilder::tag`]).
    #[inline]
    pub fn set_tag(&mut self, tag: u32) {
        self.tag = tag;
    }

    /// Sets the tag of the current record in place (as [`MessageBuilder::record_tag`]).
    #[inline]
    pub fn set_record_tag(&mut self, tag: u64) {
        let r = self.record_starts.len() as u32;
        match self.record_tags.last_mut() {
            Some((last, t)) if *last == r => *t = tag,
            _ => self.record_tags.push((r, tag)),
        }
    }

    /// Ends the current record and starts the next one, in place (as
    /// [`MessageBuilder::next_record`]).
    #[inline]
    pub fn push_next_record(&mut self) {
        self.record_starts.push(self.fields.len() as u32);
    }

    /// Adds a metadata value in place (as [`MessageBuilder::meta`]).
    #[inline]
    pub fn push_meta(&mut self, name: impl Into<Cow<'a, str>>, v: MetaValue<'a>) {
        self.fields.push(FieldB {
            name: name.into(),
            src: FieldSrc::Meta(v),
        });
    }

    /// Adds an array given as raw little-endian row-major bytes, in place (as
    /// [`MessageBuilder::array_raw`]).
    ///
    /// # Errors
    /// As [`MessageBuilder::array_raw`]; nothing is added then.
    #[inline]
    pub fn push_array_raw(
        &mut self,
        name: impl Into<Cow<'a, str>>,
        dtype: DType,
        shape: &[usize],
        bytes: &'a [u8],
    ) -> Result<(), EncodeError> {
        let name = name.into();
        super::error::check_array(&name, dtype, shape, bytes.len())?;
        self.fields.push(FieldB {
            name,
            src: FieldSrc::Array {
                dtype,
                shape: shape.iter().map(|&d| d as u64).collect(),
                data: ArraySrc::Borrowed(bytes),
            },
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FieldRef, MessageView};

    fn body(b: &MessageBuilder<'_>) -> Vec<u8> {
        let (words, len) = b.encode_inline().unwrap();
        bytemuck::cast_slice::<u64, u8>(&words)[..len].to_vec()
    }

    #[test]
    fn in_place_methods_encode_exactly_as_the_by_value_ones() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let by_value = MessageBuilder::new()
            .tag(9)
            .record_tag(5)
            .meta_i64("i", -3)
            .array_slice("x", &[2, 2], &x)
            .unwrap()
            .next_record()
            .meta_str("s", "é")
            .record_tag(1 << 40);
        let mut in_place = MessageBuilder::new();
        in_place.set_tag(9);
        in_place.set_record_tag(5);
        in_place.push_meta("i", MetaValue::I64(-3));
        in_place
            .push_array_raw("x", DType::F32, &[2, 2], bytemuck::cast_slice(&x))
            .unwrap();
        in_place.push_next_record();
        in_place.push_meta("s", MetaValue::Str("é".into()));
        in_place.set_record_tag(1 << 40);
        assert_eq!(body(&in_place), body(&by_value));

        let bytes = body(&in_place);
        let m: MessageView<'_> = MessageView::decode(&bytes).unwrap();
        assert_eq!((m.tag(), m.len()), (9, 2));
        let r0 = m.record(0).unwrap();
        assert_eq!((r0.tag(), r0.meta_i64("i")), (5, Some(-3)));
        let arrays: Vec<_> = r0
            .fields()
            .filter_map(|f| match f.unwrap() {
                FieldRef::Array(a) => Some((a.name.to_owned(), a.shape.to_vec(), a.bytes.len())),
                FieldRef::Meta(..) => None,
            })
            .collect();
        assert_eq!(arrays, vec![("x".to_owned(), vec![2, 2], 16)]);
        assert_eq!(m.record(1).unwrap().tag(), 1 << 40);
    }

    #[test]
    fn push_array_raw_refuses_a_wrong_length_and_adds_nothing() {
        let mut b = MessageBuilder::new();
        let e = b.push_array_raw("x", DType::F64, &[3], &[0u8; 16]);
        assert_eq!(
            e,
            Err(EncodeError::ShapeMismatch {
                name: "x".into(),
                shape: vec![3],
                dtype: DType::F64,
                bytes: 16
            })
        );
        assert!(b.fields.is_empty());
    }
}
