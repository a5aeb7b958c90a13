#!/usr/bin/env python3
"""Write golden fixtures for crates/timeseries from GluonTS itself.

Runs GluonTS 0.17's own reader and transformations on small datasets with
deterministic samplers and writes the inputs and the expected arrays as JSON
into crates/timeseries/tests/fixtures/. The Rust tests read only those files.

    pip install gluonts==0.17.0 pandas numpy packaging pyarrow
    python3 tools/gluonts_fixtures.py            # JSON fixtures, then the Arrow ones
    python3 tools/gluonts_fixtures.py --arrow    # only the Arrow/Parquet fixtures

The Arrow/Parquet fixtures (tests/fixtures/arrow/) are the datasets of the JSON
cases (their `lines`), written by GluonTS's own `ArrowWriter` (IPC file and
stream) and `ParquetWriter`, with 2-D fields flattened (`<field>._np_shape`,
GluonTS's default) and, for one dataset, as nested lists (`flatten_arrays=False`).
"""

import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import List

import numpy as np
import pandas as pd

import gluonts
from gluonts.dataset.common import FileDataset
from gluonts.dataset.field_names import FieldName
from gluonts.time_feature import time_features_from_frequency_str
from gluonts.transform import (
    AddAgeFeature,
    AddObservedValuesIndicator,
    AddTimeFeatures,
    AsNumpyArray,
    Chain,
    InstanceSplitter,
    TestSplitSampler,
    ValidationSplitSampler,
    VstackFeatures,
)
from gluonts.transform.sampler import InstanceSampler

warnings.filterwarnings("ignore")
assert gluonts.__version__ == "0.17.0", gluonts.__version__

OUT = Path(__file__).resolve().parent.parent / "crates/timeseries/tests/fixtures"


class FixedSampler(InstanceSampler):
    """Deterministic sampler returning given split points (clipped to the series)."""

    points: List[int] = []

    def __call__(self, ts: np.ndarray) -> np.ndarray:
        n = ts.shape[self.axis]
        return np.array([p for p in self.points if p <= n], dtype=int)


def arr(a):
    a = np.asarray(a, dtype=np.float64)
    return {"shape": list(a.shape), "data": [float(x) for x in a.ravel()]}


def period_str(p):
    return str(p.start_time)


def entry_json(e):
    out = {"fields": {}}
    for k, v in e.items():
        if k in ("start", "forecast_start"):
            out[k] = period_str(v)
        elif k == "item_id":
            out[k] = None if v is None else str(v)
        elif isinstance(v, np.ndarray):
            out["fields"][k] = arr(v)
        else:
            # Unknown keys GluonTS passes through untouched (and its `source`
            # bookkeeping); the Rust reader drops them.
            out.setdefault("skipped", []).append(k)
    return out


def rng_series(rng, n, nan_every=None, dim=None):
    shape = (n,) if dim is None else (dim, n)
    v = np.round(rng.normal(10.0, 3.0, size=shape), 3)
    vals = v.tolist()
    if nan_every:
        flat = vals if dim is None else vals[0]
        for i in range(1, n, nan_every):
            flat[i] = None if i % 2 else "NaN"
    return vals


def write_lines(lines):
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        for line in lines:
            f.write(line + "\n")
    return Path(path)


def run_case(name, freq, records, *, past, future, pred, sampler, is_train,
             target_ndim=1, vstack_extra=()):
    lines = [json.dumps(r) for r in records]
    path = write_lines(lines)
    try:
        ds = list(FileDataset(path, freq=freq, one_dim_target=(target_ndim == 1)))
    finally:
        os.unlink(path)

    vstack_inputs = [FieldName.FEAT_TIME, FieldName.FEAT_AGE] + list(vstack_extra)
    feats = time_features_from_frequency_str(freq)
    map_chain = Chain([
        AsNumpyArray(field=FieldName.TARGET, expected_ndim=target_ndim),
        AddObservedValuesIndicator(
            target_field=FieldName.TARGET,
            output_field=FieldName.OBSERVED_VALUES,
        ),
        AddTimeFeatures(
            start_field=FieldName.START,
            target_field=FieldName.TARGET,
            output_field=FieldName.FEAT_TIME,
            time_features=feats,
            pred_length=pred,
        ),
        AddAgeFeature(
            target_field=FieldName.TARGET,
            output_field=FieldName.FEAT_AGE,
            pred_length=pred,
            log_scale=True,
        ),
        VstackFeatures(
            output_field=FieldName.FEAT_TIME,
            input_fields=vstack_inputs,
        ),
    ])
    if sampler["kind"] == "validation":
        s = ValidationSplitSampler(min_past=sampler["min_past"], min_future=sampler["min_future"])
    elif sampler["kind"] == "test":
        s = TestSplitSampler(min_past=sampler["min_past"])
    else:
        s = FixedSampler(points=sampler["points"])
    splitter = InstanceSplitter(
        target_field=FieldName.TARGET,
        is_pad_field=FieldName.IS_PAD,
        start_field=FieldName.START,
        forecast_start_field=FieldName.FORECAST_START,
        instance_sampler=s,
        past_length=past,
        future_length=future,
        time_series_fields=[FieldName.FEAT_TIME, FieldName.OBSERVED_VALUES],
    )
    transformed = list(map_chain.apply([dict(d) for d in ds], is_train=is_train))
    windows = list((map_chain + splitter).apply([dict(d) for d in ds], is_train=is_train))

    # Stack like batchify when every window has the same shapes (the fixed-point
    # cases include short future windows near the end, which cannot be stacked).
    batch = {}
    if windows:
        for k in windows[0]:
            if isinstance(windows[0][k], np.ndarray):
                if len({w[k].shape for w in windows}) != 1:
                    batch = None
                    break
                batch[k] = arr(np.stack([w[k] for w in windows]))

    return {
        "name": name,
        "freq": freq,
        "lines": lines,
        "is_train": is_train,
        "past_length": past,
        "future_length": future,
        "pred_length": pred,
        "target_ndim": target_ndim,
        "vstack_inputs": vstack_inputs,
        "sampler": sampler,
        "time_features": [f.__name__ for f in feats],
        "transformed": [entry_json(e) for e in transformed],
        "windows": [entry_json(w) for w in windows],
        "batch": batch,
    }


