//! Parsers of command-line values: element counts, byte counts and durations.

use std::time::Duration;

/// Parses `16`, `1_000`, `100k`, `1M`, `10m` into a count of elements.
///
/// # Errors
/// A message naming the bad input (also for 0 and above [`crate::kernel::MAX_ELEMENTS`]).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().replace('_', "");
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000),
        Some((i, 'm' | 'M')) => (&t[..i], 1_000_000),
        _ => (t.as_str(), 1),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a size (examples: 16, 1000, 100k, 1M)"))?;
    let n = n
        .checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))?;
    if n == 0 {
        return Err("a size must be at least 1 element".into());
    }
    if n > crate::kernel::MAX_ELEMENTS {
        return Err(format!(
            "`{s}` exceeds the {} elements the checked sum supports",
            crate::kernel::MAX_ELEMENTS
        ));
    }
    Ok(n)
}

/// Parses a byte count: `65536`, `64k` (KiB), `1M` (MiB).
///
/// # Errors
/// A message naming the bad input (also for 0).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim().replace('_', "");
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1usize << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        _ => (t.as_str(), 1),
    };
    match digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
    {
        Some(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "`{s}` is not a byte count (examples: 65536, 64k, 1M)"
        )),
    }
}

/// [`parse_duration`], also accepting `0` (off).
///
/// # Errors
/// As [`parse_duration`].
pub fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    if s.trim().trim_end_matches(['m', 's']).trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_duration(s)
}

/// Parses `0.3` (seconds), `300ms`, `2s` into a duration.
///
/// # Errors
/// A message naming the bad input (also for zero and negative durations).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(ms) = t.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(sec) = t.strip_suffix('s') {
        (sec, 1.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (examples: 0.3, 300ms, 1s)"))?;
    let secs = v * scale;
    if !(secs.is_finite() && secs > 0.0 && secs <= 3600.0) {
        return Err(format!("`{s}` must be between 0 and an hour"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_suffixes_and_separators() {
        assert_eq!(parse_size("16"), Ok(16));
        assert_eq!(parse_size("1_000"), Ok(1000));
        assert_eq!(parse_size("100k"), Ok(100_000));
        assert_eq!(parse_size("1M"), Ok(1_000_000));
        assert_eq!(parse_size(" 10m "), Ok(10_000_000));
        assert!(parse_size("0").is_err());
        assert!(parse_size("abc").is_err());
        assert!(parse_size("1G").is_err());
        assert!(parse_size("100M").unwrap_err().contains("exceeds"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0.3"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("fast").is_err());
    }
}
