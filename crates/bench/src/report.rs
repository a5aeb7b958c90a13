//! Rows of results: ratios, CSV, the terminal table and the goals check.

use std::fmt::Write as _;
use std::io::{self, Write};

use crate::goals::Goal;
use crate::pingpong::Placement;
use crate::runner::RunResult;
use crate::stats::{Si, Summary, paired_ratios};
use crate::transport::Transport;

/// CSV header; one row per (transport or config, size).
pub const CSV_HEADER: &str = "transport,elements,bytes,rounds,msgs_per_s,msgs_per_s_min,\
msgs_per_s_max,gb_per_s,ratio_to_memcpy,ratio_to_channel,ratio_to_unix_socket,ratio_to_iceoryx2,\
pingpong_ns,placement";

/// One result row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Transport (or pipeline configuration) name.
    pub transport: String,
    /// f32 elements per message (or per item for pipelines).
    pub elements: usize,
    /// Payload bytes per message.
    pub bytes: usize,
    /// Messages per second over the rounds.
    pub msgs: Summary,
    /// Median payload throughput in GB/s (10^9 bytes).
    pub gb_per_s: f64,
    /// Median over rounds of (rate / memcpy rate of the same size and round).
    pub ratio_to_memcpy: Option<f64>,
    /// Median over rounds of (rate / in-process channel rate of the same size and round).
    pub ratio_to_channel: Option<f64>,
    /// Median over rounds of (rate / Unix socket rate of the same size and round).
    pub ratio_to_unix_socket: Option<f64>,
    /// Median over rounds of (rate / iceoryx2 rate of the same size and round).
    pub ratio_to_iceoryx2: Option<f64>,
    /// Median ping-pong round trip of the run, ns.
    pub pingpong_ns: f64,
    /// Placement of the two cores seen by the probes.
    pub placement: Placement,
}

fn median_ratio(num: &[f64], den: Option<&[f64]>) -> Option<f64> {
    Summary::of(&paired_ratios(num, den?)).map(|s| s.median)
}