def main():
    rng = np.random.default_rng(20240611)
    hourly = [
        {"start": "2021-12-31 20:00:00", "item_id": "a", "target": rng_series(rng, 60, 7),
         "feat_static_cat": [1], "feat_static_real": [0.5],
         "feat_dynamic_real": rng_series(rng, 60, dim=2)},
        {"start": "2024-02-28 22:30:00", "item_id": "b", "target": rng_series(rng, 10, 3),
         "feat_static_cat": [0], "feat_static_real": [1.5],
         "feat_dynamic_real": rng_series(rng, 10, dim=2)},
        {"start": "2020-03-29T01:00:00", "item_id": 7, "target": rng_series(rng, 40, 5),
         "feat_static_cat": [2], "feat_static_real": [-2.0],
         "feat_dynamic_real": rng_series(rng, 40, dim=2), "ignored": {"x": [1, 2]}},
        {"start": "2019-12-30 23:00:00", "item_id": "d", "target": rng_series(rng, 31),
         "feat_static_cat": [3], "feat_static_real": [0.0],
         "feat_dynamic_real": rng_series(rng, 31, dim=2)},
    ]
    daily = [
        {"start": "2020-02-27", "item_id": "x", "target": rng_series(rng, 400, 11)},
        {"start": "2023-12-25", "item_id": "y", "target": rng_series(rng, 20, 4)},
        {"start": "2016-12-31", "item_id": "z", "target": rng_series(rng, 9)},
    ]
    multi = [
        {"start": "2022-06-01 00:00:00", "item_id": "m0", "target": rng_series(rng, 50, 6, dim=3)},
        {"start": "2022-06-03 05:00:00", "item_id": "m1", "target": rng_series(rng, 12, 5, dim=3)},
    ]
    weekly = [
        {"start": "2020-12-20", "item_id": "w", "target": rng_series(rng, 80, 9)},
    ]
    monthly = [
        {"start": "2019-11-15", "item_id": "mo", "target": rng_series(rng, 30, 4)},
    ]
    cases = [
        run_case("hourly_validation", "h", hourly, past=24, future=6, pred=6, is_train=True,
                 sampler={"kind": "validation", "min_past": 0, "min_future": 6},
                 vstack_extra=[FieldName.FEAT_DYNAMIC_REAL]),
        run_case("hourly_fixed_points", "h", hourly, past=24, future=6, pred=6, is_train=True,
                 sampler={"kind": "fixed", "points": [0, 1, 5, 24, 25, 33, 57, 60]},
                 vstack_extra=[FieldName.FEAT_DYNAMIC_REAL]),
        # In inference the features are `pred` longer than the target, so the
        # (target-length) dynamic features are not stacked here.
        run_case("hourly_test", "h", hourly, past=24, future=6, pred=6, is_train=False,
                 sampler={"kind": "test", "min_past": 0}),
        run_case("daily_validation", "D", daily, past=14, future=7, pred=7, is_train=True,
                 sampler={"kind": "validation", "min_past": 0, "min_future": 7}),
        run_case("daily_test", "D", daily, past=14, future=7, pred=7, is_train=False,
                 sampler={"kind": "test", "min_past": 0}),
        run_case("multivariate_fixed", "h", multi, past=16, future=4, pred=4, is_train=True,
                 target_ndim=2, sampler={"kind": "fixed", "points": [3, 16, 20, 46]}),
        run_case("weekly_validation", "W", weekly, past=20, future=4, pred=4, is_train=True,
                 sampler={"kind": "validation", "min_past": 0, "min_future": 4}),
        run_case("monthly_test", "M", monthly, past=12, future=3, pred=3, is_train=False,
                 sampler={"kind": "test", "min_past": 0}),
    ]

    tf = []
    for freq, start, n in [
        ("30s", "2020-12-31 23:58:00", 300),
        ("15min", "2021-12-31 22:00:00", 200),
        ("h", "2019-12-28 00:00:00", 400),
        ("2h", "2024-02-27 01:00:00", 100),
        ("D", "2019-12-01", 800),
        ("W", "2015-12-01", 120),
        ("W-WED", "2020-12-15", 60),
        ("M", "2019-01-31", 40),
        ("Q", "2019-05-01", 12),
        ("Y", "2000-01-01", 5),
    ]:
        feats = time_features_from_frequency_str(freq)
        start_p = pd.Period(start, freq=freq)
        index = pd.period_range(start_p, periods=n, freq=start_p.freq)
        values = [np.asarray(f(index), dtype=np.float64).astype(np.float32) for f in feats]
        tf.append({
            "freq": freq,
            "start": start,
            "periods": n,
            "names": [f.__name__ for f in feats],
            "start_time": str(start_p.start_time),
            "last_start_time": str(index[-1].start_time),
            "values": [[float(x) for x in v] for v in values],
        })

    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "gluonts_transforms.json", "w") as f:
        json.dump({"gluonts_version": gluonts.__version__, "pandas_version": pd.__version__,
                   "cases": cases}, f, separators=(",", ":"))
    with open(OUT / "gluonts_time_features.json", "w") as f:
        json.dump({"gluonts_version": gluonts.__version__, "pandas_version": pd.__version__,
                   "cases": tf}, f, separators=(",", ":"))
    for p in sorted(OUT.iterdir()):
        print(f"{p}: {p.stat().st_size} bytes")


