"""The GluonTS-style loaders from Python (shmpipe.timeseries.TrainLoader, ValidationLoader,
TestLoader) on a generated file (2,000 hourly series of 500-5,000 points, 1% nulls, floats as
Python writes float64: ~105 MB of JSON lines), against GluonTS's own ``TrainDataLoader`` with
the same chain in the same run (goal: TrainLoader >= 20x), the Rust ``timeseries_loader``
example on the same file (``--rust``), and the three loaders on a file of one 200,000-point
series (``--one-long``: items far larger than a pool block, as documented, no settings).

    python crates/python/bench/bench_timeseries.py [--rust] [--one-long] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import tempfile
import time

import numpy as np

from series_files import write_hourly_series
from shmpipe.timeseries import TestLoader, TrainLoader, ValidationLoader

CONTEXT, PRED, BATCH = 168, 24, 32


def eval_loaders(path: str, workers: int) -> str:
    """One pass of ValidationLoader and TestLoader: windows and seconds each."""
    parts = []
    for Loader in (ValidationLoader, TestLoader):
        t0 = time.perf_counter()
        n = sum(b["past_target"].shape[0] for b in Loader(
            path, freq="h", context_length=CONTEXT, prediction_length=PRED, batch_size=BATCH,
            workers=workers))
        parts.append(f"{Loader.__name__} {n} windows in {time.perf_counter() - t0:.2f}s")
    return "; ".join(parts)


def one_long(workers: int) -> None:
    """The three loaders, as documented, on a file holding one 200,000-point series."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "one.jsonl")
        write_hourly_series(path, 1, lo=200_000, hi=200_000)
        print(f"# one series of 200,000 points: {os.path.getsize(path) / 1e6:.1f} MB of JSON")
        t0 = time.perf_counter()
        loader = TrainLoader(path, freq="h", context_length=CONTEXT, prediction_length=PRED,
                             batch_size=BATCH, num_batches_per_epoch=2, workers=workers)
        n = sum(b["past_target"].shape[0] for b in loader)
        loader.close()
        print(f"TrainLoader: {n} windows in {time.perf_counter() - t0:.2f}s; "
              + eval_loaders(path, workers))


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its reaped children."""
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, ch.ru_utime + ch.ru_stime


def python_loader(path: str, workers: int, batches: int) -> tuple[float, float, str]:
    """Windows per second (after a warm-up) and windows per CPU-second of every process of the
    loader (this one, the emitter and the workers, reaped at close; start-up and warm-up
    included), which moves far less with the machine's load than the wall clock."""
    me0, ch0 = cpu_seconds()
    loader = TrainLoader(path, freq="h", context_length=CONTEXT, prediction_length=PRED,
                         batch_size=BATCH, num_batches_per_epoch=batches, workers=workers,
                         shuffle=False)
    it = iter(loader)
    warm = 0
    for _ in range(min(20, batches // 5)):  # warm-up: processes started, pipes full
        warm += next(it)["past_target"].shape[0]
    t0 = time.perf_counter()
    n = 0
    for b in loader:
        n += b["past_target"].shape[0]
    dt = time.perf_counter() - t0
    loader.close()
    me1, ch1 = cpu_seconds()
    cpu = (me1 - me0) + (ch1 - ch0)
    how = f"CPU {me1 - me0:.2f}s here + {ch1 - ch0:.2f}s in its processes"
    return n / dt, (n + warm) / cpu, how


def rust_loader(path: str, workers: int) -> float | None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    cmd = ["cargo", "run", "--release", "-q", "-p", "shmpipe-timeseries", "--example",
           "timeseries_loader", "--", "--data", path, "--workers", str(workers),
           "--json-epochs", "2", "--memory-epochs", "1"]
    res = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=3600)
    for line in res.stdout.splitlines():  # the first figure: JSON parsed on every pass
        m = re.search(r"([\d.]+) windows/s", line)
        if m:
            return float(m.group(1))
    print(res.stdout[-1500:], res.stderr[-1500:])
    return None


def gluonts_loader(path: str, batches: int) -> tuple[float, float] | None:
    try:
        from gluonts.dataset.common import FileDataset
        from gluonts.dataset.field_names import FieldName
        from gluonts.dataset.loader import TrainDataLoader
        from gluonts.time_feature import time_features_from_frequency_str
        from gluonts.transform import (AddAgeFeature, AddObservedValuesIndicator,
                                       AddTimeFeatures, AsNumpyArray, Chain,
                                       ExpectedNumInstanceSampler, InstanceSplitter,
                                       VstackFeatures)
    except ImportError:
        return None
    chain = Chain([
        AsNumpyArray(field=FieldName.TARGET, expected_ndim=1),
        AddObservedValuesIndicator(target_field=FieldName.TARGET,
                                   output_field=FieldName.OBSERVED_VALUES),
        AddTimeFeatures(start_field=FieldName.START, target_field=FieldName.TARGET,
                        output_field=FieldName.FEAT_TIME,
                        time_features=time_features_from_frequency_str("h"),
                        pred_length=PRED),
        AddAgeFeature(target_field=FieldName.TARGET, output_field=FieldName.FEAT_AGE,
                      pred_length=PRED, log_scale=True),
        VstackFeatures(output_field=FieldName.FEAT_TIME,
                       input_fields=[FieldName.FEAT_TIME, FieldName.FEAT_AGE]),
        InstanceSplitter(target_field=FieldName.TARGET, is_pad_field=FieldName.IS_PAD,
                         start_field=FieldName.START, forecast_start_field=FieldName.FORECAST_START,
                         instance_sampler=ExpectedNumInstanceSampler(num_instances=1.0,
                                                                     min_future=PRED),
                         past_length=CONTEXT, future_length=PRED,
                         time_series_fields=[FieldName.FEAT_TIME, FieldName.OBSERVED_VALUES]),
    ])
    def stack(rows):
        return {k: np.stack([r[k] for r in rows]) if isinstance(rows[0][k], np.ndarray)
                else [r[k] for r in rows] for k in rows[0]}

    ds = FileDataset(path, freq="h")
    loader = TrainDataLoader(ds, transform=chain, batch_size=BATCH, stack_fn=stack,
                             num_batches_per_epoch=batches)
    t0, c0 = time.perf_counter(), cpu_seconds()[0]
    n = sum(b["past_target"].shape[0] for b in loader)
    return n / (time.perf_counter() - t0), n / (cpu_seconds()[0] - c0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=1500, help="TrainLoader batches timed")
    ap.add_argument("--gluonts-batches", type=int, default=100,
                    help="GluonTS batches timed (~220-250 windows/s: 100 batches take ~15 s)")
    ap.add_argument("--rust", action="store_true", help="run the Rust example too (cargo)")
    ap.add_argument("--data", help="use this JSON-lines file instead of generating one")
    ap.add_argument("--one-long", action="store_true",
                    help="also run the loaders on a file of one 200,000-point series")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = a.data or os.path.join(d, "train.jsonl")
        if not a.data:
            write_hourly_series(path, a.series)
        print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} load {os.getloadavg()[0]:.2f}, "
              f"{os.path.getsize(path) / 1e6:.1f} MB, workers {a.workers}")
        py, py_cpu, how = python_loader(path, a.workers, a.batches)
        print(f"shmpipe.timeseries.TrainLoader: {py:,.0f} windows/s, {py_cpu:,.0f} windows per "
              f"CPU-second ({how})")
        print(eval_loaders(path, a.workers))
        if a.rust:
            rs = rust_loader(path, a.workers)
            if rs:
                print(f"Rust timeseries_loader example: {rs:,.0f} windows/s; Python / Rust = "
                      f"{py / rs:.2f}x (goal >= 0.8x: {'met' if py / rs >= 0.8 else 'NOT met'})")
        gl = gluonts_loader(path, a.gluonts_batches)
        if gl is None:
            print("GluonTS TrainDataLoader: gluonts not installed (pip install gluonts to compare)")
        else:
            gl, gl_cpu = gl
            ratio = py / gl
            print(f"GluonTS TrainDataLoader (1 process): {gl:,.0f} windows/s, {gl_cpu:,.0f} per "
                  f"CPU-second; shmpipe / GluonTS = {ratio:.1f}x wall (goal >= 20x: "
                  f"{'met' if ratio >= 20 else 'NOT met'}), {py_cpu / gl_cpu:.1f}x per CPU-second")
        try:
            import torch  # noqa: F401
        except ImportError:
            print("PyTorch DataLoader(num_workers=2) over GluonTS's chain: torch not installed")
        if a.one_long:
            one_long(a.workers)
        print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} load at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