/// Turns a run into rows (cells without any successful round are left out).
pub fn rows(run: &RunResult) -> Vec<Row> {
    let pingpong_ns = Summary::of(&run.probes_ns).map_or(f64::NAN, |s| s.median);
    let placement = Placement::classify(&run.probes_ns);
    let peer =
        |t: Transport, elements: usize| run.cell(t.name(), elements).map(|c| c.rates.as_slice());
    run.cells
        .iter()
        .filter_map(|c| {
            let msgs = Summary::of(&c.rates)?;
            let bytes = c.elements * 4;
            Some(Row {
                transport: c.name.clone(),
                elements: c.elements,
                bytes,
                gb_per_s: msgs.median * bytes as f64 / 1e9,
                msgs,
                ratio_to_memcpy: median_ratio(&c.rates, peer(Transport::Memcpy, c.elements)),
                ratio_to_channel: median_ratio(&c.rates, peer(Transport::Channel, c.elements)),
                ratio_to_unix_socket: median_ratio(
                    &c.rates,
                    peer(Transport::UnixSocket, c.elements),
                ),
                ratio_to_iceoryx2: median_ratio(&c.rates, peer(Transport::Iceoryx2, c.elements)),
                pingpong_ns,
                placement,
            })
        })
        .collect()
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn opt(x: Option<f64>) -> String {
    x.map_or_else(String::new, |v| format!("{v:.4}"))
}

/// Writes `rows` as CSV with [`CSV_HEADER`].
///
/// # Errors
/// Write errors.
pub fn write_csv<W: Write>(mut w: W, rows: &[Row]) -> io::Result<()> {
    writeln!(w, "{CSV_HEADER}")?;
    for r in rows {
        writeln!(
            w,
            "{},{},{},{},{:.1},{:.1},{:.1},{:.4},{},{},{},{},{:.1},{}",
            csv_field(&r.transport),
            r.elements,
            r.bytes,
            r.msgs.n,
            r.msgs.median,
            r.msgs.min,
            r.msgs.max,
            r.gb_per_s,
            opt(r.ratio_to_memcpy),
            opt(r.ratio_to_channel),
            opt(r.ratio_to_unix_socket),
            opt(r.ratio_to_iceoryx2),
            r.pingpong_ns,
            r.placement.label()
        )?;
    }
    w.flush()
}

/// Reads rows back from a CSV file written by [`write_csv`] (e.g. to redraw a plot).
///
/// # Errors
/// A missing column or a field that does not parse, naming the line.
pub fn read_csv(text: &str) -> Result<Vec<Row>, String> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or("empty CSV")?.split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| format!("CSV has no column {name}"))
    };
    let idx = [
        "transport",
        "elements",
        "bytes",
        "rounds",
        "msgs_per_s",
        "msgs_per_s_min",
        "msgs_per_s_max",
        "gb_per_s",
        "ratio_to_memcpy",
        "ratio_to_channel",
        "ratio_to_unix_socket",
        "ratio_to_iceoryx2",
        "pingpong_ns",
        "placement",
    ]
    .map(col);
    let mut idx_ok = [0usize; 14];
    for (o, i) in idx_ok.iter_mut().zip(idx) {
        *o = i?;
    }
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate() {
        let f: Vec<&str> = line.split(',').collect();
        let get = |k: usize| f.get(idx_ok[k]).copied().unwrap_or("");
        let num = |k: usize| -> Result<f64, String> {
            get(k)
                .parse::<f64>()
                .map_err(|_| format!("line {}: bad {}", n + 2, header[idx_ok[k]]))
        };
        let opt = |k: usize| -> Result<Option<f64>, String> {
            if get(k).is_empty() {
                Ok(None)
            } else {
                num(k).map(Some)
            }
        };
        let placement = match get(13) {
            "near" => Placement::Near,
            "far" => Placement::Far,
            _ => Placement::Mixed,
        };
        rows.push(Row {
            transport: get(0).trim_matches('"').to_string(),
            elements: num(1)? as usize,
            bytes: num(2)? as usize,
            msgs: Summary {
                median: num(4)?,
                min: num(5)?,
                max: num(6)?,
                n: num(3)? as usize,
            },
            gb_per_s: num(7)?,
            ratio_to_memcpy: opt(8)?,
            ratio_to_channel: opt(9)?,
            ratio_to_unix_socket: opt(10)?,
            ratio_to_iceoryx2: opt(11)?,
            pingpong_ns: num(12)?,
            placement,
        });
    }
    Ok(rows)
}

fn ratio_cell(x: Option<f64>) -> String {
    match x {
        Some(v) if v >= 100.0 => format!("{v:.0}x"),
        Some(v) if v >= 10.0 => format!("{v:.1}x"),
        Some(v) if v >= 0.1 => format!("{v:.2}x"),
        Some(v) => format!("{v:.3}x"),
        None => "-".into(),
    }
}

/// Human-readable size of an array of `elements` floats.
pub fn size_label(elements: usize) -> String {
    let bytes = elements as f64 * 4.0;
    let b = if bytes >= 1e6 {
        format!("{:.0} MB", bytes / 1e6)
    } else if bytes >= 1e3 {
        format!("{:.0} kB", bytes / 1e3)
    } else {
        format!("{bytes:.0} B")
    };
    format!("{elements} f32 ({b})")
}

/// The terminal table: one block per size, one line per transport.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.elements).collect();
    sizes.dedup();
    let with_iox = rows.iter().any(|r| r.ratio_to_iceoryx2.is_some());
    let with_channel = rows.iter().any(|r| r.ratio_to_channel.is_some());
    let w = rows
        .iter()
        .map(|r| r.transport.len())
        .max()
        .unwrap_or(0)
        .max(16);
    for elements in sizes {
        let _ = writeln!(out, "\n{}", size_label(elements));
        let _ = write!(
            out,
            "  {:<w$} {:>9} {:>21} {:>9} {:>9} {:>9}",
            "transport", "msgs/s", "[min .. max]", "GB/s", "x memcpy", "x socket"
        );
        if with_channel {
            let _ = write!(out, " {:>9}", "x channel");
        }
        if with_iox {
            let _ = write!(out, " {:>9}", "x iox2");
        }
        out.push('\n');
        for r in rows.iter().filter(|r| r.elements == elements) {
            let spread = format!("[{} .. {}]", Si(r.msgs.min), Si(r.msgs.max));
            let _ = write!(
                out,
                "  {:<w$} {:>9} {:>21} {:>9.3} {:>9} {:>9}",
                r.transport,
                Si(r.msgs.median).to_string(),
                spread,
                r.gb_per_s,
                ratio_cell(r.ratio_to_memcpy),
                ratio_cell(r.ratio_to_unix_socket),
            );
            if with_channel {
                let _ = write!(out, " {:>9}", ratio_cell(r.ratio_to_channel));
            }
            if with_iox {
                let _ = write!(out, " {:>9}", ratio_cell(r.ratio_to_iceoryx2));
            }
            out.push('\n');
        }
    }
    out
}

