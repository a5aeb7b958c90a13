"""The seed interface measured against its peers, in one run: a trivial Python step over small
items through enqueue/dequeue (one thread; a feeder thread), iteration of a list source
(worker processes started per iteration, or persistent), multiprocessing.Pool, and the loop
in this process; plus the time to the first output of an epoch and the round trip of one
item.

    python crates/python/bench/bench_enqueue.py [--items 50000] [--width 16] [--workers 2]

Build the package with `maturin develop --release` (or pip install) before measuring.
"""

import argparse
import multiprocessing as mp
import os
import statistics
import threading
import time

import numpy as np

import shmpipe


def double(item):
    item["x"] = item["x"] * 2
    return item


def timed(f):
    t0 = time.perf_counter()
    n = f()
    return time.perf_counter() - t0, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    data = [{"n": i, "x": np.full(a.width, i, np.float32)} for i in range(a.items)]
    w = a.workers
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load "
          f"{os.getloadavg()[0]:.1f}; {a.items} items of {a.width} float32, step `double`, "
          f"{w} workers")

    rows = {}
    rows["loop in this process"] = timed(lambda: sum(1 for d in data if double(dict(d))))

    with mp.Pool(w) as pool:
        rows["mp.Pool.imap_unordered(chunksize=256)"] = timed(
            lambda: sum(1 for _ in pool.imap_unordered(double, data, chunksize=256)))

    rows["Pipeline(list) iterated (workers started)"] = timed(
        lambda: sum(1 for _ in shmpipe.Pipeline(data, steps=[double], workers=w)))

    with shmpipe.Pipeline(data, steps=[double], workers=w, persistent_workers=True) as p:
        first = timed(lambda: sum(1 for _ in p))
        rows["Pipeline(list) persistent, 2nd epoch"] = timed(lambda: sum(1 for _ in p))
    rows["Pipeline(list) persistent, 1st epoch"] = first

    def one_thread():
        with shmpipe.Pipeline([double], workers=w) as p:
            p.enqueue_many(data)
            p.close_input()
            return sum(1 for _ in p)
    rows["enqueue_many + dequeue, one thread"] = timed(one_thread)

    def two_threads():
        with shmpipe.Pipeline([double], workers=w).start() as p:
            def feed():
                p.enqueue_many(data)
                p.close_input()
            t = threading.Thread(target=feed)
            t.start()
            n = sum(1 for _ in iter(p.dequeue, None))
            t.join()
            return n
    rows["enqueue (feeder thread) + dequeue"] = timed(two_threads)

    rows["workers=0 (in this process)"] = timed(
        lambda: sum(1 for _ in shmpipe.Pipeline(data, steps=[double], workers=0)))

    pool_t = rows["mp.Pool.imap_unordered(chunksize=256)"][0]
    print(f"| path | s | items/s | vs mp.Pool |\n|---|---:|---:|---:|")
    for name, (t, n) in rows.items():
        assert n == a.items, (name, n)
        print(f"| {name} | {t:.2f} | {n / t / 1e3:.1f} k | {pool_t / t:.2f}x |")

    # Time to the first output of an epoch.
    t0 = time.perf_counter()
    it = iter(shmpipe.Pipeline(data[:1000], steps=[double], workers=w))
    next(it)
    cold = time.perf_counter() - t0
    it.close()
    with shmpipe.Pipeline(data[:1000], steps=[double], workers=w).start() as p:
        sum(1 for _ in p)
        t0 = time.perf_counter()
        it = iter(p)
        next(it)
        warm = time.perf_counter() - t0
        it.close()
    print(f"first output of an epoch: workers started {cold * 1e3:.0f} ms, persistent "
          f"{warm * 1e3:.1f} ms ({cold / warm:.0f}x)")

    # One item at a time: enqueue, then dequeue its output.
    with shmpipe.Pipeline([double], workers=w).start() as p:
        lat = []
        for d in data[:2000]:
            t0 = time.perf_counter()
            p.enqueue(d)
            p.dequeue()
            lat.append(time.perf_counter() - t0)
    lat.sort()
    print(f"round trip of one item: median {statistics.median(lat) * 1e6:.0f} us, "
          f"p99 {lat[int(len(lat) * 0.99)] * 1e6:.0f} us")


if __name__ == "__main__":
    main()
