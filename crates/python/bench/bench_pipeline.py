"""shmpipe.Pipeline against Python's own process pools, on the same items in the same run.

Contenders, each given the same list of items ``{"x": float32 array}`` and the same step:
- the in-process loop (no processes: the cost of the step itself);
- ``shmpipe.Pipeline(items, steps=[step], workers=W)`` (unordered);
- ``multiprocessing.Pool(W).imap_unordered(step, items, chunksize)``, best of 1, 64, 256;
- ``concurrent.futures.ProcessPoolExecutor(W).map(step, items, chunksize=...)``, best of the
  same chunk sizes.

Steps: ``double`` (``item["x"] = item["x"] * 2``, trivial) and ``heavy`` (about 50 us of numpy
per item, calibrated at start). Items of 16, 1k, 100k and 1M float32; 1 and 2 workers.
Throughput of shmpipe is steady state: (items - 1) / (time of the last output - time of the
first), so its start-up does not count (it is printed apart); the pools are started before the
clock, and their throughput is items / (time of the last output - call), since with a chunk as
large as the run all outputs arrive at once (2026-12-04: the 1M-float row had Pool at 328 k
items/s that way). Each
contender runs ``--repeat`` times, interleaved, and keeps its best.

Goals (issue 18): shmpipe >= 2x the best of Pool/Executor at 16 and 1k floats, >= 5x at 100k
and 1M; with the heavy step 2 workers >= 1.8x one worker; for an in-memory list of 2,000
items of 100k float32 (800 MB) the time to the first output under 0.5 s and the peak summed
PSS of the parent and its workers under 1.3x the dataset.

    python bench/bench_pipeline.py            # the full table (several minutes)
    python bench/bench_pipeline.py --quick    # a smoke run: tiny sizes, prints the same table
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import threading
import time

import numpy as np

import shmpipe

# ----- steps (top level: the workers of every contender import them)

HEAVY_REPS = int(os.environ.get("SHMPIPE_BENCH_HEAVY_REPS", "0"))
_M = np.linspace(0.0, 1.0, 256).reshape(16, 16)


def double(item):
    item["x"] = item["x"] * 2
    return item


def _heavy_work(reps):
    m = _M
    for _ in range(reps):
        m = np.tanh(m @ _M)
    return float(m[0, 0])


def heavy(item):
    item["y"] = _heavy_work(HEAVY_REPS)
    return item


STEPS = {"double": double, "heavy": heavy}


def calibrate(target_s=50e-6):
    """Repetitions of the heavy step's loop that take about ``target_s`` of CPU time here
    (thread CPU time: on a loaded machine the wall time of the same work varies)."""
    _heavy_work(50)
    per_rep = min(_time_reps(200) for _ in range(5)) / 200
    return max(1, round(target_s / per_rep))


def _time_reps(reps):
    t = time.thread_time()
    _heavy_work(reps)
    return time.thread_time() - t


# ----- timing


TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """CPU seconds of a live process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read().rsplit(")", 1)[1].split()
        return (int(st[11]) + int(st[12])) / TCK
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0


