"""Rows of windows <-> pipeline items, re-batching in order, and ``stack_fn``.

A worker sends a block of rows (the windows of one batch, or of one series) as one flat
item: every column whose values are numpy arrays of one shape and dtype goes stacked
(``"c{j}"``, zero-copy above the pipeline's threshold); every other column (periods,
item ids, Python scalars, ragged arrays) goes pickled, with the column names and their
order, in the ``"m"`` byte array; ``"n"`` is the number of rows.
"""

from __future__ import annotations

import functools
import pickle
from typing import Any, Callable

import numpy as np

# dtypes a pipeline carries as they are (bool and float16 travel as a same-sized integer
# and are viewed back; anything else, e.g. object or datetime arrays, goes pickled).
_AS_IS = set("iuf")
_VIEWED = {np.dtype(np.bool_): np.uint8, np.dtype(np.float16): np.uint16}


def _stackable(vals: list) -> np.dtype | None:
    v0 = vals[0]
    if type(v0) is not np.ndarray:
        return None
    dt, shape = v0.dtype, v0.shape
    if not (dt.kind in _AS_IS and dt != np.float16) and dt not in _VIEWED:
        return None
    if dt.byteorder == ">":
        return None
    for v in vals:
        if type(v) is not np.ndarray or v.dtype != dt or v.shape != shape:
            return None
    return dt


def encode(rows: list[dict]) -> dict:
    """One item for ``rows`` (dicts with the first row's keys, as GluonTS stacks them)."""
    keys = list(rows[0].keys())
    item: dict[str, Any] = {"n": len(rows)}
    dtypes: dict[int, str] = {}
    other: dict[int, list] = {}
    for j, k in enumerate(keys):
        vals = [r[k] for r in rows]  # KeyError as in GluonTS's stacking
        dt = _stackable(vals)
        if dt is None:
            other[j] = vals
            continue
        a = np.stack(vals)
        if dt in _VIEWED:
            a = a.view(_VIEWED[dt])
        item[f"c{j}"] = a
        dtypes[j] = dt.str
    item["m"] = np.frombuffer(pickle.dumps((keys, dtypes, other), protocol=5), np.uint8)
    return item


class Chunk:
    """Decoded rows: ``keys`` and per column a stacked array (rows first) or a list."""

    __slots__ = ("keys", "cols", "n")

    def __init__(self, keys: list, cols: list, n: int):
        self.keys, self.cols, self.n = keys, cols, n

    def slice(self, a: int, b: int) -> "Chunk":
        return Chunk(self.keys, [c[a:b] for c in self.cols], b - a)

    def rows(self) -> list[dict]:
        return [{k: c[i] for k, c in zip(self.keys, self.cols)} for i in range(self.n)]

    def columns(self) -> dict:
        return dict(zip(self.keys, self.cols))


def decode(item: dict) -> Chunk:
    keys, dtypes, other = pickle.loads(item["m"])
    cols: list = []
    for j in range(len(keys)):
        if j in dtypes:
            a = item[f"c{j}"]
            dt = np.dtype(dtypes[j])
            cols.append(a.view(dt) if a.dtype != dt else a)
        else:
            cols.append(other[j])
    return Chunk(keys, cols, int(item["n"]))


def _concat(parts: list) -> Any:
    if all(type(p) is np.ndarray for p in parts):
        p0 = parts[0]
        if all(p.dtype == p0.dtype and p.shape[1:] == p0.shape[1:] for p in parts):
            return np.concatenate(parts)
    out: list = []
    for p in parts:
        out.extend(list(p))
    return out


def merge(chunks: list[Chunk]) -> Chunk:
    """Rows of ``chunks`` one after another (keys of the first, as GluonTS stacks)."""
    if len(chunks) == 1:
        return chunks[0]
    keys = chunks[0].keys
    index = [{k: j for j, k in enumerate(c.keys)} for c in chunks]
    cols = [_concat([c.cols[ix[k]] for c, ix in zip(chunks, index)]) for k in keys]
    return Chunk(keys, cols, sum(c.n for c in chunks))


class Rebatcher:
    """Cuts a stream of chunks into batches of ``batch_size`` rows, in order, the last one
    partial (GluonTS's ``Batch``)."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.pending: list[Chunk] = []
        self.rows = 0

    def push(self, c: Chunk) -> list[Chunk]:
        out = []
        while c.n:
            take = min(c.n, self.batch_size - self.rows)
            self.pending.append(c.slice(0, take) if take < c.n else c)
            self.rows += take
            c = c.slice(take, c.n) if take < c.n else Chunk(c.keys, [], 0)
            if self.rows == self.batch_size:
                out.append(merge(self.pending))
                self.pending, self.rows = [], 0
        return out

    def finish(self) -> list[Chunk]:
        if not self.pending:
            return []
        b = merge(self.pending)
        self.pending, self.rows = [], 0
        return [b]


# ---- stack_fn -------------------------------------------------------------------------

class ColumnStack:
    """The stacking of GluonTS's ``as_stacked_batches``: every column through ``np.array``,
    then ``output_type`` (e.g. ``torch.tensor``) if given. Stacked columns are used as
    they arrive; with ``output_type=torch.tensor`` they become tensors over the batch's
    memory (``torch.as_tensor``: same values and dtype, no copy)."""

    def __init__(self, output_type: Callable | None = None):
        self.output_type = output_type

    def __call__(self, rows: list[dict]) -> dict:
        return {k: self._out(np.array([r[k] for r in rows])) for k in rows[0]} if rows else {}

    def columns(self, chunk: Chunk) -> dict:
        return {k: self._out(c if type(c) is np.ndarray else np.array(c))
                for k, c in zip(chunk.keys, chunk.cols)}

    def _out(self, a: np.ndarray) -> Any:
        f = self.output_type
        if f is None:
            return a
        if getattr(f, "__module__", None) == "torch" and getattr(f, "__name__", "") == "tensor":
            import torch

            if f is torch.tensor and a.dtype.kind in "biuf":
                return torch.as_tensor(a)
        return f(a)


def _batchify_device(stack_fn: Callable) -> tuple[bool, Any]:
    """(is gluonts.torch's ``batchify`` (maybe a partial with only ``device``), device)."""
    f, device = stack_fn, None
    if isinstance(f, functools.partial):
        if f.args or set(f.keywords) - {"device"}:
            return False, None
        device, f = f.keywords.get("device"), f.func
    try:
        from gluonts.torch.batchify import batchify
    except ImportError:
        return False, None
    return f is batchify, device


class Stacker:
    """Applies ``stack_fn`` to a chunk: on the columns directly when it is one whose result
    is known (gluonts.torch's ``batchify``, :class:`ColumnStack`), else on the rows."""

    def __init__(self, stack_fn: Callable):
        self.stack_fn = stack_fn
        self.column_stack = isinstance(stack_fn, ColumnStack)
        self.batchify, self.device = _batchify_device(stack_fn)

    def __call__(self, chunk: Chunk) -> Any:
        if self.column_stack:
            return self.stack_fn.columns(chunk)
        if self.batchify and self._plain(chunk):
            import torch

            return {k: torch.as_tensor(c, device=self.device) if type(c) is np.ndarray else c
                    for k, c in zip(chunk.keys, chunk.cols)}
        return self.stack_fn(chunk.rows())

    @staticmethod
    def _plain(chunk: Chunk) -> bool:
        # batchify recurses into lists and tuples, and stacks ragged arrays (an error):
        # those take the row path so that the outcome is batchify's own.
        for c in chunk.cols:
            if type(c) is not np.ndarray and c and isinstance(c[0], (list, tuple, np.ndarray)):
                return False
        return True
