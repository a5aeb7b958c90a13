//! Runs the real binary: `transport` with tiny sizes and a short duration, then checks the CSV
//! and the plot it wrote, and that no worker process or shared-memory segment is left behind.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shmpipe_test_kit::proc::processes_with_cmdline;
use shmpipe_test_kit::{ChildGuard, TempDir, shm_entries};

const EXE: &str = env!("CARGO_BIN_EXE_shmpipe-bench");

/// Runs the harness with `args`, at most `limit`; returns (success, stdout, stderr, pid).
fn run(args: &[&str], limit: Duration) -> (bool, String, String, u32) {
    let child = Command::new(EXE)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut h = ChildGuard(child);
    let start = Instant::now();
    while h.0.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < limit,
            "harness still running after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ChildGuard(child) = &mut h;
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let ok = child.wait().unwrap().success();
    (ok, out, err, pid)
}

/// Worker processes still alive whose rendezvous name belongs to harness `pid`.
fn stray_workers(pid: u32) -> Vec<String> {
    processes_with_cmdline(&format!("bench-{pid}-"))
        .into_iter()
        .filter(|cmd| cmd.contains("worker"))
        .collect()
}

/// Shared-memory entries left by harness `pid`.
fn leaked_segments(pid: u32) -> Vec<String> {
    let prefix = format!("shmpipe-bench-{pid}-");
    let ring = format!("shmpipe_ring-bench-{pid}-");
    let lat = format!("shmpipe_lat-bench-{pid}-");
    shm_entries("")
        .into_iter()
        .filter(|n| n.starts_with(&prefix) || n.starts_with(&ring) || n.starts_with(&lat))
        .collect()
}

/// Asserts that harness `pid` succeeded and left no worker process and no shared memory.
fn assert_succeeded_and_clean(ok: bool, out: &str, err: &str, pid: u32) {
    assert!(ok, "harness failed\nstdout:\n{out}\nstderr:\n{err}");
    assert!(stray_workers(pid).is_empty(), "{:?}", stray_workers(pid));
    assert!(
        leaked_segments(pid).is_empty(),
        "{:?}",
        leaked_segments(pid)
    );
}

/// The header and the rows of a CSV text (no quoting: the harness writes none).
fn csv_table(text: &str) -> (Vec<&str>, Vec<Vec<&str>>) {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    (header, rows)
}

fn column(header: &[&str], name: &str) -> usize {
    header
        .iter()
        .position(|h| *h == name)
        .unwrap_or_else(|| panic!("no column {name} in {header:?}"))
}

#[test]
fn transport_smoke_writes_csv_and_plot() {
    let dir = TempDir::new("bench-smoke");
    let csv = dir.0.join("t.csv");
    let svg = dir.0.join("t.svg");
    let (ok, out, err, pid) = run(
        &[
            "transport",
            "--sizes",
            "16,1000",
            "--rounds",
            "2",
            "--duration",
            "20ms",
            "--no-progress",
            "--csv",
            csv.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
        Duration::from_secs(90),
    );
    assert_succeeded_and_clean(ok, &out, &err, pid);

    let text = std::fs::read_to_string(&csv).unwrap();
    let (header, rows) = csv_table(&text);
    let transports = [
        "memcpy",
        "channel",
        "ring-min",
        "shm-zero-copy",
        "shm-copy",
        "shm-adaptive",
        "shm-typed",
        "pipe",
        "unix-socket",
    ];
    assert_eq!(
        rows.len(),
        2 * transports.len(),
        "one row per (transport, size)\n{text}"
    );
    check_transport_rows(&header, &rows, &text, &transports);
    let placement = column(&header, "placement");
    assert!(
        rows.iter()
            .all(|row| ["near", "far", "mixed"].contains(&row[placement]))
    );
    assert!(out.contains("ping-pong"), "{out}");
    check_transport_legends(&out, &transports);
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("shm-zero-copy"));
}

/// Every (transport, size) row of `transport`'s CSV: positive rates, GB/s equal to msgs/s times
/// the bytes, memcpy's ratio exactly 1.
fn check_transport_rows(header: &[&str], rows: &[Vec<&str>], text: &str, transports: &[&str]) {
    let (t, e, m, g, r) = (
        column(header, "transport"),
        column(header, "elements"),
        column(header, "msgs_per_s"),
        column(header, "gb_per_s"),
        column(header, "ratio_to_memcpy"),
    );
    for size in ["16", "1000"] {
        for &name in transports {
            let row = rows
                .iter()
                .find(|row| row[t] == name && row[e] == size)
                .unwrap_or_else(|| panic!("no row for {name} x {size}\n{text}"));
            assert_eq!(row.len(), header.len());
            let msgs: f64 = row[m].parse().unwrap();
            let gb: f64 = row[g].parse().unwrap();
            let ratio: f64 = row[r].parse().unwrap();
            assert!(msgs > 0.0, "{name} x {size}: {msgs}");
            let bytes: f64 = size.parse::<f64>().unwrap() * 4.0;
            assert!(
                (gb - msgs * bytes / 1e9).abs() <= 1e-4 + gb * 1e-3,
                "{row:?}"
            );
            assert!(ratio > 0.0, "{row:?}");
            if name == "memcpy" {
                assert_eq!(row[r], "1.0000");
            }
        }
    }
}

