"""Steps of test_pipeline_fidelity.py and test_pipeline_sources.py (importable by workers)."""

import os
import time

import numpy as np


def same(item):
    """Passes every item on unchanged, whatever it is."""
    return item


def signature(x):
    """The types, dtypes and shapes of a value, recursively (what a round trip must keep)."""
    if isinstance(x, dict):
        return {k: signature(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [signature(v) for v in x])
    if isinstance(x, np.ndarray):
        return ("ndarray", str(x.dtype), x.shape)
    if isinstance(x, np.generic):
        return ("scalar", type(x).__name__, str(x.dtype))
    return type(x).__name__


def sign(item):
    """Records, inside the worker, the signature of the dict it received."""
    return {"item": item, "sig": signature(item)}


def to_set(item):
    """An output that cannot cross processes."""
    return {"s": {1, 2}}


def pid_of(item):
    return {"pid": os.getpid(), "item": item}


def row_sum(row):
    """A row of a numpy array source in, its sum out (a numpy scalar)."""
    return row.sum()


def slow_tenth(item):
    time.sleep(0.01)
    return item