def write_arrow_fixtures():
    """GluonTS's Arrow/Parquet writers on the datasets of the JSON cases."""
    from gluonts.dataset.arrow import ArrowWriter, ParquetWriter, File

    with open(OUT / "gluonts_transforms.json") as f:
        cases = json.load(f)["cases"]
    datasets = {}
    for c in cases:
        key = (c["freq"], c["target_ndim"], tuple(c["lines"]))
        datasets.setdefault(key, []).append(c["name"])
    out = OUT / "arrow"
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for (freq, ndim, lines), names in datasets.items():
        name = names[0].split("_")[0]
        path = write_lines(lines)
        try:
            entries = list(FileDataset(path, freq=freq, one_dim_target=(ndim == 1)))
        finally:
            os.unlink(path)
        for e in entries:
            # Arrow columns have one type: GluonTS cannot write a column mixing
            # string and integer ids, so ids become their JSON text, as the Rust
            # JSON reader keeps them.
            if "item_id" in e and e["item_id"] is not None:
                e["item_id"] = str(e["item_id"])
        files = []
        writers = [
            (f"{name}.feather", ArrowWriter()),
            (f"{name}-stream.arrow", ArrowWriter(stream=True)),
            (f"{name}.parquet", ParquetWriter()),
        ]
        if name == "hourly":
            writers.append((f"{name}-nested.feather", ArrowWriter(flatten_arrays=False)))
        for fname, writer in writers:
            writer.write_to_file(entries, out / fname)
            # GluonTS reads back what it wrote: the same entries.
            back = list(FileDataset(out / fname, freq=freq, one_dim_target=(ndim == 1)))
            assert len(back) == len(entries), fname
            for a, b in zip(entries, back):
                for k, v in a.items():
                    if isinstance(v, np.ndarray):
                        assert np.array_equal(v, b[k], equal_nan=True), (fname, k)
            files.append({"file": fname, "kind": type(File.infer(out / fname)).__name__})
        if name == "hourly":
            # Compressed buffers: not supported by the Rust reader (a clear error);
            # not in the manifest's file list.
            ArrowWriter(compression="lz4").write_to_file(entries, out / f"{name}-lz4.feather")
        if name == "daily":
            # Raw records as a user would write them (string `start`, Python
            # floats with None for missing values): float64 lists with Arrow nulls.
            raw = []
            for line in lines:
                r = json.loads(line)
                r["target"] = [None if isinstance(x, str) or x is None else float(x)
                               for x in r["target"]]
                raw.append(r)
            fname = f"{name}-raw.feather"
            ArrowWriter().write_to_file(raw, out / fname)
            back = list(FileDataset(out / fname, freq=freq))
            for a, b in zip(entries, back):
                assert np.array_equal(a["target"], b["target"], equal_nan=True), fname
            files.append({"file": fname, "kind": type(File.infer(out / fname)).__name__})
        manifest.append({"dataset": name, "freq": freq, "target_ndim": ndim,
                         "cases": names, "files": files})
    with open(out / "manifest.json", "w") as f:
        json.dump({"gluonts_version": gluonts.__version__, "datasets": manifest}, f, indent=1)
    for p in sorted(out.iterdir()):
        print(f"{p}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    if "--arrow" not in sys.argv[1:]:
        main()
    write_arrow_fixtures()
