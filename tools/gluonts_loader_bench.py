#!/usr/bin/env python3
"""Throughput of GluonTS 0.17's own training loader: the in-run anchor.

Runs the same DeepAR-style chain as shmpipe-timeseries' workload
(AsNumpyArray, AddObservedValuesIndicator, AddTimeFeatures, AddAgeFeature,
VstackFeatures, InstanceSplitter with ExpectedNumInstanceSampler(num_instances=1,
min_future=prediction_length)), context 168, prediction 24, batch 32, hourly,
through GluonTS's TrainDataLoader with a numpy stack function, single process.

Two sources: the JSON-lines file read on each pass (FileDataset), and the same
series already parsed in memory (a list of processed entries).

    cargo run --release -p shmpipe-timeseries --example gen_dataset -- --out /tmp/ts.jsonl
    python3 tools/gluonts_loader_bench.py /tmp/ts.jsonl --seconds 20
"""

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np

import gluonts
from gluonts.dataset.common import FileDataset
from gluonts.dataset.field_names import FieldName
from gluonts.dataset.loader import TrainDataLoader
from gluonts.time_feature import time_features_from_frequency_str
from gluonts.transform import (
    AddAgeFeature,
    AddObservedValuesIndicator,
    AddTimeFeatures,
    AsNumpyArray,
    Chain,
    ExpectedNumInstanceSampler,
    InstanceSplitter,
    VstackFeatures,
)

warnings.filterwarnings("ignore")


def chain(freq, context, pred):
    return Chain([
        AsNumpyArray(field=FieldName.TARGET, expected_ndim=1),
        AddObservedValuesIndicator(
            target_field=FieldName.TARGET, output_field=FieldName.OBSERVED_VALUES
        ),
        AddTimeFeatures(
            start_field=FieldName.START,
            target_field=FieldName.TARGET,
            output_field=FieldName.FEAT_TIME,
            time_features=time_features_from_frequency_str(freq),
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
            input_fields=[FieldName.FEAT_TIME, FieldName.FEAT_AGE],
        ),
        InstanceSplitter(
            target_field=FieldName.TARGET,
            is_pad_field=FieldName.IS_PAD,
            start_field=FieldName.START,
            forecast_start_field=FieldName.FORECAST_START,
            instance_sampler=ExpectedNumInstanceSampler(
                num_instances=1.0, min_future=pred
            ),
            past_length=context,
            future_length=pred,
            time_series_fields=[FieldName.FEAT_TIME, FieldName.OBSERVED_VALUES],
        ),
    ])


def stack(rows):
    out = {}
    for k in rows[0]:
        v = [r[k] for r in rows]
        out[k] = np.stack(v) if isinstance(v[0], np.ndarray) else v
    return out


def measure(dataset, args):
    loader = TrainDataLoader(
        dataset,
        transform=chain(args.freq, args.context, args.pred),
        batch_size=args.batch,
        stack_fn=stack,
    )
    it = iter(loader)
    next(it)  # warm-up
    windows = batches = nbytes = 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    while time.perf_counter() - t0 < args.seconds:
        b = next(it)
        batches += 1
        windows += len(b["past_target"])
        nbytes += sum(v.nbytes for v in b.values() if isinstance(v, np.ndarray))
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {
        "windows_per_sec": windows / dt,
        # Robust to other load on the machine: windows per CPU-second of this process.
        "windows_per_cpu_sec": windows / cpu,
        "batches_per_sec": batches / dt,
        "batch_mb_per_sec": nbytes / dt / 1e6,
        "windows": windows,
        "seconds": dt,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path", type=Path)
    ap.add_argument("--freq", default="h")
    ap.add_argument("--context", type=int, default=168)
    ap.add_argument("--pred", type=int, default=24)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    np.random.seed(0)
    file_ds = FileDataset(args.path, freq=args.freq)
    t0 = time.perf_counter()
    in_memory = list(file_ds)
    parse_s = time.perf_counter() - t0
    size = args.path.stat().st_size
    res = {
        "gluonts": gluonts.__version__,
        "json_variant": gluonts.json.variant,
        "series": len(in_memory),
        "parse_mb_per_sec": size / parse_s / 1e6,
        "jsonl": measure(file_ds, args),
        "memory": measure(in_memory, args),
    }
    if args.json:
        print(json.dumps(res))
    else:
        print(f"GluonTS {res['gluonts']} ({res['json_variant']}), {res['series']} series, "
              f"reader {res['parse_mb_per_sec']:.1f} MB/s")
        for k in ("jsonl", "memory"):
            r = res[k]
            print(f"  {k:6}: {r['windows_per_sec']:8.0f} windows/s "
                  f"({r['windows_per_cpu_sec']:.0f} per CPU-s)  "
                  f"{r['batches_per_sec']:6.1f} batches/s  {r['batch_mb_per_sec']:6.1f} MB/s")


if __name__ == "__main__":
    main()
