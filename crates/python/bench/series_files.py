"""GluonTS JSON-lines files of generated hourly series, as users have them (float64 values
as Python writes them, 1% nulls): the data of ``bench_timeseries.py`` and of the tests of
long series (``tests/test_big_items.py``, which find this module through ``conftest.py``)."""

from __future__ import annotations

import json

import numpy as np


def write_hourly_series(path: str, n: int, lo: int = 500, hi: int = 5000,
                        seed: int = 0) -> None:
    """Writes ``n`` hourly series of ``lo..hi`` points (gamma-distributed, 1% nulls) to
    ``path``, with item ids ``s0``, ``s1``, ..."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            length = int(rng.integers(lo, hi + 1))
            y = rng.gamma(2.0, 5.0, length)
            t = [None if m else float(v) for v, m in zip(y, rng.random(length) < 0.01)]
            f.write(json.dumps({"start": "2020-01-01 00:00:00", "item_id": f"s{i}",
                                "target": t}) + "\n")
