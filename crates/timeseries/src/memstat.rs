//! Memory use of processes as the kernel counts it: PSS (proportional set size)
//! from `/proc/<pid>/smaps_rollup` and per mapping from `/proc/<pid>/smaps`.
//!
//! PSS charges each resident page to the processes mapping it in equal shares, so
//! the PSS of a group of processes sums to the memory they really use: a page
//! shared by five processes counts 1/5 in each.
//!
//! ```
//! let kib = shmpipe_timeseries::memstat::pss_kib(std::process::id()).unwrap();
//! assert!(kib > 0);
//! ```

use std::io;

/// Resident and proportional size of one mapping, in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Resident pages of the mapping in this process.
    pub rss_kib: u64,
    /// Proportional share of those pages.
    pub pss_kib: u64,
}

fn field_kib(line: &str, key: &str) -> Option<u64> {
    let rest = line.strip_prefix(key)?.strip_prefix(':')?;
    rest.trim().strip_suffix("kB")?.trim().parse().ok()
}

/// Total PSS of process `pid`, in KiB.
///
/// # Errors
/// If `/proc/<pid>/smaps_rollup` cannot be read or has no `Pss` line.
pub fn pss_kib(pid: u32) -> io::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    text.lines()
        .find_map(|l| field_kib(l, "Pss"))
        .ok_or_else(|| io::Error::other("no Pss in smaps_rollup"))
}

/// Summed usage of the mappings of process `pid` whose path contains `needle`
/// (e.g. `memfd:shmpipe-ts-dataset`).
///
/// # Errors
/// If `/proc/<pid>/smaps` cannot be read.
pub fn mapping_usage(pid: u32, needle: &str) -> io::Result<Usage> {
    usage_where(pid, |header| header.contains(needle))
}

/// Usage of the mapping of process `pid` that starts at address `start`.
///
/// # Errors
/// If `/proc/<pid>/smaps` cannot be read.
pub fn mapping_usage_at(pid: u32, start: usize) -> io::Result<Usage> {
    let prefix = format!("{start:x}-");
    usage_where(pid, |header| header.starts_with(&prefix))
}

fn usage_where(pid: u32, matches: impl Fn(&str) -> bool) -> io::Result<Usage> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut u = Usage::default();
    let mut inside = false;
    for line in text.lines() {
        // A mapping header starts with "start-end " (hex); field lines with "Key:".
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            inside = matches(line);
        } else if inside {
            if let Some(k) = field_kib(line, "Rss") {
                u.rss_kib += k;
            } else if let Some(k) = field_kib(line, "Pss") {
                u.pss_kib += k;
            }
        }
    }
    Ok(u)
}

/// Pids of the live children of process `pid` (from `/proc/*/stat`).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    // The command may contain spaces and parentheses: split after the last ')'.
                    let rest = &s[s.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// CPU time (user + system) of this process and of its children that have exited and
/// been waited for (`/proc/self/stat`: utime, stime, cutime, cstime).
///
/// # Errors
/// If `/proc/self/stat` cannot be read or parsed.
pub fn cpu_with_children() -> io::Result<std::time::Duration> {
    let s = std::fs::read_to_string("/proc/self/stat")?;
    let bad = || io::Error::other("unexpected /proc/self/stat");
    // Fields after the command (which may hold spaces and parentheses): state is the
    // first; utime, stime, cutime, cstime are the 12th to 15th.
    let rest = &s[s.rfind(')').ok_or_else(bad)? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f
        .get(11..15)
        .ok_or_else(bad)?
        .iter()
        .map(|x| x.parse::<u64>().map_err(|_| bad()))
        .sum::<io::Result<u64>>()?;
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Ok(std::time::Duration::from_secs_f64(ticks as f64 / hz as f64))
}