/// The table explains itself: a legend of the columns and one of the rows.
fn check_transport_legends(out: &str, transports: &[&str]) {
    assert!(
        out.contains("(msgs/s: median over the rounds") && out.contains("x <peer>:"),
        "{out}"
    );
    for name in transports {
        assert!(
            out.contains(&format!("{name} = ")),
            "no legend for {name}: {out}"
        );
    }
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let (ok, _, err, _) = run(&["transport", "--sizes", "0"], Duration::from_secs(20));
    assert!(!ok);
    assert!(err.contains("at least 1 element"), "{err}");
}

#[cfg(not(feature = "iceoryx2"))]
#[test]
fn iceoryx2_without_its_feature_is_refused() {
    let (ok, _, err, _) = run(
        &["transport", "--transports", "iceoryx2"],
        Duration::from_secs(20),
    );
    assert!(!ok);
    assert!(err.contains("--features iceoryx2"), "{err}");
}

#[test]
fn unwritable_csv_is_an_error() {
    let (ok, _, err, pid) = run(
        &[
            "transport",
            "--sizes",
            "16",
            "--transports",
            "pipe",
            "--rounds",
            "1",
            "--duration",
            "10ms",
            "--no-progress",
            "--csv",
            "/nonexistent-dir/x.csv",
        ],
        Duration::from_secs(30),
    );
    assert!(!ok);
    assert!(err.contains("/nonexistent-dir/x.csv"), "{err}");
    assert!(stray_workers(pid).is_empty());
}

#[test]
fn pipeline_smoke_writes_csv() {
    let dir = TempDir::new("bench-pipeline");
    let csv = dir.0.join("p.csv");
    let csv_arg = csv.to_str().unwrap();
    let (ok, out, err, pid) = run(
        &[
            "pipeline",
            "--sizes",
            "1000",
            "--workers",
            "1",
            "--topology",
            "fused,staged",
            "--transfer",
            "copy",
            "--rounds",
            "1",
            "--duration",
            "50ms",
            "--no-progress",
            "--csv",
            csv_arg,
        ],
        Duration::from_secs(90),
    );
    assert!(ok, "harness failed\nstdout:\n{out}\nstderr:\n{err}");
    assert!(
        processes_with_cmdline(csv_arg).is_empty(),
        "{:?}",
        processes_with_cmdline(csv_arg)
    );
    let leaked: Vec<String> = shm_entries("")
        .into_iter()
        .filter(|n| {
            n.starts_with(&format!("shmpipe-{pid}x"))
                || n.starts_with(&format!("shmpipe-bench-{pid}-"))
        })
        .collect();
    assert!(leaked.is_empty(), "{leaked:?}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let (header, rows) = csv_table(&text);
    let (t, m, r) = (
        column(&header, "transport"),
        column(&header, "msgs_per_s"),
        column(&header, "ratio_to_memcpy"),
    );
    let names: Vec<&str> = rows.iter().map(|row| row[t]).collect();
    assert_eq!(
        names,
        vec!["memcpy", "fused w1 64KiB copy", "staged w1 64KiB copy"],
        "{text}"
    );
    for row in &rows {
        assert!(row[m].parse::<f64>().unwrap() > 0.0, "{row:?}");
        assert!(row[r].parse::<f64>().unwrap() > 0.0, "{row:?}");
    }
}

#[test]
fn latency_smoke_prints_every_peer_with_ordered_percentiles() {
    let dir = TempDir::new("bench-latency");
    let csv = dir.0.join("l.csv");
    let (ok, out, err, pid) = run(
        &[
            "latency",
            "--trips",
            "400",
            "--rounds",
            "2",
            "--warmup",
            "20",
            "--idle",
            "300ms",
            "--no-progress",
            "--csv",
            csv.to_str().unwrap(),
        ],
        Duration::from_secs(90),
    );
    assert_succeeded_and_clean(ok, &out, &err, pid);
    let mut peers = vec![
        "cache-line",
        "futex-spin",
        "futex-sleep",
        "shm-spin",
        "shm-sleep",
        "shm-typed-spin",
        "shm-typed-sleep",
    ];
    if cfg!(feature = "iceoryx2") {
        peers.extend(["iceoryx2-poll", "iceoryx2-event"]);
    }
    let text = std::fs::read_to_string(&csv).unwrap();
    let (header, rows) = csv_table(&text);
    assert_eq!(rows.len(), peers.len(), "{text}");
    check_latency_rows(&header, &rows, &text, &out, &peers);
    assert!(out.contains("placement"), "{out}");
    assert!(out.contains("idle: a blocked shm-ring receiver"), "{out}");
    check_latency_goals(&out);
}

/// Each peer's row of `latency`'s CSV: its trips, positive percentiles in order, and the same
/// p50 in the table on stdout.
fn check_latency_rows(header: &[&str], rows: &[Vec<&str>], text: &str, out: &str, peers: &[&str]) {
    let cols: Vec<usize> = ["p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns"]
        .iter()
        .map(|c| column(header, c))
        .collect();
    for name in peers {
        let row = rows
            .iter()
            .find(|r| r[column(header, "peer")] == *name)
            .unwrap_or_else(|| panic!("no row for {name}\n{text}"));
        assert_eq!(row[column(header, "trips")], "400", "{row:?}");
        let p: Vec<f64> = cols.iter().map(|&c| row[c].parse().unwrap()).collect();
        assert!(p[0] > 0.0, "{name}: {p:?}");
        assert!(
            p.windows(2).all(|w| w[0] <= w[1]),
            "{name}: percentiles out of order {p:?}"
        );
        // The table on stdout has the same peer with the same p50.
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} not in the table\n{out}"));
        assert!(line.contains(row[cols[0]]), "{line} vs {row:?}");
    }
}

