//! Reader for GluonTS's JSON-lines format.
//!
//! One JSON object per line:
//! `{"start": "2020-01-01 00:00:00", "target": [1.0, null, "NaN", 3], "item_id": "a",
//!   "feat_static_cat": [0], "feat_static_real": [0.5], "feat_dynamic_real": [[...], [...]]}`.
//! `target` is 1-D, or 2-D (`(dim, T)`) for multivariate series. `null` and strings
//! such as `"NaN"` are missing values (NaN). Unknown keys are skipped. As in
//! GluonTS, numbers are read as `f64` and rounded to `f32`.
//!
//! JSON parsing dominates the cost of this workload, so this is a hand-written
//! single-pass parser: digits are read eight bytes at a time, and numbers go
//! straight into `Vec<f32>` through a fast estimate that is proven to round like
//! the exact parse unless it lies near an `f32` rounding midpoint (see
//! `decimal_to_f32`: up to 18 significant digits and powers of ten up to 1e22),
//! falling back to the standard library's parser otherwise; strings are borrowed
//! unless escaped.
//! [`crate::serde_reader`] is the `serde_json` reference it is measured against.

mod number;
mod plain;
mod reader;

use std::borrow::Cow;
use std::sync::Arc;

use crate::entry::{DataEntry, FieldArray, field};
use crate::error::{ParseError, ParseErrorKind};

use crate::period::{Freq, Period};
pub use plain::{PlainKey, PlainLine, parse_plain};
pub use reader::{JsonLinesReader, parse_lines, read_file, split_lines};

/// Nesting limit for skipped values (protects the stack from hostile input).
const MAX_DEPTH: usize = 128;

/// Parses one JSON line into a [`DataEntry`] whose `start` has frequency `freq`.
///
/// # Errors
/// A [`ParseError`] naming the field and byte offset of the first problem;
/// `start` and `target` are required.
///
/// # Examples
/// ```
/// use shmpipe_timeseries::jsonl::parse_entry;
/// let line = br#"{"start": "2020-01-01 00:00", "target": [1, null, "NaN", 2.5], "item_id": 7}"#;
/// let e = parse_entry(line, "h".parse().unwrap()).unwrap();
/// let t = e.get("target").unwrap().data();
/// assert_eq!(t[0], 1.0);
/// assert!(t[1].is_nan() && t[2].is_nan());
/// assert_eq!(e.item_id.as_deref(), Some("7"));
/// ```
pub fn parse_entry(line: &[u8], freq: Freq) -> Result<DataEntry, ParseError> {
    let mut p = Parser {
        b: line,
        i: 0,
        field: None,
    };
    p.entry(freq)
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
    /// Field being parsed, for error messages.
    field: Option<&'static str>,
}

impl<'a> Parser<'a> {
    #[cold]
    #[inline(never)]
    fn err(&self, kind: ParseErrorKind) -> ParseError {
        ParseError {
            field: self.field.map(str::to_owned),
            offset: self.i,
            kind,
        }
    }

