"""Steps of test_big_items.py (importable by the worker processes)."""

import numpy as np


def scale(item):
    item["x"] = item["x"] * 2
    return item


def grow(item):
    """A small input becomes a 24 MB output."""
    item["big"] = np.full(6_000_000, item["n"], dtype=np.float32)
    return item
