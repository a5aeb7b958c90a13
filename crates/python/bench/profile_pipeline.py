"""Where the time of a Python pipeline goes, per process: CPU seconds of the parent (all its
threads: Python, the pump, the input thread) and of every child, over one run of small items.

The setup of issue 18's profile: ``item["x"] = item["x"] * 2`` on items of 16 float32,
``workers=2``, an in-memory list. CPU times come from ``/proc/<pid>/stat`` (children, read
until just before they exit) and ``getrusage`` (this process); the machine's load does not
move them much, unlike wall time.

    python bench/profile_pipeline.py [--items 400000] [--size 16] [--workers 2]
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import threading
import time

import numpy as np

import shmpipe

TCK = os.sysconf("SC_CLK_TCK")


def double(item):
    item["x"] = item["x"] * 2
    return item


def proc_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read().rsplit(")", 1)[1].split()
        return (int(st[11]) + int(st[12])) / TCK
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=400_000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    items = [{"x": np.full(a.size, i, dtype=np.float32)} for i in range(a.items)]
    p = shmpipe.Pipeline(items, steps=[double], workers=a.workers)
    seen: dict[int, float] = {}
    stop = threading.Event()

    def sample():
        # The children's CPU time, until they are gone (the last reading counts).
        while not stop.is_set():
            for pid in list(p.pids):
                c = proc_cpu(pid)
                if c is not None:
                    seen[pid] = c
            time.sleep(0.05)

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    n = 0
    for _ in p:
        n += 1
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    assert n == a.items, (n, a.items)
    parent = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# {now}, load {load}; {a.items} items of {a.size} float32, workers={a.workers}, "
          f"in-memory list, step double")
    print(f"wall {wall:.2f} s, {a.items / wall / 1e3:.0f} k items/s")
    print(f"{'process':<28} {'CPU s':>7} {'us/item':>8}")
    print(f"{'parent (all threads)':<28} {parent:7.2f} {parent / a.items * 1e6:8.2f}")
    for i, (pid, c) in enumerate(sorted(seen.items())):
        print(f"{f'child {i} (pid {pid})':<28} {c:7.2f} {c / a.items * 1e6:8.2f}")
    total = parent + sum(seen.values())
    print(f"{'all':<28} {total:7.2f} {total / a.items * 1e6:8.2f}")


if __name__ == "__main__":
    main()
