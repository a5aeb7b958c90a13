//! Reference reader built on `serde_json`, kept to measure [`crate::jsonl`]
//! against and to cross-check its results.
//!
//! Arrays are still deserialized straight into `Vec<f32>` (no `serde_json::Value`
//! tree), so this is the fastest reasonable `serde_json` reader, not a straw man.

use std::fmt;
use std::sync::Arc;

use serde::Deserializer;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::entry::{DataEntry, FieldArray, field};
use crate::error::{ParseError, ParseErrorKind};
use crate::period::{Freq, Period};

/// Parses one JSON line with `serde_json`; same result as [`crate::jsonl::parse_entry`].
///
/// # Errors
/// A [`ParseError`]; its offset is the column `serde_json` reports and its
/// field is not tracked (`None`), except for missing fields and bad `start`.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::serde_reader::parse_entry_serde;
/// let e = parse_entry_serde(br#"{"start":"2020-01-01","target":[1,null]}"#, "D".parse().unwrap()).unwrap();
/// assert!(e.get("target").unwrap().data()[1].is_nan());
/// ```
pub fn parse_entry_serde(line: &[u8], freq: Freq) -> Result<DataEntry, ParseError> {
    let mut de = serde_json::Deserializer::from_slice(line);
    let raw = de.deserialize_map(EntryVisitor).map_err(json_err)?;
    de.end().map_err(json_err)?;
    finish(raw, freq)
}

/// Reads one entry from any serde [`Deserializer`] (e.g. another JSON crate's),
/// with the same visitors as [`parse_entry_serde`]: `parse_bench` uses it to
/// measure other parsers doing exactly the same work.
///
/// # Errors
/// A [`ParseError`] without field or offset for the deserializer's errors.
pub fn parse_entry_with<'de, D: Deserializer<'de>>(
    d: D,
    freq: Freq,
) -> Result<DataEntry, ParseError> {
    let raw = d.deserialize_map(EntryVisitor).map_err(|_| ParseError {
        field: None,
        offset: 0,
        kind: ParseErrorKind::WrongType("a GluonTS data entry"),
    })?;
    finish(raw, freq)
}

fn finish(raw: RawEntry, freq: Freq) -> Result<DataEntry, ParseError> {
    let missing = |name: &str| ParseError {
        field: Some(name.into()),
        offset: 0,
        kind: ParseErrorKind::Missing,
    };
    let start = raw.start.ok_or_else(|| missing("start"))?;
    let start = Period::parse(&start, freq).map_err(|t| ParseError {
        field: Some("start".into()),
        offset: 0,
        kind: ParseErrorKind::Time(t),
    })?;
    let mut e = DataEntry::default();
    e.item_id = raw.item_id;
    e.start = Some(start);
    e.insert(
        field::TARGET,
        raw.target.ok_or_else(|| missing(field::TARGET))?,
    );
    for (name, a) in raw.others {
        e.insert(name, a);
    }
    Ok(e)
}

fn json_err(e: serde_json::Error) -> ParseError {
    let kind = if e.is_eof() {
        ParseErrorKind::UnexpectedEnd
    } else if e.is_data() {
        ParseErrorKind::WrongType("a GluonTS field value")
    } else {
        ParseErrorKind::BadNumber
    };
    ParseError {
        field: None,
        offset: e.column().saturating_sub(1),
        kind,
    }
}

