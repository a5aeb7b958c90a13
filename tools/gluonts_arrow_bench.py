#!/usr/bin/env python3
"""GluonTS 0.17 reading its own Arrow file: the anchor for the Arrow source.

Converts a JSON-lines dataset to GluonTS's Arrow IPC file format with GluonTS's
own `ArrowWriter` (`--write`), and measures GluonTS's `TrainDataLoader` over
`FileDataset(<file>.feather)` (which reads through `gluonts.dataset.arrow.ArrowFile`)
with the same DeepAR-style chain as `gluonts_loader_bench.py` (context 168,
prediction 24, batch 32, single process).

    pip install gluonts==0.17.0 pandas numpy pyarrow
    python3 tools/gluonts_arrow_bench.py --write /tmp/ts.jsonl /tmp/ts.feather
    python3 tools/gluonts_arrow_bench.py /tmp/ts.feather --seconds 20 [--json]
"""

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import gluonts
from gluonts.dataset.arrow import ArrowFile, ArrowWriter
from gluonts.dataset.common import FileDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gluonts_loader_bench import measure  # noqa: E402  (same chain and loader)

warnings.filterwarnings("ignore")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path", type=Path)
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--write", action="store_true",
                    help="convert the JSON-lines file `path` to the Arrow file `out`")
    ap.add_argument("--freq", default="h")
    ap.add_argument("--context", type=int, default=168)
    ap.add_argument("--pred", type=int, default=24)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    if args.write:
        t0 = time.perf_counter()
        entries = list(FileDataset(args.path, freq=args.freq))
        ArrowWriter().write_to_file(entries, args.out)
        print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(entries)} series) "
              f"in {time.perf_counter() - t0:.1f} s")
        return

    np.random.seed(0)
    ds = FileDataset(args.path, freq=args.freq)
    n = len(ArrowFile(args.path))
    res = {
        "gluonts": gluonts.__version__,
        "series": n,
        "arrow": measure(ds, args),
    }
    if args.json:
        print(json.dumps(res))
    else:
        r = res["arrow"]
        print(f"GluonTS {res['gluonts']} ArrowFile, {n} series: "
              f"{r['windows_per_sec']:.0f} windows/s ({r['windows_per_cpu_sec']:.0f} per CPU-s)")


if __name__ == "__main__":
    main()
