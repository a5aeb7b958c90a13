//! Throughput against size as an SVG: one line per transport, log scales; GB/s on the left,
//! messages/s on the right.

use std::path::Path;

use plotters::prelude::*;

use crate::BoxError;
use crate::report::Row;

/// Fixed colours, in order of first appearance of each transport.
const COLOURS: [RGBColor; 10] = [
    RGBColor(0, 0, 0),
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
];

/// Points `(elements, value)` of each transport, in row order, keeping positive values only.
pub fn series(rows: &[Row], value: impl Fn(&Row) -> f64) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut out: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let y = value(r);
        if !(y.is_finite() && y > 0.0) {
            continue;
        }
        let p = (r.elements as f64, y);
        match out.iter_mut().find(|(name, _)| *name == r.transport) {
            Some((_, pts)) => pts.push(p),
            None => out.push((r.transport.clone(), vec![p])),
        }
    }
    for (_, pts) in &mut out {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// A log axis range covering `values` with some margin.
fn log_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo.is_finite() && hi > 0.0 {
        lo / 2.0..hi * 2.0
    } else {
        1.0..10.0
    }
}

/// Axis tick label: SI suffix, no trailing zeros (`10`, `1.5 k`, `100 M`).
pub fn tick(v: f64) -> String {
    let s = crate::stats::Si(v).to_string();
    let (num, unit) = s.split_once(' ').map_or((s.as_str(), ""), |(n, u)| (n, u));
    let num = if num.contains('.') {
        num.trim_end_matches('0').trim_end_matches('.')
    } else {
        num
    };
    if unit.is_empty() {
        num.to_string()
    } else {
        format!("{num} {unit}")
    }
}

/// Colour of the `i`-th name: ten fixed colours, then evenly spread hues.
pub fn colour(i: usize) -> RGBColor {
    if let Some(c) = COLOURS.get(i) {
        return *c;
    }
    let k = i - COLOURS.len();
    let hue = (k as f64 * 0.381_966).fract(); // golden-ratio steps around the wheel
    let (r, g, b) = HSLColor(hue, 0.65, 0.42).rgb();
    RGBColor(r, g, b)
}

fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    data: &[(String, Vec<(f64, f64)>)],
    names: &[String],
) -> Result<(), BoxError> {
    let x = log_range(data.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)));
    let y = log_range(data.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)));
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x.log_scale(), y.log_scale())?;
    chart
        .configure_mesh()
        .x_desc("f32 elements per message")
        .y_desc(y_desc)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()?;
    for (name, pts) in data {
        let i = names.iter().position(|n| n == name).unwrap_or(0);
        let c = colour(i);
        chart.draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?;
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    }
    Ok(())
}

/// The legend strip: one coloured line and name per series.
fn legend(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    names: &[String],
) -> Result<(), BoxError> {
    let style = ("sans-serif", 14).into_font().color(&BLACK);
    for (i, name) in names.iter().enumerate() {
        let y = 60 + 22 * i as i32;
        let c = colour(i);
        area.draw(&PathElement::new(vec![(8, y), (36, y)], c.stroke_width(3)))?;
        area.draw(&Text::new(name.as_str(), (44, y - 8), style.clone()))?;
    }
    Ok(())
}

/// Draws `rows` to an SVG file at `path`; `title` goes on top (e.g. the placement seen).
///
/// # Errors
/// Drawing or file errors.
pub fn write_svg(path: &Path, title: &str, rows: &[Row]) -> Result<(), BoxError> {
    let mut names: Vec<String> = Vec::new();
    for r in rows {
        if !names.contains(&r.transport) {
            names.push(r.transport.clone());
        }
    }
    let legend_width = 60 + 8 * names.iter().map(String::len).max().unwrap_or(8) as u32;
    let root = SVGBackend::new(path, (1200 + legend_width, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let (charts, strip) = root.split_horizontally(1200);
    let (left, right) = charts.split_horizontally(600);
    let gb = series(rows, |r| r.gb_per_s);
    let msgs = series(rows, |r| r.msgs.median);
    panel(&left, "Throughput (payload)", "GB/s", &gb, &names)?;
    panel(&right, "Messages per second", "msgs/s", &msgs, &names)?;
    legend(&strip, &names)?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pingpong::Placement;
    use crate::stats::Summary;

    fn row(transport: &str, elements: usize, rate: f64) -> Row {
        Row {
            transport: transport.into(),
            elements,
            bytes: elements * 4,
            msgs: Summary::of(&[rate]).unwrap(),
            gb_per_s: rate * elements as f64 * 4.0 / 1e9,
            ratio_to_memcpy: None,
            ratio_to_channel: None,
            ratio_to_unix_socket: None,
            ratio_to_iceoryx2: None,
            pingpong_ns: 50.0,
            placement: Placement::Near,
        }
    }

    #[test]
    fn series_group_by_transport_sorted_by_size() {
        let rows = [
            row("pipe", 1000, 5.0),
            row("memcpy", 16, 9.0),
            row("pipe", 16, 7.0),
            row("memcpy", 1000, 0.0),
        ];
        let s = series(&rows, |r| r.msgs.median);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0], ("pipe".to_string(), vec![(16.0, 7.0), (1000.0, 5.0)]));
        assert_eq!(
            s[1],
            ("memcpy".to_string(), vec![(16.0, 9.0)]),
            "zero dropped on a log axis"
        );
    }

    #[test]
    fn colours_stay_distinct_past_the_fixed_ten() {
        let cs: Vec<RGBColor> = (0..20).map(colour).collect();
        for i in 0..cs.len() {
            for j in 0..i {
                assert_ne!(cs[i], cs[j], "colours {i} and {j}");
            }
        }
    }

    #[test]
    fn ticks_drop_trailing_zeros() {
        assert_eq!(tick(10.0), "10");
        assert_eq!(tick(1500.0), "1.5 k");
        assert_eq!(tick(100e6), "100 M");
        assert_eq!(tick(0.25), "0.25");
    }

    #[test]
    fn writes_an_svg_with_one_line_per_transport() {
        let dir = std::env::temp_dir().join(format!("shmpipe-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.svg");
        let rows = [
            row("memcpy", 16, 1e8),
            row("memcpy", 1_000_000, 1e4),
            row("shm-zero-copy", 16, 4e7),
            row("shm-zero-copy", 1_000_000, 9e3),
        ];
        let result = write_svg(&path, "test run", &rows);
        let text = std::fs::read_to_string(&path);
        std::fs::remove_dir_all(&dir).unwrap();
        result.unwrap();
        let text = text.unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..text.len().min(80)]);
        assert!(text.contains("shm-zero-copy") && text.contains("memcpy"));
        assert!(text.contains("<polyline"), "lines drawn");
    }
}