/// Every goal line of `latency`'s output says met, NOT met or not measured.
fn check_latency_goals(out: &str) {
    let goals = out
        .split("Goals")
        .nth(1)
        .unwrap_or_else(|| panic!("no goals\n{out}"));
    for g in [
        "shm-typed-spin p50 <= 2x futex-spin",
        "shm-typed-sleep p50 ~ futex-sleep",
        "shm-spin p50 <= 2x futex-spin",
        "idle CPU",
        "iceoryx2-poll",
    ] {
        let line = goals
            .lines()
            .find(|l| l.contains(g))
            .unwrap_or_else(|| panic!("no goal {g}\n{out}"));
        assert!(
            ["met", "NOT met", "not measured"]
                .iter()
                .any(|v| line.trim_start().starts_with(v)),
            "{line}"
        );
    }
}

#[test]
fn memory_smoke_reports_commit_pss_and_start_time() {
    let (ok, out, err, pid) = run(
        &[
            "memory",
            "--workers",
            "1",
            "--topology",
            "fused",
            "--large",
            "100k",
            "--large-workers",
            "1",
            "--items",
            "50",
            "--large-items",
            "5",
        ],
        Duration::from_secs(90),
    );
    assert!(ok, "harness failed\nstdout:\n{out}\nstderr:\n{err}");
    assert!(processes_with_cmdline("memory --workers 1 --topology fused").is_empty());
    let leaked = shm_entries(&format!("shmpipe-{pid}x"));
    assert!(leaked.is_empty(), "{leaked:?}");
    for size in ["16", "100000"] {
        let f: Vec<&str> = out
            .lines()
            .find(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[0] == "fused" && f[1] == "1" && f[2] == size
            })
            .unwrap_or_else(|| panic!("no fused W=1 {size} row\n{out}"))
            .split_whitespace()
            .collect();
        // fused 1 16 <procs> <start ms> | <commit: idle moving full> | <PSS: idle moving full>
        // | <Shmem> (<n> memfds)
        let num = |i: usize| f[i].parse::<f64>().unwrap_or_else(|_| panic!("{f:?}[{i}]"));
        assert!(num(3) >= 3.0, "harness, emitter and a worker: {f:?}");
        assert!(num(4) > 0.0, "start time: {f:?}");
        let (idle, moving, full) = (num(6), num(7), num(8));
        assert!(
            idle > 0.0,
            "headers and rings are committed at creation: {f:?}"
        );
        assert!(idle <= moving && moving <= full, "commit only grows: {f:?}");
        assert!(
            num(10) > 0.0 && num(11) > 0.0 && num(12) > 0.0,
            "PSS: {f:?}"
        );
        assert!(f.last() == Some(&"memfds)"), "{f:?}");
        let memfds: usize = f[f.len() - 2].trim_start_matches('(').parse().unwrap();
        assert!(
            memfds >= 2,
            "a fused pipeline has a channel in and one out: {f:?}"
        );
    }
    assert!(out.contains("blocks of 0.4 MB while moving"), "{out}");
    let goals = out
        .split("Goals:")
        .nth(1)
        .unwrap_or_else(|| panic!("no goals\n{out}"));
    assert!(
        goals.contains("fused W=8") && goals.contains("not measured"),
        "{goals}"
    );
    assert!(goals.contains("idle commit per channel"), "{goals}");
}
