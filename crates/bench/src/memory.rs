//! The `memory` subcommand: what a pipeline costs in memory before and while data moves, per
//! topology and worker count.
//!
//! For each configuration the harness starts the pipeline twice and reads its memory three
//! times:
//! - **idle**: enqueue mode with nothing enqueued (channels created, no data ever moves), 100 ms
//!   after `start()`; the time of `start()` is taken here;
//! - **moving**: the `bench-arrays` source cycling over epochs, checked by the `bench-check`
//!   and `bench-scale` steps; a second thread reads the memory [`MOVING_AFTER`] after
//!   `start()` while the harness keeps reading items (at least `--items` in all);
//! - **full**: then the harness stops reading for 200 ms, so that every channel fills up to
//!   its backpressure: the most that can be in flight.
//!
//! Each reading sums, over the harness process and every child ([`shmpipe::Pipeline::pids`]):
//! - **committed**: the pages really allocated to the pipeline's channels: every
//!   `/proc/<pid>/fd/<n>` that links to a `memfd:` (and every `memfd:` mapping in
//!   `/proc/<pid>/map_files` when readable), counted once per inode, `st_blocks x 512` from
//!   `stat` (shm-ring's anonymous channels are memfds);
//! - **PSS**: `Pss:` of `/proc/<pid>/smaps_rollup` (shared pages split between their users,
//!   so the sum is the pipeline's own footprint, heap and binaries included);
//! - **Shmem delta**: the system-wide `Shmem:` of `/proc/meminfo` against a reading taken just
//!   before `start()` (a cross-check; other work on the machine moves it too).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use serde_json::json;
use shmpipe::{Epochs, Pipeline, Registry};

use crate::BoxError;
use crate::cli::MemoryArgs;
use crate::goals::Goal;
use crate::kernel;
use crate::pipebench::{self, PipeConfig, TopologyKind, TransferKind};

const MIB: f64 = (1u64 << 20) as f64;

/// Memory of a set of processes at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    /// Bytes allocated to distinct memfds held (open or mapped) by the processes.
    pub committed: u64,
    /// Distinct memfds found.
    pub memfds: usize,
    /// Summed PSS, bytes.
    pub pss: u64,
    /// System-wide `Shmem` minus the baseline, bytes.
    pub shmem_delta: i64,
    /// Processes read.
    pub processes: usize,
}

/// The `Shmem:` line of `/proc/meminfo`, in bytes (0 if unreadable).
pub fn system_shmem() -> u64 {
    meminfo_field(
        &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
        "Shmem:",
    )
}

/// A `kB` field of a `/proc/meminfo` or `smaps_rollup` text, in bytes (0 if missing).
pub fn meminfo_field(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Summed PSS of `pids`, bytes (processes that vanished count 0).
pub fn summed_pss(pids: &[u32]) -> u64 {
    pids.iter()
        .map(|pid| {
            let text =
                std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
            meminfo_field(&text, "Pss:")
        })
        .sum()
}

/// The distinct memfds that `pids` hold open or mapped: (device, inode) -> allocated bytes.
pub fn memfds(pids: &[u32]) -> HashMap<(u64, u64), u64> {
    let mut found = HashMap::new();
    for pid in pids {
        for dir in ["fd", "map_files"] {
            let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/{dir}")) else {
                continue;
            };
            for e in entries.flatten() {
                let is_memfd = std::fs::read_link(e.path())
                    .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:"));
                // `metadata` follows the link to the memfd's inode.
                if is_memfd && let Ok(m) = std::fs::metadata(e.path()) {
                    found.insert((m.dev(), m.ino()), m.blocks() * 512);
                }
            }
        }
    }
    found
}

/// Bytes allocated to the distinct memfds that `pids` hold open or mapped, and their count.
pub fn memfd_committed(pids: &[u32]) -> (u64, usize) {
    let m = memfds(pids);
    (m.values().sum(), m.len())
}

/// Reads the memory of this process and `children`, against the `Shmem` `baseline`.
pub fn read(children: &[u32], baseline: u64) -> Reading {
    let mut pids = vec![std::process::id()];
    pids.extend_from_slice(children);
    let (committed, memfds) = memfd_committed(&pids);
    Reading {
        committed,
        memfds,
        pss: summed_pss(&pids),
        shmem_delta: system_shmem() as i64 - baseline as i64,
        processes: pids.len(),
    }
}

