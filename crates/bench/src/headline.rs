//! The `demo` headline, split by whether the workers had their CPUs.
//!
//! On this shared 2-vCPU VM a two-process transport that spins needs both CPUs at once: in a
//! round where another process (a build) takes one of them, or the hypervisor steals it, its
//! rate falls several-fold (1M floats: ~11 k msgs/s free, ~1.5 k contended, for every shm
//! transport) while a one-thread memcpy barely notices. Medians over a mix of such rounds
//! swing from run to run (0.14x to 1.1x of memcpy for zero-copy). Each cell records the share
//! of its window lost to CPU waits and steal ([`crate::contention`]); the headline's figures
//! are medians over the free cells ("free" = under [`CONTENDED`]) of each transport, and the
//! contended cells are reported apart.

use crate::contention::CONTENDED;
use crate::runner::{Cell, RunResult};
use crate::stats::Summary;
use crate::transport::Transport;

/// Free cells each headline transport needs before the demo stops adding rounds.
pub const WANT_FREE: usize = 3;

/// Whether the cell's round `i` measured something with the CPUs to itself.
fn free(c: &Cell, i: usize) -> bool {
    c.rates.get(i).is_some_and(|r| r.is_finite())
        && c.contended.get(i).is_some_and(|w| *w < CONTENDED)
}

/// Whether the cell's round `i` measured something while a CPU was taken.
fn contended(c: &Cell, i: usize) -> bool {
    c.rates.get(i).is_some_and(|r| r.is_finite())
        && c.contended
            .get(i)
            .is_some_and(|w| w.is_nan() || *w >= CONTENDED)
}

/// Median rate of `t` at `n` over the rounds `keep` selects, and how many there were.
fn median_of(
    run: &RunResult,
    t: Transport,
    n: usize,
    keep: fn(&Cell, usize) -> bool,
) -> (f64, usize) {
    let Some(c) = run.cell(t.name(), n) else {
        return (f64::NAN, 0);
    };
    let xs: Vec<f64> = (0..c.rates.len())
        .filter(|&i| keep(c, i))
        .map(|i| c.rates[i])
        .collect();
    (Summary::of(&xs).map_or(f64::NAN, |s| s.median), xs.len())
}

/// Free cells of the transport with the fewest (every one of `ts` at `n`).
pub fn fewest_free(run: &RunResult, ts: &[Transport], n: usize) -> usize {
    ts.iter()
        .map(|&t| median_of(run, t, n, free).1)
        .min()
        .unwrap_or(0)
}

fn x(a: f64, b: f64) -> String {
    let r = a / b;
    if r.is_finite() {
        format!("{r:.2}x")
    } else {
        "n/a".to_string()
    }
}

/// The zero-copy line of one class of cells (`keep`), or `None` when a transport has none.
fn zero_copy_line(run: &RunResult, n: usize, keep: fn(&Cell, usize) -> bool) -> Option<String> {
    use Transport::*;
    let m = |t| median_of(run, t, n, keep);
    let (z, zn) = m(ShmZeroCopy);
    let (mc, mn) = m(Memcpy);
    let (c, cn) = m(ShmCopy);
    let (s, sn) = m(UnixSocket);
    if [zn, mn, cn, sn].contains(&0) {
        return None;
    }
    Some(format!(
        "zero-copy moves {} arrays at {} of single-thread memcpy, {} the copying path, {} a Unix \
         socket ({:.0} msgs/s; cells per transport: zero-copy {zn}, memcpy {mn}, copy {cn}, \
         socket {sn})",
        crate::report::size_label(n),
        x(z, mc),
        x(z, c),
        x(z, s),
        z
    ))
}

/// The best round of each transport (its quietest moment; the figure that moves least from
/// run to run when few rounds are free), as ratios.
fn best_line(run: &RunResult, n: usize) -> Option<String> {
    use Transport::*;
    let best = |t: Transport| {
        run.cell(t.name(), n)
            .and_then(|c| Summary::of(&c.rates))
            .map(|s| s.max)
    };
    let (z, m, c, s) = (
        best(ShmZeroCopy)?,
        best(Memcpy)?,
        best(ShmCopy)?,
        best(UnixSocket)?,
    );
    Some(format!(
        "best round of each transport: zero-copy {} of memcpy, {} the copying path, {} a Unix \
         socket ({z:.0} msgs/s)",
        x(z, m),
        x(z, c),
        x(z, s)
    ))
}

