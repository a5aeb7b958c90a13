//! The plainest GluonTS JSON line, read exactly as Python's `json.loads` reads it.
//!
//! `shmpipe.gluonts`'s workers run a user's chain over `FileDataset` entries; Python's
//! `json` module took ~0.5 ms of the ~0.8 ms a worker spent per 2,750-point series (2026-12-04).
//! [`parse_plain`] reads a line whose only keys are `start` (a string), `target` (a flat
//! array of JSON numbers and `null`) and optionally `item_id` (a string), each once, into
//! what `json.loads` gives followed by `numpy.asarray(target, dtype=float32)`: the keys in
//! the line's order, the strings as they are, each number read as Python reads it (a float
//! as the nearest `f64`, an integer as an `int`) and rounded to `f32` as numpy rounds it,
//! `null` as NaN. Anything it cannot prove equal is refused (`None`) and the caller runs
//! Python's own code: other keys or value types, escaped strings or raw control characters
//! (Python's strict mode rejects those), integers of more than 15 digits, numbers that
//! overflow to infinity, anything malformed.

use std::borrow::Cow;

use super::Parser;
use super::number;

/// A top-level key of a [`PlainLine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlainKey {
    /// `"start"`.
    Start,
    /// `"target"`.
    Target,
    /// `"item_id"`.
    ItemId,
}

/// A line of only `start`, `target` and maybe `item_id` (see the module doc).
#[derive(Debug)]
pub struct PlainLine<'a> {
    /// The keys in the line's order, each once.
    pub keys: Vec<PlainKey>,
    /// `start`'s string.
    pub start: &'a str,
    /// `target`'s values, rounded to `f32` as numpy rounds Python's numbers.
    pub target: Vec<f32>,
    /// `item_id`'s string, if the line has one.
    pub item_id: Option<&'a str>,
}

/// `line` read as Python's `json.loads` would read it, or `None` when it is not a plain
/// line (see the module doc).
///
/// # Examples
/// ```
/// use shmpipe_timeseries::jsonl::{PlainKey, parse_plain};
/// let p = parse_plain(br#"{"item_id": "a", "start": "2020-01-01", "target": [1, null, 2.5]}"#)
///     .unwrap();
/// assert_eq!(p.keys, [PlainKey::ItemId, PlainKey::Start, PlainKey::Target]);
/// assert_eq!((p.start, p.item_id), ("2020-01-01", Some("a")));
/// assert!(p.target[1].is_nan() && p.target[2] == 2.5);
/// assert!(parse_plain(br#"{"start": "2020-01-01", "target": [1], "x": 0}"#).is_none());
/// ```
pub fn parse_plain(line: &[u8]) -> Option<PlainLine<'_>> {
    let mut p = Parser {
        b: line,
        i: 0,
        field: None,
    };
    p.plain()
}