#[derive(Default)]
struct RawEntry {
    start: Option<String>,
    target: Option<FieldArray>,
    item_id: Option<Arc<str>>,
    others: Vec<(&'static str, FieldArray)>,
}

struct EntryVisitor;

impl<'de> Visitor<'de> for EntryVisitor {
    type Value = RawEntry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a GluonTS data entry object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEntry, A::Error> {
        let mut raw = RawEntry::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match &*key {
                "start" => raw.start = Some(map.next_value::<String>()?),
                "target" => raw.target = Some(map.next_value_seed(ArraySeed)?),
                "item_id" => {
                    raw.item_id = match map.next_value::<serde_json::Value>()? {
                        serde_json::Value::String(s) => Some(Arc::from(s)),
                        serde_json::Value::Null => None,
                        v @ serde_json::Value::Number(_) => Some(Arc::from(v.to_string())),
                        _ => return Err(de::Error::custom("item_id must be a string or number")),
                    }
                }
                name @ (field::FEAT_STATIC_CAT
                | field::FEAT_STATIC_REAL
                | field::FEAT_DYNAMIC_REAL
                | field::FEAT_DYNAMIC_CAT
                | field::PAST_FEAT_DYNAMIC_REAL) => {
                    let name: &'static str = match name {
                        field::FEAT_STATIC_CAT => field::FEAT_STATIC_CAT,
                        field::FEAT_STATIC_REAL => field::FEAT_STATIC_REAL,
                        field::FEAT_DYNAMIC_REAL => field::FEAT_DYNAMIC_REAL,
                        field::FEAT_DYNAMIC_CAT => field::FEAT_DYNAMIC_CAT,
                        _ => field::PAST_FEAT_DYNAMIC_REAL,
                    };
                    if let Some(a) = map.next_value_seed(OptionalArraySeed)? {
                        let want = if name.starts_with("feat_static") {
                            1
                        } else {
                            2
                        };
                        if a.ndim() != want {
                            return Err(de::Error::custom(format!("{name} must be {want}-D")));
                        }
                        raw.others.push((name, a));
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(raw)
    }
}

/// `null` or an array.
struct OptionalArraySeed;

impl<'de> DeserializeSeed<'de> for OptionalArraySeed {
    type Value = Option<FieldArray>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<FieldArray>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Option<FieldArray>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("null or an array")
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                ArraySeed.deserialize(d).map(Some)
            }
        }
        d.deserialize_option(V)
    }
}

/// A 1-D array, or a 2-D array of equal-length rows.
struct ArraySeed;

impl<'de> DeserializeSeed<'de> for ArraySeed {
    type Value = FieldArray;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<FieldArray, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ArraySeed {
    type Value = FieldArray;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of numbers or of arrays of numbers")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FieldArray, A::Error> {
        let mut data = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        let mut rows = 0usize;
        let mut cols = None;
        let mut n = 0usize;
        while let Some(kind) = seq.next_element_seed(ElemSeed { out: &mut data })? {
            match (kind, cols) {
                (Elem::Scalar, None) if rows == 0 => n += 1,
                (Elem::Row(len), Some(c)) if len == c && n == 0 => rows += 1,
                (Elem::Row(len), None) if n == 0 && rows == 0 => {
                    cols = Some(len);
                    rows = 1;
                }
                _ => return Err(de::Error::custom("ragged or mixed array")),
            }
        }
        Ok(match cols {
            Some(c) => FieldArray::new(&[rows, c], data),
            None => FieldArray::new(&[n], data),
        })
    }
}

enum Elem {
    Scalar,
    Row(usize),
}

/// One element: a scalar pushed to `out`, or a row whose scalars are pushed to `out`.
struct ElemSeed<'b> {
    out: &'b mut Vec<f32>,
}

impl<'de> DeserializeSeed<'de> for ElemSeed<'_> {
    type Value = Elem;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Elem, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ElemSeed<'_> {
    type Value = Elem;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number, null, a numeric string or an array")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Elem, E> {
        self.out.push(v as f32);
        Ok(Elem::Scalar)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Elem, E> {
        self.out.push(v as f64 as f32);
        Ok(Elem::Scalar)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Elem, E> {
        self.out.push(v as f64 as f32);
        Ok(Elem::Scalar)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Elem, E> {
        self.out.push(f32::NAN);
        Ok(Elem::Scalar)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Elem, E> {
        let x = v
            .trim()
            .parse::<f64>()
            .map_err(|_| E::custom(format!("not a number: {v:?}")))?;
        self.out.push(x as f32);
        Ok(Elem::Scalar)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Elem, A::Error> {
        let mut n = 0;
        while let Some(kind) = seq.next_element_seed(ElemSeed {
            out: &mut *self.out,
        })? {
            match kind {
                Elem::Scalar => n += 1,
                Elem::Row(_) => return Err(de::Error::custom("arrays nested deeper than 2")),
            }
        }
        Ok(Elem::Row(n))
    }
}