/// The headline lines: the free cells' figures (or why there are none), the best rounds, the
/// contended cells' figures for comparison, then adaptive against the better of copy and
/// zero-copy.
pub fn lines(run: &RunResult, n: usize) -> Vec<String> {
    use Transport::*;
    let rounds = run.probes_ns.len();
    let mut out = Vec::new();
    match zero_copy_line(run, n, free) {
        Some(l) => out.push(format!(
            "{l}\n  (medians over the cells of {rounds} rounds in which both workers had their \
             CPUs: under {:.0}% of the window waiting for a CPU or stolen by the hypervisor)",
            CONTENDED * 100.0
        )),
        None => out.push(format!(
            "no uncontended cell for every transport in {rounds} rounds (another process held \
             a CPU each time: load {:.1}); run the demo on a quieter machine for the headline",
            run.load.0.max(run.load.1)
        )),
    }
    if let Some(l) = best_line(run, n) {
        out.push(l);
    }
    if let Some(l) = zero_copy_line(run, n, contended) {
        out.push(format!("with a CPU taken by another process: {l}"));
    }
    let (a, an) = median_of(run, ShmAdaptive, n, free);
    let (c, _) = median_of(run, ShmCopy, n, free);
    let (z, _) = median_of(run, ShmZeroCopy, n, free);
    if an > 0 {
        out.push(format!(
            "adaptive (the default policy) runs at {} of the better of copy and zero-copy \
             (uncontended cells)",
            x(a, c.max(z))
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(t: Transport, rates: &[f64], waits: &[f64]) -> Cell {
        Cell {
            name: t.name().to_string(),
            elements: 8,
            rates: rates.to_vec(),
            contended: waits.to_vec(),
            error: None,
        }
    }

    fn run(cells: Vec<Cell>) -> RunResult {
        RunResult {
            cells,
            probes_ns: vec![70.0; 4],
            cores: (0, 1),
            load: (2.0, 2.0),
        }
    }

    #[test]
    fn free_and_contended_cells_are_reported_apart() {
        use Transport::*;
        let w = [0.0, 0.5, 0.01, 0.6];
        let r = run(vec![
            cell(Memcpy, &[100.0, 90.0, 100.0, 80.0], &w),
            cell(ShmZeroCopy, &[100.0, 10.0, 80.0, 20.0], &w),
            cell(ShmCopy, &[50.0, 5.0, 40.0, 5.0], &w),
            cell(UnixSocket, &[10.0, 1.0, 10.0, 1.0], &w),
            cell(ShmAdaptive, &[90.0, 10.0, 90.0, 10.0], &w),
        ]);
        let l = lines(&r, 8);
        assert!(
            l[0].starts_with("zero-copy moves") && l[0].contains("at 0.90x of"),
            "{l:?}"
        );
        assert!(l[0].contains("2.00x the copying path"), "{l:?}");
        assert!(
            l[1].starts_with("best round") && l[1].contains("1.00x of memcpy"),
            "{l:?}"
        );
        assert!(
            l[2].contains("with a CPU taken") && l[2].contains("0.18x of"),
            "{l:?}"
        );
        assert!(l[3].contains("1.00x of the better"), "{l:?}");
        assert_eq!(fewest_free(&r, &[Memcpy, ShmCopy], 8), 2);
    }

    #[test]
    fn no_free_cell_says_so() {
        use Transport::*;
        let w = [0.5, 0.5];
        let r = run(vec![
            cell(Memcpy, &[100.0, 90.0], &w),
            cell(ShmZeroCopy, &[10.0, 10.0], &w),
            cell(ShmCopy, &[5.0, 5.0], &w),
            cell(UnixSocket, &[1.0, 1.0], &w),
        ]);
        let l = lines(&r, 8);
        assert!(l[0].starts_with("no uncontended cell"), "{l:?}");
        assert_eq!(fewest_free(&r, &[Memcpy], 8), 0);
    }
}
