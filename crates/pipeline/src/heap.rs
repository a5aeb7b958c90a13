//! Heap tuning for the pipeline's own child processes (emitters and workers).
//!
//! A worker allocates and frees the arrays of every batch it builds: a few hundred KiB per
//! item. glibc's defaults give memory above 128 KiB at the top of the heap back to the kernel
//! on every `free` (and map allocations of 128 KiB and more one by one), so the next batch
//! faults the same pages in again, zeroed and charged to the memory cgroup each time: a large
//! share of the system time of `timeseries_loader --long`, and a clear gain in windows/s with
//! freed memory kept (figures and the date of the run in `docs/figures.md`).
//!
//! Only children call this: the consumer is the user's process, whose allocator is the user's
//! business.

/// Freed memory the heap keeps for reuse before giving it back (glibc `M_TRIM_THRESHOLD`).
pub(crate) const TRIM_THRESHOLD: usize = 8 << 20;
/// Allocations from this size up get their own mapping (glibc `M_MMAP_THRESHOLD`).
pub(crate) const MMAP_THRESHOLD: usize = 4 << 20;
/// Extra room the heap asks for when it grows (glibc `M_TOP_PAD`).
pub(crate) const TOP_PAD: usize = 1 << 20;

/// Lets this process keep up to [`TRIM_THRESHOLD`] of freed heap for reuse, so a batch of
/// a few hundred KiB reuses the pages of the last one instead of faulting fresh ones in.
pub(crate) fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (param, value) in [
        (libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (libc::M_TOP_PAD, TOP_PAD),
    ] {
        // SAFETY: `mallopt` only sets glibc's tuning parameters (it takes the allocator's
        // lock); the values are in range for an `int`. No memory is touched.
        unsafe { libc::mallopt(param, value as libc::c_int) };
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    fn minor_faults() -> i64 {
        // SAFETY: `getrusage` fills the zeroed struct we own.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_SELF is a valid `who`.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) }, 0);
        u.ru_minflt
    }

    /// nextest runs each test in its own process, so the tuning stays in this one.
    #[test]
    fn batches_of_a_few_hundred_kib_reuse_their_pages() {
        keep_freed_memory();
        // Like a batch: several arrays under 128 KiB (glibc's default mapping threshold)
        // whose sum, freed at the top of the heap, is over its default trim threshold.
        let (size, arrays) = (100 << 10, 4);
        let pages = (arrays * size / 4096) as i64;
        let mut sink = 0u64;
        let mut cycle = |i: usize| {
            let vs: Vec<Vec<u8>> = (0..arrays)
                .map(|_| {
                    let mut v = vec![0u8; size];
                    for p in (0..size).step_by(4096) {
                        v[p] = i as u8;
                    }
                    v
                })
                .collect();
            sink += vs.iter().map(|v| u64::from(v[size - 1])).sum::<u64>();
            drop(std::hint::black_box(vs));
        };
        cycle(0);
        let before = minor_faults();
        for i in 1..=50 {
            cycle(i);
        }
        let faults = minor_faults() - before;
        // Without the tuning every cycle faults all its pages in again (~50 x 100).
        assert!(
            faults < 5 * pages,
            "{faults} minor faults for 50 cycles of {pages} pages ({sink})"
        );
    }
}
