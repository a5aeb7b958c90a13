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

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::entry::{Array, DataEntry, field};
use crate::error::{ParseError, ParseErrorKind, ReadError};
use crate::period::{Freq, Period};

/// Nesting limit for skipped values (protects the stack from hostile input).
const MAX_DEPTH: usize = 128;

/// Exact powers of ten representable in `f64`.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

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
        let mut target: Option<Array> = None;
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
            Array::zeros(&[0, 0])
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
        let d = self.scan_number()?;
        self.decimal_to_f64(&d)
    }

    /// A JSON number rounded to `f32` exactly as `str::parse::<f64>()` then
    /// `as f32` would: the hot path of every array element.
    #[inline(always)]
    fn number_f32(&mut self) -> Option<f32> {
        let d = self.scan_number()?;
        if d.ndig <= 18
            && (-22..=22).contains(&d.exp)
            && let Some(v) = decimal_to_f32(d.mant, d.exp)
        {
            return Some(if d.neg { -v } else { v });
        }
        self.decimal_to_f64(&d).map(|v| v as f32)
    }

    /// The decimal just scanned by [`Self::scan_number`] as a correctly rounded `f64`.
    #[inline(always)]
    fn decimal_to_f64(&self, d: &Decimal) -> Option<f64> {
        if d.ndig <= 15 && (-22..=22).contains(&d.exp) {
            // Clinger's fast path: `mant < 10^15 < 2^53` is exact, and so is
            // `10^|exp|`; one IEEE operation rounds correctly.
            let m = d.mant as f64;
            let v = if d.exp < 0 {
                m / POW10[(-d.exp) as usize]
            } else {
                m * POW10[d.exp as usize]
            };
            return Some(if d.neg { -v } else { v });
        }
        // More digits or a larger exponent: the standard parser rounds exactly.
        let text = std::str::from_utf8(&self.b[d.start..self.i]).ok()?;
        text.parse::<f64>().ok()
    }

    /// Scans a JSON number at `self.i` into its decimal parts and moves past it;
    /// `None` (with `self.i` at the problem) if malformed.
    #[inline(always)]
    fn scan_number(&mut self) -> Option<Decimal> {
        let b = self.b;
        let start = self.i;
        let mut i = start;
        let neg = b.get(i) == Some(&b'-');
        if neg {
            i += 1;
        }
        let mut mant: u64 = 0;
        let (next, ndig_int) = digits_short(b, i, &mut mant);
        if ndig_int == 0 {
            self.i = next;
            return None;
        }
        i = next;
        let mut ndig = ndig_int;
        let mut exp: i64 = 0;
        if b.get(i) == Some(&b'.') {
            let (next, nfrac) = digits(b, i + 1, &mut mant);
            if nfrac == 0 {
                self.i = next;
                return None;
            }
            i = next;
            ndig += nfrac;
            exp -= i64::from(nfrac);
        }
        if let Some(b'e' | b'E') = b.get(i) {
            i += 1;
            let eneg = match b.get(i) {
                Some(b'-') => {
                    i += 1;
                    true
                }
                Some(b'+') => {
                    i += 1;
                    false
                }
                _ => false,
            };
            let es = i;
            let mut e: i64 = 0;
            while let Some(&c) = b.get(i) {
                let d = c.wrapping_sub(b'0');
                if d > 9 {
                    break;
                }
                e = (e * 10 + i64::from(d)).min(1_000_000);
                i += 1;
            }
            if i == es {
                self.i = i;
                return None;
            }
            exp += if eneg { -e } else { e };
        }
        self.i = i;
        Some(Decimal {
            neg,
            mant,
            exp,
            ndig,
            start,
        })
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
    fn array_1d_or_2d(&mut self) -> Result<Array, ParseError> {
        if self.peek()? != b'[' {
            return Err(self.err(ParseErrorKind::WrongType("array")));
        }
        self.i += 1;
        let mut data = Vec::new();
        if self.peek()? != b'[' {
            let n = self.row(&mut data)?;
            return Ok(Array::new(&[n], data));
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
        Ok(Array::new(&[rows, cols], data))
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

/// A scanned JSON number: `(-1)^neg * mant * 10^exp`, `ndig` digits (the
/// mantissa is exact while `ndig <= 19`), its text starting at `start`.
struct Decimal {
    neg: bool,
    mant: u64,
    exp: i64,
    ndig: u32,
    start: usize,
}

/// `10^-k` rounded to the nearest `f64`.
const NEG_POW10: [f64; 23] = [
    1e0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-11, 1e-12, 1e-13, 1e-14,
    1e-15, 1e-16, 1e-17, 1e-18, 1e-19, 1e-20, 1e-21, 1e-22,
];

/// How close (in units of the last place of `f64`) the estimate in
/// [`decimal_to_f32`] may come to an `f32` rounding boundary before it defers.
const F32_MARGIN: u64 = 16;

/// `mant * 10^exp` (`mant < 10^18`, `|exp| <= 22`) rounded as the standard
/// library's `f64` parse followed by `as f32`, or `None` when this shortcut
/// cannot prove it (about one number in 2^24: then the caller parses exactly).
///
/// Why it is exact: the estimate `x~ = f64(mant) * f64(10^exp)` takes three
/// roundings, so `|x~ - x| <= 3u|x|` (u = 2^-53), and the correctly rounded
/// `f64(x)` is within `u|x|` of `x`: `x~` and `f64(x)` are less than 4 units in
/// the last place (ulp) of `x~` apart. Rounding an `f64` to `f32` drops its
/// 29 low mantissa bits and changes direction only at the midpoints between
/// two `f32`s, whose 29 low bits are exactly `1 << 28`. If those bits of `x~`
/// are more than [`F32_MARGIN`] ulps away from `1 << 28`, no midpoint lies
/// between `x~` and `f64(x)`, so both round to the same `f32`. (Near a power of
/// two, where the ulp changes size, the low bits are near 0 or `2^29`: an
/// `f32` value, not a midpoint.) Results outside `f32`'s normal range are
/// deferred too.
#[inline(always)]
fn decimal_to_f32(mant: u64, exp: i64) -> Option<f32> {
    if mant == 0 {
        return Some(0.0);
    }
    // `mant < 10^18 < 2^63`: the signed conversion (one instruction on x86-64,
    // where the unsigned one takes four) is exact-then-rounded the same way.
    let m = mant as i64 as f64;
    let x = if exp < 0 {
        m * NEG_POW10[(-exp) as usize]
    } else {
        m * POW10[exp as usize]
    };
    let low = x.to_bits() & ((1 << 29) - 1);
    let normal = (f64::from(f32::MIN_POSITIVE) * 2.0..f64::from(f32::MAX) * 0.5).contains(&x);
    if low.abs_diff(1 << 28) <= F32_MARGIN || !normal {
        return None;
    }
    Some(x as f32)
}

/// Integer powers of ten for folding digit groups into a mantissa.
const POW10_U64: [u64; 9] = [
    1,
    10,
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
];

/// Reads the run of ASCII digits at `b[i..]`, folding it into `mant`
/// (`mant = mant * 10^k + value`, wrapping: only used while the digit count is
/// small enough for the fast path). Returns the end of the run and its length.
///
/// Eight bytes at a time (SWAR): one word load finds how many leading bytes are
/// digits and converts them with three multiplications, the technique of
/// simdjson's `parse_eight_digits_unrolled`.
#[inline(always)]
fn digits(b: &[u8], mut i: usize, mant: &mut u64) -> (usize, u32) {
    let mut count = 0u32;
    // Two words at a time: the second load does not wait for the first word's
    // digit count, which shortens the dependency chain of long fractions.
    while let Some(chunk) = b.get(i..i + 16) {
        let (t1, k1) = digit_run(u64::from_le_bytes(chunk[..8].try_into().expect("8 bytes")));
        let (t2, k2) = digit_run(u64::from_le_bytes(chunk[8..].try_into().expect("8 bytes")));
        if k1 < 8 {
            if k1 > 0 {
                *mant = fold(*mant, t1, k1);
            }
            return (i + k1 as usize, count + k1);
        }
        *mant = fold(*mant, t1, 8);
        if k2 > 0 {
            *mant = fold(*mant, t2, k2);
        }
        count += 8 + k2;
        i += 8 + k2 as usize;
        if k2 < 8 {
            return (i, count);
        }
    }
    while let Some(chunk) = b.get(i..i + 8) {
        let (t, k) = digit_run(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        if k > 0 {
            *mant = fold(*mant, t, k);
        }
        count += k;
        i += k as usize;
        if k < 8 {
            return (i, count);
        }
    }
    while let Some(&c) = b.get(i) {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        *mant = mant.wrapping_mul(10).wrapping_add(u64::from(d));
        count += 1;
        i += 1;
    }
    (i, count)
}

/// [`digits`] for runs that are usually short (integer parts): one word at a time.
#[inline(always)]
fn digits_short(b: &[u8], i: usize, mant: &mut u64) -> (usize, u32) {
    if let Some(chunk) = b.get(i..i + 8) {
        let (t, k) = digit_run(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        if k < 8 {
            if k > 0 {
                *mant = fold(*mant, t, k);
            }
            return (i + k as usize, k);
        }
    }
    digits(b, i, mant)
}

/// For eight bytes `v` (first byte lowest): the bytes minus `'0'` and how many
/// leading bytes are ASCII digits.
#[inline(always)]
fn digit_run(v: u64) -> (u64, u32) {
    // A borrow can only come from a byte below '0', a non-digit, and only moves
    // into later bytes: every byte up to and including the first non-digit is
    // exact, which is all that is used.
    let t = v.wrapping_sub(0x3030_3030_3030_3030);
    // High bit of each byte above 9 (wrapped bytes already have it; 10..=0x7F
    // get it from + 0x76; digits 0..=9 reach at most 0x7F, without carry).
    let nz = (t | t.wrapping_add(0x7676_7676_7676_7676)) & 0x8080_8080_8080_8080;
    // `trailing_zeros(0) == 64`: eight digits.
    (t, nz.trailing_zeros() / 8)
}

/// `mant * 10^k + (the first k digit values of t)`, wrapping; `1 <= k <= 8`.
#[inline(always)]
fn fold(mant: u64, t: u64, k: u32) -> u64 {
    // Digit values in the top `k` bytes (first digit lowest), zeros below.
    let d = t << (8 * (8 - k));
    mant.wrapping_mul(POW10_U64[k as usize])
        .wrapping_add(eight_digits(d))
}

/// Value of eight digit values packed little-endian (first digit in the lowest byte).
#[inline(always)]
fn eight_digits(v: u64) -> u64 {
    // Pairs: byte 2j holds 10 * d(2j) + d(2j+1).
    let v = (v.wrapping_mul(10) + (v >> 8)) & 0x00FF_00FF_00FF_00FF;
    // Quads and then the whole number.
    let v = (v.wrapping_mul(100) + (v >> 16)) & 0x0000_FFFF_0000_FFFF;
    (v.wrapping_mul(10_000) + (v >> 32)) & 0xFFFF_FFFF
}

/// Iterates over the entries of a JSON-lines stream.
///
/// Blank lines are skipped. After an error the iterator continues with the next
/// line, so a caller can choose to fail on the first error or skip and count.
#[derive(Debug)]
pub struct JsonLinesReader<R> {
    reader: R,
    freq: Freq,
    path: PathBuf,
    line: u64,
    buf: Vec<u8>,
    bytes: u64,
}

impl JsonLinesReader<BufReader<File>> {
    /// Opens a file.
    ///
    /// # Errors
    /// [`ReadError::Io`] if it cannot be opened.
    pub fn open(path: impl AsRef<Path>, freq: Freq) -> Result<Self, ReadError> {
        let path = path.as_ref().to_path_buf();
        let f = File::open(&path).map_err(|source| ReadError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(JsonLinesReader::new(
            BufReader::with_capacity(1 << 20, f),
            freq,
            path,
        ))
    }
}

impl<R: BufRead> JsonLinesReader<R> {
    /// Reads from any buffered reader; `path` is used in error messages only.
    pub fn new(reader: R, freq: Freq, path: impl Into<PathBuf>) -> Self {
        JsonLinesReader {
            reader,
            freq,
            path: path.into(),
            line: 0,
            buf: Vec::with_capacity(1 << 16),
            bytes: 0,
        }
    }

    /// Bytes consumed so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }
}

impl<R: BufRead> Iterator for JsonLinesReader<R> {
    type Item = Result<DataEntry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            // Fast path: a whole line in the reader's buffer is parsed in place.
            let avail = match self.reader.fill_buf() {
                Ok(avail) => avail,
                Err(source) => {
                    return Some(Err(ReadError::Io {
                        path: self.path.clone(),
                        source,
                    }));
                }
            };
            if avail.is_empty() {
                return None;
            }
            if let Some(p) = memchr::memchr(b'\n', avail) {
                let line = &avail[..p];
                self.bytes += p as u64 + 1;
                self.line += 1;
                let parsed = (!line.iter().all(u8::is_ascii_whitespace)).then(|| {
                    parse_entry(line, self.freq).map_err(|source| ReadError::Parse {
                        path: self.path.clone(),
                        line: self.line,
                        source,
                    })
                });
                self.reader.consume(p + 1);
                match parsed {
                    Some(r) => return Some(r),
                    None => continue,
                }
            }
            // The line continues past the buffer (or is the last, without `\n`).
            self.buf.clear();
            match self.reader.read_until(b'\n', &mut self.buf) {
                Ok(0) => return None,
                Ok(n) => {
                    self.bytes += n as u64;
                    self.line += 1;
                }
                Err(source) => {
                    return Some(Err(ReadError::Io {
                        path: self.path.clone(),
                        source,
                    }));
                }
            }
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Some(
                parse_entry(&self.buf, self.freq).map_err(|source| ReadError::Parse {
                    path: self.path.clone(),
                    line: self.line,
                    source,
                }),
            );
        }
    }
}

/// The lines of `bytes` without their `\n`, exactly as `bytes.split(|&b| b == b'\n')`
/// (so a trailing newline gives a last empty line), with a vectorized newline search:
/// a byte-by-byte split costs about as much as parsing a line of numbers.
pub fn split_lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(bytes);
    std::iter::from_fn(move || {
        let r = rest?;
        match memchr::memchr(b'\n', r) {
            Some(p) => {
                rest = Some(&r[p + 1..]);
                Some(&r[..p])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

/// Parses every line of an in-memory JSON-lines buffer.
///
/// # Errors
/// The first malformed line, as [`ReadError::Parse`] with an empty path.
pub fn parse_lines(bytes: &[u8], freq: Freq) -> Result<Vec<DataEntry>, ReadError> {
    JsonLinesReader::new(bytes, freq, "").collect()
}

/// Reads a whole JSON-lines file.
///
/// # Errors
/// [`ReadError`] for the first unreadable or malformed line.
pub fn read_file(path: impl AsRef<Path>, freq: Freq) -> Result<Vec<DataEntry>, ReadError> {
    JsonLinesReader::open(path, freq)?.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hourly() -> Freq {
        "h".parse().unwrap()
    }

    #[test]
    fn swar_digits_match_a_simple_loop() {
        let cases = [
            "0",
            "7",
            "12",
            "123",
            "1234",
            "12345",
            "123456",
            "1234567",
            "12345678",
            "123456789",
            "9876543210123",
            "00012",
            "5x",
            "12345678,",
            "1/",
            "9:",
            "99999999",
            "12\u{e9}3",
            "1234567\u{e9}",
            "7\u{0}",
            "123 ",
            "0.5",
            "5-",
            "123456789012345",
            "1234567890123456",
            "12345678901234567",
            "1234567890123456789",
            "0000000000000000123",
            "123456789a12345678",
            "12345678901234\u{e9}",
        ];
        for c in cases {
            for pad in ["", "]", ", 1.5]", "        ", ", 123.456, 789.0123]"] {
                let text = format!("{c}{pad}");
                for f in [digits, digits_short] {
                    let mut m = 0u64;
                    let (end, n) = f(text.as_bytes(), 0, &mut m);
                    let run = text.bytes().take_while(u8::is_ascii_digit).count();
                    assert_eq!((end, n as usize), (run, run), "{text:?}");
                    let want = text[..run].parse::<u64>().unwrap_or(0);
                    assert_eq!(m, want, "{text:?}");
                }
            }
        }
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
