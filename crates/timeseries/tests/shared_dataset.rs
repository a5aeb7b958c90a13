//! The shared dataset: a sealed memfd that every worker maps in place.
//!
//! - entries round-trip exactly, arrays are read in place;
//! - an unsealed memfd is refused, and so is any corrupted layout (never a panic);
//! - the structural property behind "one copy for all workers": pipeline workers that
//!   receive the parent's memfd (`PipelineBuilder::share_fd`) and touch every page each
//!   hold the whole mapping resident but are charged only their share of it
//!   (PSS ~ size / sharers), and the shares of all processes add up to one dataset.

mod common;

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use common::same;
use shmpipe::{Item, Pipeline, Registry, StepError, map};
use shmpipe_test_kit::{KillOnDrop, within};
use shmpipe_timeseries::memstat::{mapping_usage, mapping_usage_at};
use shmpipe_timeseries::shared::{Layout, MEMFD_NAME, SharedDataset, SharedError};
use shmpipe_timeseries::synth::{GenConfig, to_bytes};
use shmpipe_timeseries::{DataEntry, Freq, jsonl};

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
    // Opened again from its descriptor, as a worker does.
    let again = SharedDataset::open_fd(ds.as_fd().try_clone_to_owned().unwrap()).unwrap();
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
    let mut bytes = Vec::new();
    std::fs::File::from(ds.as_fd().try_clone_to_owned().unwrap())
        .read_to_end(&mut bytes)
        .unwrap();
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

/// Sum of every non-NaN target value.
fn sum_of_targets(ds: &SharedDataset) -> f64 {
    let mut sum = 0f64;
    for i in 0..ds.len() {
        for v in ds.values(i, "target").unwrap().unwrap() {
            if !v.is_nan() {
                sum += f64::from(*v);
            }
        }
    }
    sum
}

/// Worker step: opens the dataset it received, touches every value when built, and tags
/// every item with the sum and its worker.
fn registry() -> Registry {
    Registry::new().step("touch_shared", |cx| {
        let fd = cx.shared_fd("shared")?;
        let fd = fd
            .try_clone_to_owned()
            .map_err(|e| StepError::new(e.to_string()))?;
        let ds = SharedDataset::open_fd(fd).map_err(StepError::new)?;
        let sum = sum_of_targets(&ds);
        let w = cx.worker.worker as i64;
        Ok(map(move |it: Item| {
            let _keep = &ds;
            Ok(it.with_meta("sum", sum).with_meta("worker", w))
        }))
    })
}

#[test]
fn workers_share_one_copy_of_the_mapping() {
    let reg = registry();
    shmpipe::init(&reg);
    // ~8 MB of values.
    let (entries, freq) = dataset(800, 2000, 3000);
    let ds = SharedDataset::create(&entries, freq).unwrap();
    let size_kib = ds.size() as u64 / 1024;
    // The parent touches every page too (it wrote them through another mapping).
    let want = sum_of_targets(&ds);
    const N: usize = 3;
    let mut b = Pipeline::builder(&reg);
    let h = b.share_fd(ds.as_fd()).unwrap();
    let mut p = b
        .step_with("touch_shared", serde_json::json!({"shared": h}))
        .workers(N)
        .start()
        .unwrap();
    let pids = p.pids();
    let _g = KillOnDrop(pids.clone());
    // Item k goes to worker k % N: one each. The input stays open: the workers stay.
    for n in 0..N as i64 {
        p.enqueue(Item::new().with_meta("n", n)).unwrap();
    }
    let (outs, mut p) = within(
        Duration::from_secs(60),
        "one output per worker",
        move || {
            let outs: Vec<Item> = (0..N).map(|_| p.dequeue().unwrap().unwrap()).collect();
            (outs, p)
        },
    );
    let mut workers: Vec<i64> = outs.iter().map(|o| o.i64("worker").unwrap()).collect();
    workers.sort_unstable();
    assert_eq!(workers, vec![0, 1, 2]);
    for o in &outs {
        assert_eq!(o.f64("sum"), Some(want), "a worker read other values");
    }
    let needle = format!("memfd:{MEMFD_NAME}");
    let me = mapping_usage_at(std::process::id(), ds.mapping_range().start).unwrap();
    assert!(me.rss_kib >= size_kib * 95 / 100, "parent rss {me:?}");
    let mut total_pss = me.pss_kib;
    let sharers = N as u64 + 1;
    for &pid in &pids {
        let u = mapping_usage(pid, &needle).unwrap();
        // The whole dataset is resident in the worker...
        assert!(
            u.rss_kib >= size_kib * 95 / 100,
            "worker rss {u:?} of {size_kib} KiB"
        );
        // ...but it pays only its share.
        assert!(
            u.pss_kib <= size_kib / sharers + size_kib / 20,
            "worker pss {} KiB, size {size_kib} KiB over {sharers} sharers",
            u.pss_kib
        );
        total_pss += u.pss_kib;
    }
    // One dataset in all, not one per process.
    assert!(
        total_pss >= size_kib * 95 / 100 && total_pss <= size_kib * 105 / 100,
        "summed pss {total_pss} KiB for one {size_kib} KiB dataset"
    );
    p.close_input();
    assert!(p.by_ref().all(|r| r.is_ok()));
}