    #[inline]
    fn ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if c == b' ' || c == b'\n' || c == b'\t' || c == b'\r' {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    #[inline]
    fn peek(&mut self) -> Result<u8, ParseError> {
        self.ws();
        self.b
            .get(self.i)
            .copied()
            .ok_or_else(|| self.err(ParseErrorKind::UnexpectedEnd))
    }

    #[inline]
    fn expect(&mut self, c: u8) -> Result<(), ParseError> {
        let got = self.peek()?;
        if got == c {
            self.i += 1;
            Ok(())
        } else {
            Err(self.err(ParseErrorKind::UnexpectedByte(got)))
        }
    }

    fn entry(&mut self, freq: Freq) -> Result<DataEntry, ParseError> {
        let mut e = DataEntry::default();
        let mut start: Option<Period> = None;
        let mut target: Option<FieldArray> = None;
        self.expect(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
        } else {
            loop {
                self.field = None;
                let key = self.string()?;
                self.expect(b':')?;
                match &*key {
                    "start" => {
                        self.field = Some("start");
                        let s = self.string_value()?;
                        let at = self.i;
                        start = Some(Period::parse(&s, freq).map_err(|t| ParseError {
                            field: Some("start".into()),
                            offset: at,
                            kind: ParseErrorKind::Time(t),
                        })?);
                    }
                    "target" => {
                        self.field = Some(field::TARGET);
                        target = Some(self.array_1d_or_2d()?);
                    }
                    "item_id" => {
                        self.field = Some("item_id");
                        e.item_id = self.item_id()?;
                    }
                    "feat_static_cat" => self.static_field(&mut e, field::FEAT_STATIC_CAT)?,
                    "feat_static_real" => self.static_field(&mut e, field::FEAT_STATIC_REAL)?,
                    "feat_dynamic_real" => self.dynamic_field(&mut e, field::FEAT_DYNAMIC_REAL)?,
                    "feat_dynamic_cat" => self.dynamic_field(&mut e, field::FEAT_DYNAMIC_CAT)?,
                    "past_feat_dynamic_real" => {
                        self.dynamic_field(&mut e, field::PAST_FEAT_DYNAMIC_REAL)?
                    }
                    _ => self.skip_value(0)?,
                }
                self.field = None;
                match self.peek()? {
                    b',' => self.i += 1,
                    b'}' => {
                        self.i += 1;
                        break;
                    }
                    c => return Err(self.err(ParseErrorKind::UnexpectedByte(c))),
                }
            }
        }
        self.ws();
        if self.i != self.b.len() {
            return Err(self.err(ParseErrorKind::TrailingBytes));
        }
        let missing = |name: &str| ParseError {
            field: Some(name.into()),
            offset: 0,
            kind: ParseErrorKind::Missing,
        };
        e.start = Some(start.ok_or_else(|| missing("start"))?);
        let target = target.ok_or_else(|| missing(field::TARGET))?;
        // Keep `target` first, like GluonTS's entries.
        let rest = e.take_fields();
        e.insert(field::TARGET, target);
        for (n, a) in rest {
            e.insert(n, a);
        }
        Ok(e)
    }

    fn static_field(&mut self, e: &mut DataEntry, name: &'static str) -> Result<(), ParseError> {
        self.field = Some(name);
        if self.peek()? == b'n' {
            return self.literal(b"null");
        }
        let a = self.array_1d_or_2d()?;
        if a.ndim() != 1 {
            return Err(self.err(ParseErrorKind::WrongType("1-D array")));
        }
        e.insert(name, a);
        Ok(())
    }

    fn dynamic_field(&mut self, e: &mut DataEntry, name: &'static str) -> Result<(), ParseError> {
        self.field = Some(name);
        if self.peek()? == b'n' {
            return self.literal(b"null");
        }
        let a = self.array_1d_or_2d()?;
        if a.ndim() != 2 && a.time_len() != 0 {
            return Err(self.err(ParseErrorKind::WrongType("2-D array")));
        }
        let a = if a.ndim() == 2 {
            a
        } else {
            FieldArray::zeros(&[0, 0])
        };
        e.insert(name, a);
        Ok(())
    }

    fn item_id(&mut self) -> Result<Option<Arc<str>>, ParseError> {
        match self.peek()? {
            b'"' => Ok(Some(Arc::from(&*self.string()?))),
            b'n' => self.literal(b"null").map(|()| None),
            b'-' | b'0'..=b'9' => {
                let s = self.i;
                self.number()?;
                let text = std::str::from_utf8(&self.b[s..self.i])
                    .map_err(|_| self.err(ParseErrorKind::BadNumber))?;
                Ok(Some(Arc::from(text)))
            }
            _ => Err(self.err(ParseErrorKind::WrongType("string or number"))),
        }
    }

    fn string_value(&mut self) -> Result<Cow<'a, str>, ParseError> {
        if self.peek()? != b'"' {
            return Err(self.err(ParseErrorKind::WrongType("string")));
        }
        self.string()
    }

