//! The hand-written parser against the standard library and `serde_json`.

use proptest::prelude::*;
use shmpipe_timeseries::jsonl::{parse_entry, parse_lines};
use shmpipe_timeseries::serde_reader::parse_entry_serde;
use shmpipe_timeseries::synth::{GenConfig, to_bytes};
use shmpipe_timeseries::{Freq, ReadError};

fn hourly() -> Freq {
    "h".parse().unwrap()
}

/// Parses a record whose target is `texts` joined by `sep` and checks each value against the
/// standard library's parse (through `f64`, then to `f32`), bit for bit.
fn parses_like_the_standard_library(texts: &[String], sep: &str) -> Result<(), TestCaseError> {
    let line = format!(r#"{{"start":"2020-01-01","target":[{}]}}"#, texts.join(sep));
    let e = parse_entry(line.as_bytes(), hourly()).unwrap();
    let got = e.get("target").unwrap().data();
    prop_assert_eq!(got.len(), texts.len());
    for (g, t) in got.iter().zip(texts) {
        let want = t.parse::<f64>().unwrap() as f32;
        prop_assert_eq!(g.to_bits(), want.to_bits(), "{}", t);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every number rounds exactly as `str::parse::<f64>()` followed by `as f32`
    /// (numpy's `asarray(json_floats, dtype=float32)`).
    #[test]
    fn numbers_round_like_the_standard_library(
        v in prop::collection::vec((any::<f64>(), 0usize..20, any::<bool>()), 1..40),
    ) {
        let texts: Vec<String> = v
            .iter()
            .filter(|(x, _, _)| x.is_finite())
            .map(|(x, prec, sci)| if *sci { format!("{x:.prec$e}") } else { format!("{x:.prec$}") })
            .collect();
        parses_like_the_standard_library(&texts, ",")?;
    }

    /// Numbers within a few `f64` ulps of a midpoint between two `f32`s (where
    /// rounding through `f64` and straight to `f32` can differ, and where a fast
    /// estimate must defer to the exact parse), written as Python's `json` writes
    /// float64 (shortest round-trip text, 16-17 digits) and cut to fewer digits.
    #[test]
    fn numbers_near_f32_midpoints_round_like_the_standard_library(
        bits in any::<u32>(),
        steps in prop::collection::vec(-40i64..=40, 1..30),
        cut in 8usize..20,
    ) {
        let a = f32::from_bits(bits & 0x7F7F_FFFF); // finite, exponent below the top
        let b = f32::from_bits(a.to_bits() + 1);
        let mid = (f64::from(a) + f64::from(b)) / 2.0; // exact in f64
        let mut texts = Vec::new();
        for k in &steps {
            let x = f64::from_bits((mid.to_bits() as i64 + k) as u64);
            texts.push(format!("{x}"));
            texts.push(format!("{x:e}"));
            texts.push(format!("{x:.cut$e}"));
            texts.push(format!("-{x:.cut$e}"));
        }
        parses_like_the_standard_library(&texts, ", ")?;
    }

    /// Arbitrary bytes never panic: they parse or give an error.
    #[test]
    fn garbage_is_an_error_not_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_entry(&bytes, hourly());
        let mut line = br#"{"start":"2020-01-01","target":["#.to_vec();
        line.extend_from_slice(&bytes);
        let _ = parse_entry(&line, hourly());
    }
}

#[test]
fn hand_written_and_serde_readers_agree_on_generated_data() {
    let g = GenConfig {
        num_series: 60,
        min_len: 0,
        max_len: 300,
        missing_prob: 0.2,
        ..GenConfig::default()
    };
    let data = to_bytes(&g);
    for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let a = parse_entry(line, g.freq).unwrap();
        let b = parse_entry_serde(line, g.freq).unwrap();
        assert_eq!(a.item_id, b.item_id);
        assert_eq!(a.start, b.start);
        let names: Vec<&str> = a.fields().map(|(n, _)| n).collect();
        assert_eq!(names, b.fields().map(|(n, _)| n).collect::<Vec<_>>());
        for (n, x) in a.fields() {
            let y = b.get(n).unwrap();
            assert_eq!(x.shape(), y.shape());
            for (p, q) in x.data().iter().zip(y.data()) {
                assert!(
                    p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                    "{n}: {p} {q}"
                );
            }
        }
    }
}

#[test]
fn read_errors_name_the_line() {
    let text = b"{\"start\":\"2020-01-01\",\"target\":[1]}\n{\"start\":\"2020-01-01\",\"target\":[1, 2,, 3]}\n";
    match parse_lines(text, hourly()) {
        Err(ReadError::Parse { line, source, .. }) => {
            assert_eq!(line, 2);
            assert_eq!(source.field.as_deref(), Some("target"));
        }
        other => panic!("{other:?}"),
    }
}

/// Lines parsed in place in the reader's buffer and lines that straddle its end
/// (copied) give the same entries, line numbers, errors and byte counts.
#[test]
fn reader_gives_the_same_entries_whatever_its_buffer_size() {
    use shmpipe_timeseries::jsonl::JsonLinesReader;
    use std::io::BufReader;
    let g = GenConfig {
        num_series: 30,
        min_len: 0,
        max_len: 40,
        missing_prob: 0.2,
        ..GenConfig::default()
    };
    let mut data = to_bytes(&g);
    // Blank lines, CRLF, a bad line and a last line without newline.
    data.extend_from_slice(b"\n  \n{\"start\":\"2020-01-01\",\"target\":[1,2]}\r\n");
    data.extend_from_slice(b"{\"start\":\"2020-01-01\",\"target\":[1,,2]}\n");
    data.extend_from_slice(b"{\"start\":\"2020-01-01\",\"target\":[3]}");
    let show = |r: &Result<shmpipe_timeseries::DataEntry, ReadError>| match r {
        Ok(e) => format!("{e:?}"),
        Err(e) => e.to_string(),
    };
    let want: Vec<String> = JsonLinesReader::new(&data[..], hourly(), "x")
        .map(|r| show(&r))
        .collect();
    assert_eq!(want.len(), 30 + 3);
    assert!(want[31].contains("x:34:"), "{}", want[31]);
    for cap in [1, 7, 64, 1000, 1 << 20] {
        let mut r = JsonLinesReader::new(BufReader::with_capacity(cap, &data[..]), hourly(), "x");
        let got: Vec<String> = r.by_ref().map(|r| show(&r)).collect();
        assert_eq!(got, want, "capacity {cap}");
        assert_eq!(r.bytes_read(), data.len() as u64, "capacity {cap}");
    }
}
