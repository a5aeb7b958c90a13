//! The dataset generator: deterministic, lengths in range, missing values present.

use shmpipe_timeseries::jsonl::parse_lines;
use shmpipe_timeseries::synth::{GenConfig, to_bytes};
use shmpipe_timeseries::{Freq, FreqUnit};

#[test]
fn generator_is_deterministic_and_respects_its_config() {
    let cfg = GenConfig {
        num_series: 200,
        min_len: 30,
        max_len: 90,
        missing_prob: 0.1,
        num_categories: 4,
        seed: 11,
        ..GenConfig::default()
    };
    let a = to_bytes(&cfg);
    assert_eq!(a, to_bytes(&cfg));
    assert_ne!(
        a,
        to_bytes(&GenConfig {
            seed: 12,
            ..cfg.clone()
        })
    );
    let text = String::from_utf8(a.clone()).unwrap();
    assert!(text.contains("null") && text.contains("\"NaN\""));
    let entries = parse_lines(&a, cfg.freq).unwrap();
    assert_eq!(entries.len(), 200);
    let (mut missing, mut total) = (0usize, 0usize);
    for (i, e) in entries.iter().enumerate() {
        let t = e.get("target").unwrap();
        assert!((30..=90).contains(&t.time_len()));
        missing += t.data().iter().filter(|v| v.is_nan()).count();
        total += t.time_len();
        assert_eq!(e.get("feat_static_cat").unwrap().data(), &[(i % 4) as f32]);
        assert_eq!(e.item_id.as_deref(), Some(format!("item_{i}").as_str()));
    }
    let frac = missing as f64 / total as f64;
    assert!((0.07..0.13).contains(&frac), "missing fraction {frac}");
}

#[test]
fn frequencies_print_and_parse_back() {
    for s in [
        "s", "15min", "h", "2h", "D", "W-SUN", "W-WED", "M", "3M", "Q-DEC", "Y-DEC",
    ] {
        let f: Freq = s.parse().unwrap();
        assert_eq!(f.to_string().parse::<Freq>().unwrap(), f, "{s}");
    }
    let aliases = [
        ("H", "h"),
        ("T", "min"),
        ("W", "W-SUN"),
        ("ME", "M"),
        ("A", "Y"),
    ];
    for (alias, canonical) in aliases {
        assert_eq!(
            alias.parse::<Freq>().unwrap(),
            canonical.parse::<Freq>().unwrap()
        );
    }
    assert_eq!("W-MON".parse::<Freq>().unwrap().unit, FreqUnit::Week(0));
}