/// One configuration's figures.
#[derive(Debug, Clone)]
pub struct MemoryRow {
    /// `fused` or `staged`.
    pub topology: TopologyKind,
    /// Workers per stage.
    pub workers: usize,
    /// f32 elements per item.
    pub elements: usize,
    /// `start()` of the idle pipeline.
    pub start: Duration,
    /// Before any data moved.
    pub idle: Reading,
    /// While the harness kept reading items (taken by another thread).
    pub moving: Reading,
    /// After the harness stopped reading: every channel at its backpressure.
    pub full: Reading,
}

fn builder(
    reg: &Registry,
    topology: TopologyKind,
    workers: usize,
    elements: usize,
) -> shmpipe::PipelineBuilder {
    let cfg = PipeConfig {
        workers,
        topology,
        batch_bytes: shmpipe::DEFAULT_BATCH_BYTES,
        transfer: TransferKind::Adaptive,
    };
    let b = Pipeline::builder(reg)
        .step(pipebench::STEP_CHECK)
        .step(pipebench::STEP_SCALE)
        .workers(workers)
        .topology(cfg.topology());
    if elements * 4 > (512 << 10) {
        // Items beyond the default pool block: blocks sized for them (as `pipeline` does).
        let (slots, blocks, block_size) = cfg.channel(elements);
        b.channel(shmpipe::ChannelGeometry {
            slots,
            blocks,
            block_size,
            ..shmpipe::ChannelGeometry::default()
        })
    } else {
        b
    }
}

/// Starts, reads and drops the pipelines of one configuration.
///
/// # Errors
/// Pipeline errors; an item that fails the check.
pub fn measure(
    reg: &Registry,
    topology: TopologyKind,
    workers: usize,
    elements: usize,
    items: usize,
) -> Result<MemoryRow, BoxError> {
    let baseline = system_shmem();
    let t0 = Instant::now();
    let p = builder(reg, topology, workers, elements).start()?;
    let start = t0.elapsed();
    // Let every child map its channels.
    std::thread::sleep(Duration::from_millis(100));
    let idle = read(&p.pids(), baseline);
    drop(p);

    let baseline = system_shmem();
    let mut p = builder(reg, topology, workers, elements)
        .source_named(pipebench::SOURCE, json!({ "elements": elements }))
        .epochs(Epochs::Cycle)
        .start()?;
    // The "moving" reading is taken by another thread while this one keeps reading items.
    let pids = p.pids();
    let reader = std::thread::spawn(move || {
        std::thread::sleep(MOVING_AFTER);
        read(&pids, baseline)
    });
    let mut n = 0usize;
    while n < items || !reader.is_finished() {
        let item = p.dequeue()?.ok_or("the pipeline ended early")?;
        let seq = item.i64("seq").ok_or("item without seq")? as u64;
        let x = item.array::<f32>("x").ok_or("item without f32 array x")?;
        let xs = x.as_slice().ok_or("x not contiguous")?;
        if xs.len() != elements {
            return Err(format!("array of {} floats, expected {elements}", xs.len()).into());
        }
        kernel::check_scaled(xs, seq, pipebench::FACTOR)?;
        n += 1;
    }
    let moving = reader.join().map_err(|_| "memory reader panicked")?;
    // Stop reading: every channel fills up to its backpressure.
    std::thread::sleep(Duration::from_millis(200));
    let full = read(&p.pids(), baseline);
    drop(p);
    Ok(MemoryRow {
        topology,
        workers,
        elements,
        start,
        idle,
        moving,
        full,
    })
}

/// When the "moving" reading is taken, after `start()`.
pub const MOVING_AFTER: Duration = Duration::from_millis(300);

fn topo_label(t: TopologyKind) -> &'static str {
    match t {
        TopologyKind::Fused => "fused",
        TopologyKind::Staged => "staged",
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / MIB
}

/// The table: one line per configuration.
pub fn table(rows: &[MemoryRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<8} {:>2} {:>9} {:>5} {:>8} | {:>30} | {:>24} | {:>9}",
        "topology",
        "W",
        "f32/item",
        "procs",
        "start ms",
        "commit MiB: idle moving full",
        "PSS MiB: idle moving full",
        "Shmem MiB"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "  {:<8} {:>2} {:>9} {:>5} {:>8.1} | {:>10.3} {:>9.3} {:>9.3} | {:>8.1} {:>7.1} {:>7.1} | {:>9.1}   ({} memfds)",
            topo_label(r.topology),
            r.workers,
            r.elements,
            r.full.processes,
            r.start.as_secs_f64() * 1e3,
            mib(r.idle.committed),
            mib(r.moving.committed),
            mib(r.full.committed),
            mib(r.idle.pss),
            mib(r.moving.pss),
            mib(r.full.pss),
            r.full.shmem_delta as f64 / MIB,
            r.full.memfds,
        );
    }
    out
}