    /// A JSON string; borrowed when it has no escapes.
    fn string(&mut self) -> Result<Cow<'a, str>, ParseError> {
        self.expect(b'"')?;
        let b = self.b;
        let start = self.i;
        let mut i = start;
        while i < b.len() && b[i] != b'"' && b[i] != b'\\' {
            i += 1;
        }
        if i >= b.len() {
            self.i = i;
            return Err(self.err(ParseErrorKind::UnexpectedEnd));
        }
        if b[i] == b'"' {
            self.i = i + 1;
            return std::str::from_utf8(&b[start..i])
                .map(Cow::Borrowed)
                .map_err(|_| self.err(ParseErrorKind::BadString));
        }
        // Escaped string: decode into a buffer.
        let mut out: Vec<u8> = b[start..i].to_vec();
        loop {
            let Some(&c) = b.get(i) else {
                self.i = i;
                return Err(self.err(ParseErrorKind::UnexpectedEnd));
            };
            i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let Some(&esc) = b.get(i) else {
                        self.i = i;
                        return Err(self.err(ParseErrorKind::UnexpectedEnd));
                    };
                    i += 1;
                    match esc {
                        b'"' => out.push(b'"'),
                        b'\\' => out.push(b'\\'),
                        b'/' => out.push(b'/'),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => {
                            self.i = i;
                            let ch = self.unicode_escape()?;
                            i = self.i;
                            let mut tmp = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut tmp).as_bytes());
                        }
                        _ => {
                            self.i = i;
                            return Err(self.err(ParseErrorKind::BadString));
                        }
                    }
                }
                _ => out.push(c),
            }
        }
        self.i = i;
        String::from_utf8(out)
            .map(Cow::Owned)
            .map_err(|_| self.err(ParseErrorKind::BadString))
    }

    /// After `\u`: four hex digits, and a low surrogate if the first is high.
    fn unicode_escape(&mut self) -> Result<char, ParseError> {
        let hex4 = |p: &mut Parser<'_>| -> Result<u32, ParseError> {
            let s =
                p.b.get(p.i..p.i + 4)
                    .ok_or(p.err(ParseErrorKind::BadString))?;
            let s = std::str::from_utf8(s).map_err(|_| p.err(ParseErrorKind::BadString))?;
            let v = u32::from_str_radix(s, 16).map_err(|_| p.err(ParseErrorKind::BadString))?;
            p.i += 4;
            Ok(v)
        };
        let hi = hex4(self)?;
        let code = if (0xD800..0xDC00).contains(&hi) {
            if self.b.get(self.i..self.i + 2) != Some(b"\\u") {
                return Err(self.err(ParseErrorKind::BadString));
            }
            self.i += 2;
            let lo = hex4(self)?;
            if !(0xDC00..0xE000).contains(&lo) {
                return Err(self.err(ParseErrorKind::BadString));
            }
            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
        } else {
            hi
        };
        char::from_u32(code).ok_or_else(|| self.err(ParseErrorKind::BadString))
    }

    fn literal(&mut self, lit: &[u8]) -> Result<(), ParseError> {
        if self.b.get(self.i..self.i + lit.len()) == Some(lit) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(self.err(ParseErrorKind::UnexpectedByte(self.b[self.i])))
        }
    }

    /// A JSON number, as `f64`.
    #[inline]
    fn number(&mut self) -> Result<f64, ParseError> {
        self.number_raw()
            .ok_or_else(|| self.err(ParseErrorKind::BadNumber))
    }

    /// A JSON number, as `f64`; `None` (with `self.i` at the problem) if malformed.
    /// Kept free of the large error type so the hot loop stays small.
    #[inline(always)]
    fn number_raw(&mut self) -> Option<f64> {
        match number::scan(self.b, self.i) {
            Ok(d) => {
                self.i = d.end;
                number::to_f64(self.b, &d)
            }
            Err(at) => {
                self.i = at;
                None
            }
        }
    }

    /// A JSON number rounded to `f32` exactly as `str::parse::<f64>()` then
    /// `as f32` would; `None` (with `self.i` at the problem) if malformed.
    #[inline(always)]
    fn number_f32(&mut self) -> Option<f32> {
        match number::scan(self.b, self.i) {
            Ok(d) => {
                self.i = d.end;
                number::to_f32(self.b, &d)
            }
            Err(at) => {
                self.i = at;
                None
            }
        }
    }

    /// One array element: a number, `null` (NaN) or a numeric string (`"NaN"`).
    /// Out of line: the hot loop of [`Self::row`] handles plain numbers itself.
    #[inline(never)]
    fn scalar(&mut self, c: u8) -> Result<f32, ParseError> {
        match c {
            b'-' | b'0'..=b'9' => self
                .number_f32()
                .ok_or_else(|| self.err(ParseErrorKind::BadNumber)),
            b'n' => {
                self.literal(b"null")?;
                Ok(f32::NAN)
            }
            b'"' => {
                let at = self.i;
                let s = self.string()?;
                s.trim()
                    .parse::<f64>()
                    .map(|v| v as f32)
                    .map_err(|_| ParseError {
                        field: self.field.map(str::to_owned),
                        offset: at,
                        kind: ParseErrorKind::BadNumber,
                    })
            }
            _ => Err(self.err(ParseErrorKind::WrongType("number, null or \"NaN\""))),
        }
    }

    /// Elements of a flat array after its `[`, through its `]`, appended to `out`.
    #[inline]
    fn row(&mut self, out: &mut Vec<f32>) -> Result<usize, ParseError> {
        let before = out.len();
        if self.peek()? == b']' {
            self.i += 1;
            return Ok(0);
        }
        loop {
            // Hot path: a number, then `,` or `]` after optional spaces.
            let c = match self.b.get(self.i) {
                Some(&c) if c > b' ' => c,
                _ => self.peek()?,
            };
            let v = if c == b'-' || c.is_ascii_digit() {
                match self.number_f32() {
                    Some(v) => v,
                    None => return Err(self.err(ParseErrorKind::BadNumber)),
                }
            } else {
                self.scalar(c)?
            };
            out.push(v);
            // `, ` (Python's separator) or `,` without a call to `peek`.
            if self.b.get(self.i) == Some(&b',') {
                self.i += if self.b.get(self.i + 1) == Some(&b' ') {
                    2
                } else {
                    1
                };
                continue;
            }
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Ok(out.len() - before);
                }
                c => return Err(self.err(ParseErrorKind::UnexpectedByte(c))),
            }
        }
    }

    /// `[x, ...]` (1-D) or `[[x, ...], ...]` (2-D, rows of equal length).
    fn array_1d_or_2d(&mut self) -> Result<FieldArray, ParseError> {
        if self.peek()? != b'[' {
            return Err(self.err(ParseErrorKind::WrongType("array")));
        }
        self.i += 1;
        let mut data = Vec::new();
        if self.peek()? != b'[' {
            let n = self.row(&mut data)?;
            return Ok(FieldArray::new(&[n], data));
        }
        let mut rows = 0;
        let mut cols = 0;
        loop {
            self.expect(b'[')?;
            let n = self.row(&mut data)?;
            if rows == 0 {
                cols = n;
                data.reserve(n * 3);
            } else if n != cols {
                return Err(self.err(ParseErrorKind::Ragged));
            }
            rows += 1;
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    break;
                }
                c => return Err(self.err(ParseErrorKind::UnexpectedByte(c))),
            }
        }
        Ok(FieldArray::new(&[rows, cols], data))
    }

    fn skip_value(&mut self, depth: usize) -> Result<(), ParseError> {
        if depth > MAX_DEPTH {
            return Err(self.err(ParseErrorKind::WrongType("less deeply nested value")));
        }
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => {
                self.i += 1;
                if self.peek()? == b'}' {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.string()?;
                    self.expect(b':')?;
                    self.skip_value(depth + 1)?;
                    match self.peek()? {
                        b',' => self.i += 1,
                        b'}' => {
                            self.i += 1;
                            return Ok(());
                        }
                        c => return Err(self.err(ParseErrorKind::UnexpectedByte(c))),
                    }
                }
            }
            b'[' => {
                self.i += 1;
                if self.peek()? == b']' {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.skip_value(depth + 1)?;
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Ok(());
                        }
                        c => return Err(self.err(ParseErrorKind::UnexpectedByte(c))),
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ReadError;

    fn hourly() -> Freq {
        "h".parse().unwrap()
    }

    #[test]
    fn split_lines_is_split_on_newlines() {
        for text in [
            &b""[..],
            b"\n",
            b"a",
            b"a\n",
            b"a\nb",
            b"\n\na\n\nbc\n",
            b"{\"x\": 1}\r\n{}\n\n",
        ] {
            let want: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
            assert_eq!(split_lines(text).collect::<Vec<_>>(), want, "{text:?}");
        }
    }

    #[test]
    fn numbers_are_rounded_like_numpy() {
        let cases = [
            "0",
            "-0",
            "1",
            "-1.5",
            "3.14159",
            "1e10",
            "1E-7",
            "2.5e+3",
            "123456789012345678",
            "0.1",
            "1.7976931348623157e308",
            "5e-324",
            "9007199254740993",
            "0.30000000000000004",
            "123.456e-20",
            "1e400",
            "-1e-400",
            "1234567.8901234567",
        ];
        for c in cases {
            let line = format!(r#"{{"start":"2020-01-01","target":[{c}]}}"#);
            let e = parse_entry(line.as_bytes(), hourly()).unwrap();
            let want = c.parse::<f64>().unwrap() as f32;
            let got = e.get("target").unwrap().data()[0];
            assert_eq!(got.to_bits(), want.to_bits(), "{c}");
        }
    }

    #[test]
    fn two_d_targets_and_features() {
        let line = br#"{"start":"2020-01-01","target":[[1,2,3],[4,null,6]],"feat_dynamic_real":[[0.5,0.5,0.5]],"feat_static_cat":[3],"extra":{"a":[1,{"b":"\u00e9"}],"c":true}}"#;
        let e = parse_entry(line, hourly()).unwrap();
        let t = e.get("target").unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert!(t.data()[4].is_nan());
        assert_eq!(e.get("feat_dynamic_real").unwrap().shape(), &[1, 3]);
        assert_eq!(e.get("feat_static_cat").unwrap().data(), &[3.0]);
        assert!(!e.contains("extra"));
    }

    #[test]
    fn errors_name_field_and_line() {
        let bad = [
            (
                &br#"{"start":"2020-01-01","target":[1,2,}"#[..],
                Some("target"),
            ),
            (br#"{"start":"2020-13-01","target":[1]}"#, Some("start")),
            (
                br#"{"start":"2020-01-01","target":[[1,2],[3]]}"#,
                Some("target"),
            ),
            (
                br#"{"start":"2020-01-01","target":[1,"x"]}"#,
                Some("target"),
            ),
            (br#"{"start":"2020-01-01"}"#, Some("target")),
            (br#"{"start":"2020-01-01","target":[1]} x"#, None),
            (
                br#"{"start":"2020-01-01","target":[1], "feat_dynamic_real":[1,2]}"#,
                Some("feat_dynamic_real"),
            ),
            (br#"{"start":"2020-01-01","target":[1.]}"#, Some("target")),
        ];
        for (line, field) in bad {
            let err = parse_entry(line, hourly()).unwrap_err();
            assert_eq!(
                err.field.as_deref(),
                field,
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        let text = b"{\"start\":\"2020-01-01\",\"target\":[1]}\n\n{\"start\":\"2020-01-01\",\"target\":[}\n";
        let err = parse_lines(text, hourly()).unwrap_err();
        assert!(matches!(err, ReadError::Parse { line: 3, .. }), "{err}");
        assert!(err.to_string().contains(":3: field \"target\""), "{err}");
    }
}