/// The one-line legend of [`table`]'s columns (the ratio columns the rows have).
pub fn legend(rows: &[Row]) -> String {
    let mut peers = vec!["memcpy", "unix-socket"];
    if rows.iter().any(|r| r.ratio_to_channel.is_some()) {
        peers.push("channel");
    }
    if rows.iter().any(|r| r.ratio_to_iceoryx2.is_some()) {
        peers.push("iceoryx2");
    }
    format!(
        "(msgs/s: median over the rounds, [min .. max] over the rounds; GB/s: f32 payload per \
         second at the median; x <peer>: median of the per-round ratios to {} at the same size \
         in the same round, above 1x = faster)",
        peers.join(", ")
    )
}

/// Median of paired ratios `a / b` at `elements` from the run, if both cells have samples.
pub fn ratio(run: &RunResult, a: &str, b: &str, elements: usize) -> Option<f64> {
    let num = &run.cell(a, elements)?.rates;
    let den = &run.cell(b, elements)?.rates;
    median_ratio(num, Some(den))
}

/// Per-round best of the transports `names` at `elements` (NaN where none has a rate).
fn best_of(run: &RunResult, names: &[&str], elements: usize) -> Option<Vec<f64>> {
    let cells: Vec<&[f64]> = names
        .iter()
        .filter_map(|n| run.cell(n, elements).map(|c| c.rates.as_slice()))
        .collect();
    let rounds = cells.iter().map(|c| c.len()).max()?;
    Some(
        (0..rounds)
            .map(|i| {
                cells
                    .iter()
                    .filter_map(|c| c.get(i).copied().filter(|r| r.is_finite()))
                    .fold(f64::NAN, f64::max)
            })
            .collect(),
    )
}