fn find(rows: &[MemoryRow], t: TopologyKind, w: usize, n: usize) -> Option<&MemoryRow> {
    rows.iter()
        .find(|r| r.topology == t && r.workers == w && r.elements == n)
}

/// The memory goals this run has the data for.
pub fn goals(rows: &[MemoryRow], small: usize, large: usize) -> Vec<Goal> {
    let mut g = Vec::new();
    for t in [TopologyKind::Fused, TopologyKind::Staged] {
        let r = find(rows, t, 8, small);
        g.push(
            Goal::at_most(
                format!(
                    "{} W=8, {small} f32 items moving: committed shared memory",
                    topo_label(t)
                ),
                r.map(|r| mib(r.moving.committed)),
                64.0,
            )
            .unit(" MiB")
            .missing("not measured: W=8 not in --workers"),
        );
    }
    let staged = |w| find(rows, TopologyKind::Staged, w, small).map(|r| r.moving.committed as f64);
    let growth = match (staged(8), staged(4)) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    g.push(
        Goal::at_most(
            "staged, moving commit W=8 / W=4 (linear: 2x; W^2+2W channels: 3.3x)",
            growth,
            2.5,
        )
        .missing("not measured: needs W=4 and W=8 staged"),
    );
    for r in rows.iter().filter(|r| r.elements == large) {
        let per_channel = r.idle.committed as f64 / r.idle.memfds.max(1) as f64;
        g.push(
            Goal::at_most(
                format!(
                    "{} W={}, {large} f32 items: idle commit per channel (pools start small)",
                    topo_label(r.topology),
                    r.workers
                ),
                Some(per_channel / MIB),
                4.0,
            )
            .unit(" MiB"),
        );
    }
    g
}

/// The lines under the table: blocks committed by the large items, `start()` time per child
/// process, and how the staged layout's idle commit grows from 4 to 8 workers.
fn print_findings(a: &MemoryArgs, rows: &[MemoryRow]) {
    for r in rows.iter().filter(|r| r.elements == a.large) {
        let block = (a.large * 4) as f64;
        println!(
            "{} W={} with {} f32 items: committed {:.1} blocks of {:.1} MB while moving, \
             {:.1} when full ({:.1} MiB over {} memfds)",
            topo_label(r.topology),
            r.workers,
            a.large,
            r.moving.committed as f64 / block,
            block / 1e6,
            r.full.committed as f64 / block,
            mib(r.full.committed),
            r.full.memfds
        );
    }
    if let Some(w) = a.workers.iter().copied().max() {
        for t in &a.topology {
            if let Some(r) = find(rows, *t, w, a.small) {
                println!(
                    "{} start(): {:.2} ms per child process (emitter and workers) at W={w}",
                    topo_label(*t),
                    r.start.as_secs_f64() * 1e3 / (r.full.processes - 1).max(1) as f64
                );
            }
        }
    }
    if let (Some(a), Some(b)) = (
        find(rows, TopologyKind::Staged, 8, a.small),
        find(rows, TopologyKind::Staged, 4, a.small),
    ) {
        println!(
            "staged idle commit W=4 -> W=8: {:.3} -> {:.3} MiB ({:.2}x) over {} -> {} channels",
            mib(b.idle.committed),
            mib(a.idle.committed),
            a.idle.committed as f64 / b.idle.committed.max(1) as f64,
            b.idle.memfds,
            a.idle.memfds
        );
    }
}

