//! Numbers of the JSON-lines reader: digits eight bytes at a time and rounding
//! straight to `f32` (see [`decimal_to_f32`] for why it is exact).

/// Exact powers of ten representable in `f64`.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// A scanned JSON number: `(-1)^neg * mant * 10^exp`, `ndig` digits (the
/// mantissa is exact while `ndig <= 19`), its text `start..end`.
pub(super) struct Decimal {
    neg: bool,
    mant: u64,
    exp: i64,
    ndig: u32,
    /// Neither a fraction nor an exponent (Python's `json` reads an `int`).
    int: bool,
    start: usize,
    /// Just past the number.
    pub(super) end: usize,
}

impl Decimal {
    /// Whether the number has neither a fraction nor an exponent (Python's `json`
    /// reads it as an `int`), and how many digits it has.
    pub(super) fn integer_digits(&self) -> Option<u32> {
        self.int.then_some(self.ndig)
    }

    /// Whether the integer part has a superfluous leading zero (`01`), which JSON forbids.
    pub(super) fn leading_zero(&self, b: &[u8]) -> bool {
        let d = self.start + usize::from(self.neg);
        b.get(d) == Some(&b'0') && b.get(d + 1).is_some_and(u8::is_ascii_digit)
    }
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

/// Scans the JSON number at `b[start..]` into its decimal parts (`end` is
/// just past it); `Err` with the position of the problem if malformed.
#[inline(always)]
pub(super) fn scan(b: &[u8], start: usize) -> Result<Decimal, usize> {
    let mut i = start;
    let neg = b.get(i) == Some(&b'-');
    if neg {
        i += 1;
    }
    let mut mant: u64 = 0;
    let (next, ndig_int) = digits_short(b, i, &mut mant);
    if ndig_int == 0 {
        return Err(next);
    }
    i = next;
    let mut ndig = ndig_int;
    let mut exp: i64 = 0;
    let int = !matches!(b.get(i), Some(b'.' | b'e' | b'E'));
    if b.get(i) == Some(&b'.') {
        let (next, nfrac) = digits(b, i + 1, &mut mant);
        if nfrac == 0 {
            return Err(next);
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
            return Err(i);
        }
        exp += if eneg { -e } else { e };
    }
    Ok(Decimal {
        neg,
        mant,
        exp,
        ndig,
        int,
        start,
        end: i,
    })
}

/// The scanned decimal `d` of `b` as a correctly rounded `f64`.
#[inline(always)]
pub(super) fn to_f64(b: &[u8], d: &Decimal) -> Option<f64> {
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
    let text = std::str::from_utf8(&b[d.start..d.end]).ok()?;
    text.parse::<f64>().ok()
}

/// The scanned decimal `d` of `b` rounded to `f32` exactly as
/// `str::parse::<f64>()` then `as f32` would: the hot path of every array element.
#[inline(always)]
pub(super) fn to_f32(b: &[u8], d: &Decimal) -> Option<f32> {
    if d.ndig <= 18
        && (-22..=22).contains(&d.exp)
        && let Some(v) = decimal_to_f32(d.mant, d.exp)
    {
        return Some(if d.neg { -v } else { v });
    }
    to_f64(b, d).map(|v| v as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