def own_cpu(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


class Clock:
    """Times an iteration: first output, last output, count; and the CPU time spent from the
    first output on by this process (all its threads) and the worker processes ``pids()``
    (read at the first output; workers reaped by the end count through RUSAGE_CHILDREN)."""

    def __init__(self, pids=lambda: [], warm=False):
        self.t0 = time.perf_counter()
        self.first = None
        self.n = 0
        self.pids = pids
        self.warm = warm
        if warm:  # processes already running: CPU time counts from now
            self._cpu_start()

    def _cpu_start(self):
        self.cpu0 = own_cpu(resource.RUSAGE_SELF) + own_cpu(resource.RUSAGE_CHILDREN)
        self.workers = list(self.pids())
        self.cpu0 += sum(proc_cpu(p) for p in self.workers)

    def tick(self):
        self.n += 1
        if self.warm and not self.workers:
            self.workers = list(self.pids())  # spawned by the first submit
        if self.first is None:
            self.first = time.perf_counter()
            if not self.warm:
                self._cpu_start()

    def result(self, n_expected):
        """A warm clock (processes started before it: a pool) counts rate and CPU from its
        start: a chunk of outputs that arrives at once (a chunk as large as the run) would
        otherwise make the time between the first and the last output ~0."""
        end = time.perf_counter()
        assert self.n == n_expected, f"{self.n} outputs for {n_expected} items"
        cpu = own_cpu(resource.RUSAGE_SELF) + own_cpu(resource.RUSAGE_CHILDREN)
        cpu += sum(proc_cpu(p) for p in self.workers)
        if self.warm:
            steady = self.n / max(end - self.t0, 1e-9)
        else:
            steady = (self.n - 1) / max(end - self.first, 1e-9) if self.n > 1 else 0.0
        per_item = (cpu - self.cpu0) / max(self.n - (0 if self.warm else 1), 1)
        return {"rate": steady, "first": self.first - self.t0, "total": end - self.t0,
                "cpu": per_item}


def run_loop(items, step, workers):
    copies = [dict(d) for d in items]
    c = Clock()
    for d in copies:
        step(d)
        c.tick()
    return c.result(len(items))


def run_shmpipe(items, step, workers):
    p = shmpipe.Pipeline(items, steps=[step], workers=workers)
    c = Clock(lambda: p.pids)
    for _ in p:
        c.tick()
    p.close()  # the workers are reaped: their CPU time is in RUSAGE_CHILDREN
    return c.result(len(items))


def run_pool(items, step, workers, chunksize, pool):
    c = Clock(lambda: [w.pid for w in pool._pool], warm=True)
    for _ in pool.imap_unordered(step, items, chunksize=chunksize):
        c.tick()
    return c.result(len(items))


def run_executor(items, step, workers, chunksize, ex):
    c = Clock(lambda: list(ex._processes), warm=True)
    for _ in ex.map(step, items, chunksize=chunksize):
        c.tick()
    return c.result(len(items))


CHUNKS = (1, 64, 256)


def one_round(items, step, workers, pool, ex, with_loop):
    """Every contender once, back to back: {name: result}."""
    r = {}
    if with_loop:
        r["loop"] = run_loop(items, step, workers)
    r["shmpipe"] = run_shmpipe(items, step, workers)
    for cs in CHUNKS:
        r[f"pool/{cs}"] = run_pool(items, step, workers, cs, pool)
        r[f"executor/{cs}"] = run_executor(items, step, workers, cs, ex)
    return r


def best_of(rounds, prefix):
    """The best rate of the contenders named ``prefix/...`` in one round: (rate, chunk)."""
    k = max((k for k in rounds if k.startswith(prefix)), key=lambda k: rounds[k]["rate"])
    return rounds[k]["rate"], k.split("/")[1]


def measure(items, step, workers_list, repeat):
    """``repeat`` rounds; in each, every worker count and every contender back to back (so
    the ratios of one round share the machine's load). {workers: [round results]}."""
    out = {w: [] for w in workers_list}
    pools = {w: (mp.Pool(w), cf.ProcessPoolExecutor(w)) for w in workers_list}
    try:
        for pool, ex in pools.values():
            # Warm the pools up (their processes exist and have imported numpy).
            list(pool.imap_unordered(step, items[:8], chunksize=1))
            list(ex.map(step, items[:8]))
        for _ in range(repeat):
            for w in workers_list:
                pool, ex = pools[w]
                out[w].append(one_round(items, step, w, pool, ex, w == workers_list[0]))
    finally:
        for pool, ex in pools.values():
            pool.terminate()
            ex.shutdown(cancel_futures=True)
    return out


def fastest_peer(r):
    """The name of the fastest Pool or Executor contender of a round."""
    return max((k for k in r if k.startswith(("pool/", "executor/"))),
               key=lambda k: r[k]["rate"])


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


# ----- the 800 MB case: start-up and memory


def pss_kb(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def startup_and_memory(n_items, width, workers):
    """Time to the first output and peak summed PSS / dataset, each in a fresh process of its
    own (so that nothing of the runs before counts, and the PSS sampler does not slow the
    start-up it would measure)."""
    out = []
    for what in ("first", "pss"):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--startup-child", what,
                            str(n_items), str(width), str(workers)],
                           capture_output=True, text=True, check=True)
        out.append(float(r.stdout.split()[-1]))
    return out[0], out[1], n_items * width * 4


def startup_child(what, n_items, width, workers):
    items = [{"x": np.full(width, i, np.float32)} for i in range(n_items)]
    dataset = n_items * width * 4
    p = shmpipe.Pipeline(items, steps=[double], workers=workers)
    t0 = time.perf_counter()
    it = iter(p)
    next(it)
    first = time.perf_counter() - t0
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            total = pss_kb(os.getpid()) + sum(pss_kb(q) for q in p.pids)
            peak[0] = max(peak[0], total)
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    if what == "pss":
        th.start()
    n = 1 + sum(1 for _ in it)
    stop.set()
    if what == "pss":
        th.join()
    assert n == n_items
    print(first if what == "first" else peak[0] * 1024 / dataset)


