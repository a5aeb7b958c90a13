"""The GluonTS-style training loader from Python (shmpipe.timeseries.TrainLoader) on a
generated file (2,000 hourly series of 500-5,000 points with nulls), against the Rust
``timeseries_loader`` example on the same file (``--rust``, same run), and GluonTS's own
``TrainDataLoader`` with the same chain when gluonts is installed (measuring only).

    python crates/python/bench/bench_timeseries.py [--rust] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time

import numpy as np

from shmpipe.timeseries import TrainLoader

CONTEXT, PRED, BATCH = 168, 24, 32


def generate(path: str, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            length = int(rng.integers(500, 5001))
            y = np.round(rng.gamma(2.0, 5.0, length), 3)
            t = [None if m else float(v) for v, m in zip(y, rng.random(length) < 0.02)]
            f.write(json.dumps({"start": "2020-01-01 00:00:00", "item_id": f"s{i}",
                                "target": t}) + "\n")


def python_loader(path: str, workers: int, batches: int) -> float:
    loader = TrainLoader(path, freq="h", context_length=CONTEXT, prediction_length=PRED,
                         batch_size=BATCH, num_batches_per_epoch=batches, workers=workers,
                         shuffle=False)
    it = iter(loader)
    for _ in range(min(20, batches // 5)):  # warm-up: processes started, pipes full
        next(it)
    t0 = time.perf_counter()
    n = 0
    for b in loader:
        n += b["past_target"].shape[0]
    dt = time.perf_counter() - t0
    loader.close()
    return n / dt


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


def gluonts_loader(path: str, batches: int) -> float | None:
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
    t0 = time.perf_counter()
    n = sum(b["past_target"].shape[0] for b in loader)
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--rust", action="store_true", help="run the Rust example too (cargo)")
    ap.add_argument("--data", help="use this JSON-lines file instead of generating one")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = a.data or os.path.join(d, "train.jsonl")
        if not a.data:
            generate(path, a.series)
        print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} load {os.getloadavg()[0]:.2f}, "
              f"{os.path.getsize(path) / 1e6:.1f} MB, workers {a.workers}")
        py = python_loader(path, a.workers, a.batches)
        print(f"shmpipe.timeseries.TrainLoader: {py:,.0f} windows/s")
        if a.rust:
            rs = rust_loader(path, a.workers)
            if rs:
                print(f"Rust timeseries_loader example: {rs:,.0f} windows/s; Python / Rust = "
                      f"{py / rs:.2f}x (goal >= 0.8x: {'met' if py / rs >= 0.8 else 'NOT met'})")
        gl = gluonts_loader(path, a.batches // 3)
        if gl is None:
            print("GluonTS TrainDataLoader: gluonts not installed (pip install gluonts to compare)")
        else:
            print(f"GluonTS TrainDataLoader (1 process): {gl:,.0f} windows/s; "
                  f"shmpipe / GluonTS = {py / gl:.1f}x")
        try:
            import torch  # noqa: F401
        except ImportError:
            print("PyTorch DataLoader(num_workers=2) over GluonTS's chain: torch not installed")
        print(f"# load at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
