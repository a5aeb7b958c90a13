//! The shared dataset: a sealed memfd that every worker maps in place.
//!
//! - entries round-trip exactly, arrays are read in place;
//! - an unsealed memfd is refused, and so is any corrupted layout (never a panic);
//! - the structural property behind "one copy for all workers": child processes that
//!   open the parent's memfd through `/proc` and touch every page each hold the whole
//!   mapping resident but are charged only their share of it (PSS ~ size / sharers),
//!   and the shares of all processes add up to one dataset.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::process::Stdio;

use common::same;
use shmpipe_test_kit::{ChildGuard, rerun_test};
use shmpipe_timeseries::memstat::{mapping_usage, mapping_usage_at};
use shmpipe_timeseries::shared::{Layout, MEMFD_NAME, SharedDataset, SharedError};
use shmpipe_timeseries::synth::{GenConfig, to_bytes};
use shmpipe_timeseries::{DataEntry, Freq, jsonl};

const CHILD_ENV: &str = "SHMPIPE_TS_SHARED_CHILD";

fn dataset(series: usize, min_len: usize, max_len: usize) -> (Vec<DataEntry>, Freq) {
    let g = GenConfig {
        num_series: series,
        min_len,
        max_len,
        missing_prob: 0.01,
        ..GenConfig::default()
    };
    (jsonl::parse_lines(&to_bytes(&g), g.freq).unwrap(), g.freq)
}

#[test]
fn entries_round_trip_and_are_read_in_place() {
    let (entries, freq) = dataset(60, 10, 300);
    let ds = SharedDataset::create(&entries, freq).unwrap();
    assert_eq!(ds.len(), entries.len());
    assert_eq!(ds.freq(), freq);
    for (i, e) in entries.iter().enumerate() {
        assert!(same(&ds.entry(i).unwrap(), e), "series {i}");
        let v = ds.values(i, "target").unwrap().unwrap();
        let range = ds.mapping_range();
        assert!(
            range.contains(&(v.as_ptr() as usize)),
            "values are in the mapping"
        );
        assert_eq!(v.as_ptr() as usize % 64, 0, "arrays are 64-byte aligned");
    }
    assert!(matches!(
        ds.entry(entries.len()),
        Err(SharedError::OutOfRange { .. })
    ));
    // Opened again through /proc, as a worker does.
    let (pid, fd) = ds.handle();
    let again = SharedDataset::open_proc(pid, fd).unwrap();
    assert!(same(&again.entry(7).unwrap(), &entries[7]));
}

#[test]
fn an_unsealed_memfd_is_refused() {
    let fd: OwnedFd =
        rustix::fs::memfd_create("unsealed", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, 4096).unwrap();
    assert!(matches!(
        SharedDataset::open_fd(fd),
        Err(SharedError::NotSealed)
    ));
}

/// Every single-byte change of the header and tables (three values per byte) is
/// refused or still reads without a panic; garbage never validates.
#[test]
fn corrupted_layouts_are_errors_never_panics() {
    let (entries, freq) = dataset(5, 3, 40);
    let ds = SharedDataset::create(&entries, freq).unwrap();
    let (pid, fd) = ds.handle();
    let bytes = std::fs::read(format!("/proc/{pid}/fd/{fd}")).unwrap();
    assert!(Layout::parse(&bytes).is_ok());
    let head = bytes.len().min(4096 + 256);
    let mut refused = 0;
    for pos in 0..head {
        for v in [0u8, 0xFF, bytes[pos] ^ 0x80] {
            if v == bytes[pos] {
                continue;
            }
            let mut b = bytes.clone();
            b[pos] = v;
            match Layout::parse(&b) {
                Err(_) => refused += 1,
                Ok(l) => {
                    for i in 0..l.len() {
                        let _ = l.entry(i);
                        let _ = l.values(i, "target");
                    }
                }
            }
        }
    }
    assert!(refused > 100, "only {refused} corruptions refused");
    assert!(
        Layout::parse(&bytes[..bytes.len() - 4]).is_err(),
        "truncated"
    );
    assert!(Layout::parse(&[0u8; 4096]).is_err(), "zeros");
    assert!(Layout::parse(&[]).is_err(), "empty");
}

/// Child role: open the parent's dataset, touch every value, report, wait for EOF.
fn child_main(handle: &str) -> ! {
    let (pid, fd) = handle.split_once(':').unwrap();
    let ds = SharedDataset::open_proc(pid.parse().unwrap(), fd.parse().unwrap()).unwrap();
    let mut sum = 0f64;
    for i in 0..ds.len() {
        for v in ds.values(i, "target").unwrap().unwrap() {
            if !v.is_nan() {
                sum += f64::from(*v);
            }
        }
    }
    println!("ready {sum}");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    std::process::exit(0);
}

#[test]
fn workers_share_one_copy_of_the_mapping() {
    if let Ok(h) = std::env::var(CHILD_ENV) {
        child_main(&h);
    }
    // ~8 MB of values.
    let (entries, freq) = dataset(800, 2000, 3000);
    let ds = SharedDataset::create(&entries, freq).unwrap();
    let size_kib = ds.size() as u64 / 1024;
    let (pid, fd) = ds.handle();
    // The parent touches every page too (it wrote them through another mapping).
    let mut want = 0f64;
    for i in 0..ds.len() {
        for v in ds.values(i, "target").unwrap().unwrap() {
            if !v.is_nan() {
                want += f64::from(*v);
            }
        }
    }
    const N: usize = 3;
    let mut kids = Vec::new();
    for _ in 0..N {
        kids.push(ChildGuard(
            rerun_test("workers_share_one_copy_of_the_mapping")
                .env(CHILD_ENV, format!("{pid}:{fd}"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        ));
    }
    for c in &mut kids {
        let mut out = BufReader::new(c.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "child exited early");
            if let Some(s) = line.trim().strip_prefix("ready ") {
                assert_eq!(s.parse::<f64>().unwrap(), want, "child read other values");
                break;
            }
        }
    }
    let needle = format!("memfd:{MEMFD_NAME}");
    let me = mapping_usage_at(std::process::id(), ds.mapping_range().start).unwrap();
    assert!(me.rss_kib >= size_kib * 95 / 100, "parent rss {me:?}");
    let mut total_pss = me.pss_kib;
    let sharers = N as u64 + 1;
    for c in &kids {
        let u = mapping_usage(c.id(), &needle).unwrap();
        // The whole dataset is resident in the child...
        assert!(
            u.rss_kib >= size_kib * 95 / 100,
            "child rss {u:?} of {size_kib} KiB"
        );
        // ...but it pays only its share.
        assert!(
            u.pss_kib <= size_kib / sharers + size_kib / 20,
            "child pss {} KiB, size {size_kib} KiB over {sharers} sharers",
            u.pss_kib
        );
        total_pss += u.pss_kib;
    }
    // One dataset in all, not one per process.
    assert!(
        total_pss >= size_kib * 95 / 100 && total_pss <= size_kib * 105 / 100,
        "summed pss {total_pss} KiB for one {size_kib} KiB dataset"
    );
    for c in &mut kids {
        drop(c.stdin.take());
    }
    for c in &mut kids {
        assert!(c.wait().unwrap().success());
    }
}