/// `memory`: runs every configuration and prints the table, the block count of the large
/// items and the goals.
///
/// # Errors
/// A configuration that failed (after printing the others).
pub fn report(a: &MemoryArgs) -> Result<(), BoxError> {
    let reg = pipebench::registry();
    let mut plan: Vec<(TopologyKind, usize, usize, usize)> = Vec::new();
    for &t in &a.topology {
        for &w in &a.workers {
            plan.push((t, w, a.small, a.items));
        }
    }
    for &w in &a.large_workers {
        for &t in &a.topology {
            plan.push((t, w, a.large, a.large_items));
        }
    }
    eprintln!("shmpipe-bench memory: {} configurations", plan.len());
    let load = crate::sys::load_average();
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for (t, w, n, items) in plan {
        match measure(&reg, t, w, n, items) {
            Ok(r) => rows.push(r),
            Err(e) => {
                eprintln!("{} W={w} {n} f32 failed: {e}", topo_label(t));
                failed.push(format!("{} W={w} {n} f32: {e}", topo_label(t)));
            }
        }
    }
    println!(
        "pipelines check + scale, default channel geometry (items over 512 KiB: pool blocks \
         sized for them, as in `pipeline`); load average {load:.2} at start, {:.2} at end",
        crate::sys::load_average()
    );
    print!("{}", table(&rows));
    println!(
        "(idle: enqueue mode, nothing enqueued, 100 ms after start(); moving: 300 ms after \
         start() while the harness reads items; full: after that, 200 ms without reading, every \
         channel at its backpressure. commit = allocated bytes of the distinct memfds held by \
         the harness and its children (fstat st_blocks x 512); PSS = summed \
         /proc/<pid>/smaps_rollup over the same processes; Shmem = system-wide /proc/meminfo \
         Shmem when full minus a reading just before start(), noisy)"
    );
    print_findings(a, &rows);
    println!("\nGoals:");
    print!(
        "{}",
        crate::goals::goals_text(&goals(&rows, a.small, a.large))
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} configuration(s) failed:\n  {}",
            failed.len(),
            failed.join("\n  ")
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_in_bytes() {
        let text = "MemTotal:  100 kB\nShmem:      2048 kB\nPss:  7 kB\n";
        assert_eq!(meminfo_field(text, "Shmem:"), 2048 * 1024);
        assert_eq!(meminfo_field(text, "Pss:"), 7 * 1024);
        assert_eq!(meminfo_field(text, "Nope:"), 0);
        assert!(system_shmem() > 0);
        assert!(summed_pss(&[std::process::id()]) > 0);
    }

    fn row(
        t: TopologyKind,
        w: usize,
        n: usize,
        idle: u64,
        moving: u64,
        memfds: usize,
    ) -> MemoryRow {
        let r = |committed| Reading {
            committed,
            memfds,
            pss: 1 << 20,
            shmem_delta: 0,
            processes: w + 2,
        };
        MemoryRow {
            topology: t,
            workers: w,
            elements: n,
            start: Duration::from_millis(5),
            idle: r(idle),
            moving: r(moving),
            full: r(moving * 2),
        }
    }

    #[test]
    fn goals_read_the_right_rows() {
        const M: u64 = 1 << 20;
        let rows = vec![
            row(TopologyKind::Fused, 8, 16, M, 40 * M, 16),
            row(TopologyKind::Staged, 4, 16, M, 30 * M, 24),
            row(TopologyKind::Staged, 8, 16, 3 * M, 90 * M, 80),
            row(TopologyKind::Fused, 2, 1_000_000, 8 * M, 100 * M, 4),
        ];
        let g = goals(&rows, 16, 1_000_000);
        let find = |t: &str| g.iter().find(|g| g.text.contains(t)).unwrap();
        assert_eq!(find("fused W=8").measured, Some(40.0));
        assert_eq!(find("fused W=8").met(), Some(true));
        assert_eq!(find("staged W=8").met(), Some(false), "90 MiB > 64");
        assert_eq!(find("W=8 / W=4").measured, Some(3.0));
        let large = find("fused W=2, 1000000");
        assert_eq!((large.measured, large.met()), (Some(2.0), Some(true)));
        let t = table(&rows);
        assert!(
            t.contains("40.000") && t.contains("80.000") && t.contains("(80 memfds)"),
            "{t}"
        );
        let none = goals(&[], 16, 1_000_000);
        assert!(none.iter().all(|g| g.met().is_none()) && none.len() == 3);
    }

    #[test]
    fn a_touched_memfd_is_counted_once_per_inode() {
        let fd = rustix::fs::memfd_create("bench-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let file = std::fs::File::from(fd);
        file.set_len(1 << 20).unwrap();
        let dup = file.try_clone().unwrap();
        let meta = file.metadata().unwrap();
        let key = (meta.dev(), meta.ino());
        let me = [std::process::id()];
        assert_eq!(
            memfds(&me).get(&key),
            Some(&0),
            "a sized memfd commits nothing yet"
        );
        use std::io::Write;
        (&file).write_all(&vec![1u8; 256 << 10]).unwrap();
        let touched = memfds(&me)[&key];
        assert!((256 << 10..1 << 20).contains(&touched), "{touched}");
        let (total, n) = memfd_committed(&me);
        assert!(total >= touched && n >= 1);
        drop((file, dup));
        assert!(!memfds(&me).contains_key(&key));
    }
}