# ----- report


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def fmt_rate(r):
    return f"{r / 1e3:9.1f} k" if r >= 1e3 else f"{r:9.1f}  "


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--startup-child"]:
        startup_child(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, one round")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--sizes", default="16,1000,100000,1000000")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--steps", default="double,heavy")
    ap.add_argument("--no-startup", action="store_true", help="skip the 800 MB case")
    args = ap.parse_args(argv)

    reps = calibrate()
    os.environ["SHMPIPE_BENCH_HEAVY_REPS"] = str(reps)
    global HEAVY_REPS
    HEAVY_REPS = reps
    sizes = [int(s) for s in args.sizes.split(",")]
    workers_list = [int(w) for w in args.workers.split(",")]
    steps = args.steps.split(",")
    repeat = 1 if args.quick else args.repeat
    # Items per run: about a second of the fastest contender on 2 cores.
    count = {16: 100_000, 1000: 40_000, 100_000: 600, 1_000_000: 60}
    heavy_count = {16: 20_000, 1000: 20_000, 100_000: 600, 1_000_000: 60}
    if args.quick:
        if args.sizes == ap.get_default("sizes"):
            sizes = [1000]
        count = {s: 300 for s in sizes}
        heavy_count = count

    print(f"# bench_pipeline  {now()}  load {load()}  cpus {os.cpu_count()}  "
          f"heavy step {reps} reps (~50 us)  rounds {repeat}")
    print("# items/s steady state, best of the rounds; ratio = median over rounds of "
          "shmpipe / best of Pool and Executor in the same round; CPU us/item: this process "
          "and its workers from the first output on (median over rounds; peer: that of the "
          "faster of Pool and Executor); cpu ratio = peer / shmpipe")
    print(f"{'step':7} {'floats':>8} {'W':>2} {'loop':>11} {'shmpipe':>11} {'Pool':>11} "
          f"{'(chunk)':>7} {'Executor':>11} {'(chunk)':>7} {'ratio':>6} {'goal':>5}  "
          f"{'start s':>7} {'cpu us':>7} {'peer':>7} {'cpu ratio':>9}")
    scaling = {}
    for step_name in steps:
        step = STEPS[step_name]
        for size in sizes:
            n = (heavy_count if step_name == "heavy" else count).get(size, 200)
            items = [{"x": np.full(size, i % 1000, np.float32)} for i in range(n)]
            res = measure(items, step, workers_list, repeat)
            for w in workers_list:
                rounds = res[w]
                ratios = [r["shmpipe"]["rate"] / max(best_of(r, "pool/")[0],
                                                     best_of(r, "executor/")[0])
                          for r in rounds]
                ratio = median(ratios)
                best = lambda name: max(r[name]["rate"] for r in rounds)  # noqa: E731
                pool = max((best_of(r, "pool/") for r in rounds))
                ex = max((best_of(r, "executor/") for r in rounds))
                loop = fmt_rate(best("loop")) if "loop" in rounds[0] else f"{'':>11}"
                goal = 2.0 if size <= 1000 else 5.0
                verdict = "" if step_name == "heavy" else ("met" if ratio >= goal else "NOT")
                start = min(r["shmpipe"]["first"] for r in rounds)
                cpu = median([r["shmpipe"]["cpu"] for r in rounds]) * 1e6
                peer_cpu = median([r[fastest_peer(r)]["cpu"] for r in rounds]) * 1e6
                print(f"{step_name:7} {size:>8} {w:>2} {loop} {fmt_rate(best('shmpipe'))} "
                      f"{fmt_rate(pool[0])} {pool[1]:>7} {fmt_rate(ex[0])} {ex[1]:>7} "
                      f"{ratio:6.2f} {verdict:>5}  {start:7.2f} {cpu:7.1f} {peer_cpu:7.1f} "
                      f"{peer_cpu / cpu:9.2f}", flush=True)
            if len(workers_list) > 1:
                lo, hi = workers_list[0], workers_list[-1]
                scaling[(step_name, size)] = median(
                    [b["shmpipe"]["rate"] / a["shmpipe"]["rate"]
                     for a, b in zip(res[lo], res[hi])])
            del items
    if "heavy" in steps and len(workers_list) > 1:
        lo, hi = workers_list[0], workers_list[-1]
        print(f"# shmpipe, {hi} workers / {lo} (median over rounds; goal with the heavy step "
              f">= 1.8x):")
        for (step_name, size), s in scaling.items():
            mark = ("met" if s >= 1.8 else "NOT met") if step_name == "heavy" else ""
            print(f"#   {step_name:7} {size:>8} floats: {s:.2f}x {mark}")
    if not args.no_startup:
        n_items, width = (2000, 100_000) if not args.quick else (50, 100_000)
        first, pss, dataset = startup_and_memory(n_items, width, 2)
        print(f"# in-memory list of {n_items} items of {width} float32 "
              f"({dataset / 1e6:.0f} MB), 2 workers: first output after {first:.3f} s "
              f"(goal < 0.5 s: {'met' if first < 0.5 else 'NOT met'}), peak summed PSS "
              f"{pss:.2f}x the dataset (goal < 1.3x: {'met' if pss < 1.3 else 'NOT met'})")
    print(f"# done {now()}  load {load()}")


if __name__ == "__main__":
    main()