impl<'a> Parser<'a> {
    fn plain(&mut self) -> Option<PlainLine<'a>> {
        self.expect(b'{').ok()?;
        let mut keys = Vec::with_capacity(3);
        let (mut start, mut target, mut item_id) = (None, None, None);
        loop {
            let key = self.string().ok()?;
            self.expect(b':').ok()?;
            let k = match &*key {
                "start" if start.is_none() => {
                    start = Some(self.plain_string()?);
                    PlainKey::Start
                }
                "target" if target.is_none() => {
                    target = Some(self.plain_numbers()?);
                    PlainKey::Target
                }
                "item_id" if item_id.is_none() => {
                    item_id = Some(self.plain_string()?);
                    PlainKey::ItemId
                }
                _ => return None,
            };
            keys.push(k);
            match self.peek().ok()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    break;
                }
                _ => return None,
            }
        }
        self.ws();
        if self.i != self.b.len() {
            return None;
        }
        Some(PlainLine {
            keys,
            start: start?,
            target: target?,
            item_id,
        })
    }

    /// A string without escapes or control characters (it is then its own bytes).
    fn plain_string(&mut self) -> Option<&'a str> {
        if self.peek().ok()? != b'"' {
            return None;
        }
        match self.string().ok()? {
            Cow::Borrowed(s) if !s.bytes().any(|c| c < b' ') => Some(s),
            _ => None,
        }
    }

    /// `[x, ...]` of JSON numbers and `null`s.
    fn plain_numbers(&mut self) -> Option<Vec<f32>> {
        self.expect(b'[').ok()?;
        let mut out = Vec::new();
        if self.peek().ok()? == b']' {
            self.i += 1;
            return Some(out);
        }
        loop {
            let c = match self.b.get(self.i) {
                Some(&c) if c > b' ' => c,
                _ => self.peek().ok()?,
            };
            if c == b'n' {
                self.literal(b"null").ok()?;
                out.push(f32::NAN);
            } else {
                out.push(self.plain_number()?);
            }
            // `, ` (Python's separator) without a call to `peek`.
            if self.b.get(self.i) == Some(&b',') {
                self.i += if self.b.get(self.i + 1) == Some(&b' ') {
                    2
                } else {
                    1
                };
                continue;
            }
            match self.peek().ok()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(out);
                }
                _ => return None,
            }
        }
    }

    /// One number, as numpy rounds Python's reading of it to `f32`.
    #[inline(always)]
    fn plain_number(&mut self) -> Option<f32> {
        let d = number::scan(self.b, self.i).ok()?;
        if d.leading_zero(self.b) {
            return None;
        }
        self.i = d.end;
        let v = number::to_f32(self.b, &d)?;
        match d.integer_digits() {
            // Python's `int`: exact in `f64` up to 15 digits, so rounded once, as numpy
            // does; `-0` is the integer 0.
            Some(n) if n > 15 => None,
            Some(_) if v == 0.0 => Some(0.0),
            _ if v.is_infinite() => None,
            _ => Some(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(line: &str) -> Option<Vec<f32>> {
        parse_plain(line.as_bytes()).map(|p| p.target)
    }

    #[test]
    fn numbers_round_as_python_then_numpy() {
        for (text, want) in [
            ("-0", 0.0f32),
            ("-0.0", -0.0),
            ("-0e0", -0.0),
            ("3", 3.0),
            ("16777217", 16_777_216.0),
            ("0.1", 0.1),
            ("1e-50", 0.0),
            ("-1.5E+3", -1500.0),
            ("123456789012345", 123_456_789_012_345.0),
        ] {
            let got = target(&format!(r#"{{"start":"x","target":[{text}]}}"#)).unwrap();
            assert_eq!(got[0].to_bits(), want.to_bits(), "{text}");
        }
    }

    #[test]
    fn what_python_reads_otherwise_is_refused() {
        for line in [
            r#"{"start":"x","target":[1234567890123456]}"#,
            r#"{"start":"x","target":[1e400]}"#,
            r#"{"start":"x","target":[01]}"#,
            r#"{"start":"x","target":["NaN"]}"#,
            r#"{"start":"x","target":[NaN]}"#,
            r#"{"start":"x","target":[true]}"#,
            r#"{"start":"x","target":[[1]]}"#,
            r#"{"start":"x","target":[1],"target":[2]}"#,
            r#"{"start":"x","target":[1],"item_id":3}"#,
            r#"{"start":"x","target":[1],"feat_static_cat":[0]}"#,
            r#"{"start":"a\u0062","target":[1]}"#,
            "{\"start\":\"a\tb\",\"target\":[1]}",
            r#"{"start":"x","target":[1,]}"#,
            r#"{"start":"x","target":[1]} x"#,
            r#"{"target":[1]}"#,
            r#"{"start":"x"}"#,
            r#"{}"#,
        ] {
            assert!(parse_plain(line.as_bytes()).is_none(), "{line}");
        }
    }

    #[test]
    fn keys_keep_their_order_and_spaces_are_skipped() {
        let p = parse_plain(b" { \"target\" : [ 1 , null ,2 ] , \"start\" : \"s\" }\n").unwrap();
        assert_eq!(p.keys, [PlainKey::Target, PlainKey::Start]);
        assert_eq!((p.target.len(), p.start, p.item_id), (3, "s", None));
        assert!(p.target[1].is_nan());
        assert_eq!(target(r#"{"start":"x","target":[]}"#), Some(vec![]));
    }
}