/// The goals (issue 9 and the earlier ones), each measured from this run or said
/// "not measured" with the reason (iceoryx2 not built, a size or transport not in the run).
pub fn goals(run: &RunResult) -> Vec<Goal> {
    use Transport::*;
    let has = |t: Transport, n: usize| {
        run.cell(t.name(), n)
            .is_some_and(|c| c.rates.iter().any(|r| r.is_finite()))
    };
    let why = |a: Transport, b: Transport, n: usize| -> String {
        for t in [a, b] {
            if t == Iceoryx2 && !t.is_built() {
                return "not measured: iceoryx2 not built (--features iceoryx2)".into();
            }
            if !has(t, n) {
                return format!("not measured: no {t} x {n} in this run");
            }
        }
        "not measured".into()
    };
    let pair = |a: Transport, b: Transport, n: usize, target: f64| {
        Goal::at_least(
            format!("{n} f32: {a} msgs/s >= {target}x {b}"),
            ratio(run, a.name(), b.name(), n),
            target,
        )
        .missing(why(a, b, n))
    };
    let k = 1_000;
    let m = 1_000_000;
    let mut out = vec![
        pair(ShmTyped, RingMin, 16, 0.5),
        pair(ShmTyped, Iceoryx2, 16, 10.0),
        pair(ShmTyped, UnixSocket, 16, 20.0),
    ];
    let best = best_of(run, &[ShmAdaptive.name(), ShmTyped.name()], k);
    for (peer, target) in [(Iceoryx2, 2.0), (RingMin, 0.9)] {
        let measured = best
            .as_ref()
            .and_then(|b| median_ratio(b, run.cell(peer.name(), k).map(|c| c.rates.as_slice())));
        out.push(
            Goal::at_least(
                format!("{k} f32: best of shm-adaptive and shm-typed >= {target}x {peer}"),
                measured,
                target,
            )
            .missing(why(ShmAdaptive, peer, k)),
        );
    }
    out.push(pair(ShmZeroCopy, RingMin, m, 0.9));
    out.push(pair(ShmZeroCopy, Iceoryx2, m, 1.0));
    // Earlier goals (the brief's anchors), still printed.
    out.push(pair(ShmZeroCopy, Memcpy, m, 0.9));
    out.push(pair(ShmZeroCopy, UnixSocket, m, 10.0));
    let mut sizes: Vec<usize> = run.cells.iter().map(|c| c.elements).collect();
    sizes.dedup();
    for elements in sizes {
        let copy = ratio(run, ShmAdaptive.name(), ShmCopy.name(), elements);
        let zero = ratio(run, ShmAdaptive.name(), ShmZeroCopy.name(), elements);
        if let (Some(c), Some(z)) = (copy, zero) {
            out.push(Goal::at_least(
                format!(
                    "{elements} f32: shm-adaptive >= 0.9x the better of shm-copy and shm-zero-copy"
                ),
                Some(c.min(z)),
                0.9,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::Cell;

    fn cell(transport: Transport, elements: usize, rates: &[f64]) -> Cell {
        Cell {
            name: transport.name().to_string(),
            elements,
            rates: rates.to_vec(),
            contended: vec![0.0; rates.len()],
            error: None,
        }
    }

    fn sample_run() -> RunResult {
        RunResult {
            cells: vec![
                cell(Transport::Memcpy, 16, &[100.0, 200.0, 100.0]),
                cell(Transport::UnixSocket, 16, &[10.0, 10.0, 10.0]),
                cell(Transport::ShmCopy, 16, &[50.0, 100.0, 60.0]),
                cell(Transport::ShmZeroCopy, 16, &[40.0, 80.0, 40.0]),
                cell(Transport::ShmAdaptive, 16, &[45.0, 95.0, 70.0]),
                cell(Transport::Pipe, 16, &[f64::NAN, f64::NAN, f64::NAN]),
            ],
            probes_ns: vec![50.0, 60.0, 455.0],
            cores: (0, 1),
            load: (0.5, 0.7),
        }
    }

    #[test]
    fn rows_carry_paired_ratios() {
        let rows = rows(&sample_run());
        assert_eq!(rows.len(), 5, "the failed pipe cell has no row");
        let copy = rows.iter().find(|r| r.transport == "shm-copy").unwrap();
        assert_eq!(copy.msgs.median, 60.0);
        assert_eq!(copy.bytes, 64);
        assert!((copy.gb_per_s - 60.0 * 64.0 / 1e9).abs() < 1e-15);
        // Per-round ratios to memcpy: 0.5, 0.5, 0.6 -> median 0.5.
        assert_eq!(copy.ratio_to_memcpy, Some(0.5));
        assert_eq!(copy.ratio_to_unix_socket, Some(6.0));
        assert_eq!(copy.ratio_to_iceoryx2, None);
        assert_eq!(copy.pingpong_ns, 60.0);
        assert_eq!(copy.placement, Placement::Mixed);
    }

    #[test]
    fn csv_has_the_required_columns_and_one_row_per_cell() {
        let rows = rows(&sample_run());
        let mut buf = Vec::new();
        write_csv(&mut buf, &rows).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        for col in [
            "transport",
            "elements",
            "msgs_per_s",
            "gb_per_s",
            "ratio_to_memcpy",
        ] {
            assert!(header.contains(&col), "missing {col}");
        }
        let body: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        assert_eq!(body.len(), 5);
        assert!(body.iter().all(|r| r.len() == header.len()));
        let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let memcpy = body
            .iter()
            .find(|r| r[col("transport")] == "memcpy")
            .unwrap();
        assert_eq!(memcpy[col("ratio_to_memcpy")], "1.0000");
        assert_eq!(memcpy[col("msgs_per_s")], "100.0");
        assert_eq!(memcpy[col("ratio_to_iceoryx2")], "");
        assert_eq!(memcpy[col("placement")], "mixed");
    }

    #[test]
    fn csv_reads_back() {
        let rows = rows(&sample_run());
        let mut buf = Vec::new();
        write_csv(&mut buf, &rows).unwrap();
        let back = read_csv(&String::from_utf8(buf).unwrap()).unwrap();
        assert_eq!(back.len(), rows.len());
        for (a, b) in rows.iter().zip(&back) {
            assert_eq!(
                (&a.transport, a.elements, a.msgs.n),
                (&b.transport, b.elements, b.msgs.n)
            );
            assert!((a.msgs.median - b.msgs.median).abs() < 0.1);
            assert_eq!(a.ratio_to_iceoryx2, b.ratio_to_iceoryx2);
            assert_eq!(a.placement, b.placement);
        }
        assert!(
            read_csv("transport,elements\nx,1")
                .unwrap_err()
                .contains("no column")
        );
    }

    #[test]
    fn csv_quotes_awkward_names() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
    }

    #[test]
    fn table_lists_every_row() {
        let t = table(&rows(&sample_run()));
        assert!(t.contains("16 f32 (64 B)"));
        for name in [
            "memcpy",
            "unix-socket",
            "shm-copy",
            "shm-zero-copy",
            "shm-adaptive",
        ] {
            assert!(t.contains(name), "{name} missing from\n{t}");
        }
        assert!(!t.contains("x iox2"));
        assert!(t.contains("6.00x"), "copy vs socket\n{t}");
    }

    #[test]
    fn goals_use_what_was_measured() {
        let mut run = sample_run();
        run.cells
            .push(cell(Transport::ShmTyped, 16, &[150.0, 300.0, 200.0]));
        run.cells
            .push(cell(Transport::RingMin, 16, &[100.0, 200.0, 200.0]));
        let g = goals(&run);
        let find = |t: &str| {
            g.iter()
                .find(|g| g.text == t)
                .unwrap_or_else(|| panic!("{t}: {g:?}"))
        };
        // shm-typed / unix-socket: 15, 30, 20 -> 20.
        let socket = find("16 f32: shm-typed msgs/s >= 20x unix-socket");
        assert_eq!((socket.measured, socket.met()), (Some(20.0), Some(true)));
        // shm-typed / ring-min: 1.5, 1.5, 1.0 -> 1.5.
        assert_eq!(
            find("16 f32: shm-typed msgs/s >= 0.5x ring-min").measured,
            Some(1.5)
        );
        let iox = find("16 f32: shm-typed msgs/s >= 10x iceoryx2");
        assert_eq!(iox.met(), None);
        if !cfg!(feature = "iceoryx2") {
            assert!(iox.missing.contains("iceoryx2 not built"), "{iox:?}");
        }
        let k = find("1000 f32: best of shm-adaptive and shm-typed >= 0.9x ring-min");
        assert!(
            k.met().is_none() && k.missing.contains("no shm-adaptive x 1000"),
            "{k:?}"
        );
        // Adaptive vs copy: 0.9, 0.95, 1.1667 -> 0.95; vs zero-copy: >1 -> worst is 0.95.
        let adaptive = g.iter().find(|g| g.text.contains("better of")).unwrap();
        assert!((adaptive.measured.unwrap() - 0.95).abs() < 1e-12);
        assert_eq!(adaptive.met(), Some(true));
        let text = crate::goals::goals_text(&g);
        assert!(
            text.contains("not measured") && text.contains("met "),
            "{text}"
        );
    }

    #[test]
    fn best_of_takes_the_faster_per_round() {
        let mut run = sample_run();
        run.cells
            .push(cell(Transport::ShmTyped, 16, &[10.0, f64::NAN, 500.0]));
        let b = best_of(&run, &["shm-adaptive", "shm-typed"], 16).unwrap();
        assert_eq!(b, vec![45.0, 95.0, 500.0]);
        assert!(best_of(&run, &["nothing"], 16).is_none());
    }
}
