"""The worker step: the user's GluonTS transformation applied to each entry, in a worker.

One :class:`TransformStep` per worker process (pickled to it once). For each entry it
receives (see ``_source``) it rebuilds the entry as GluonTS would (a file's line it reads
itself; plain lines natively, ``_lines``), seeds numpy's and Python's global random
generators from ``(seed, index, times read)``, runs the transformation stages (with
``fast_path``, its copy of the chain has ``AddTimeFeatures`` native, ``_accel``, and
DeepAR's feature steps and splitter computed for the windows only, ``_core``) and sends
the windows on, stacked (``_batch.encode``): in full
batches (training: the worker batches its own windows), or all the windows of the entry
(validation, inference: the parent batches them in dataset order).

An exception of the transformation travels back as an item (``"err"``: the pickled
exception and the worker's traceback) and is raised in the parent with its own type.
"""

from __future__ import annotations

import os
import pickle
import random
import sys
import traceback

import numpy as np

from . import _batch
from ._source import LINES, LineReader

_MASK64 = (1 << 64) - 1


def entry_seed(seed: int, i: int, ep: int) -> int:
    """A 32-bit seed for entry ``i`` read for the ``ep``-th time (splitmix64 mixing)."""
    x = (seed * 0x9E3779B97F4A7C15 + i * 0xBF58476D1CE4E5B9 + ep * 0x94D049BB133111EB) & _MASK64
    for m in (0xBF58476D1CE4E5B9, 0x94D049BB133111EB):
        x ^= x >> 31
        x = (x * m) & _MASK64
    return (x ^ (x >> 29)) & 0xFFFFFFFF


def _main_path(blob: bytes) -> str | None:
    # Classes of the main script are pickled as `__main__.X`: the worker must load the
    # script as `__mp_main__` first (multiprocessing's spawn does the same).
    if b"__main__" not in blob:
        return None
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if path else None


class TransformStep:
    """``(kind, map_fns, stages)`` from ``_source.plan``, plus the loader's settings."""

    def __init__(self, kind: int, fns: list, stages: list, *, seed: int, batch_size: int,
                 batch_in_worker: bool, cached: int = -1, native: bool = True,
                 files: list | None = None):
        try:
            self._blob = pickle.dumps((fns, stages))
        except Exception as e:  # noqa: BLE001 - pickling raises many types
            raise ValueError(
                f"the transformation cannot be sent to the worker processes ({e}); "
                "its classes and functions must be importable (defined at the top level of "
                "a module), or use num_workers=0") from e
        self._main = _main_path(self._blob)
        self.kind, self.seed, self.batch_size = kind, seed, batch_size
        self.batch_in_worker, self.cached, self.native = batch_in_worker, cached, native
        self.files = files
        self.fns, self.stages = fns, stages
        self.pending: list = []
        self._loads = None
        self._plain = None
        self._read = None
        self._cache: dict = {}

    def __getstate__(self):
        return {"blob": self._blob, "main": self._main, "kind": self.kind, "seed": self.seed,
                "batch_size": self.batch_size, "batch_in_worker": self.batch_in_worker,
                "cached": self.cached, "native": self.native, "files": self.files}

    def __setstate__(self, st):
        self._blob, self._main, self.kind = st["blob"], st["main"], st["kind"]
        self.seed, self.batch_size = st["seed"], st["batch_size"]
        self.batch_in_worker, self.cached = st["batch_in_worker"], st["cached"]
        self.native, self.files = st["native"], st["files"]
        if self._main:
            from shmpipe._steps import _fixup_main

            _fixup_main(self._main)
        self._load()

    def _load(self) -> None:
        self.fns, self.stages = pickle.loads(self._blob)
        if self.native:  # this worker's own copy of the chain
            from ._accel import accelerate
            from ._core import fuse

            self.stages = [(fuse(accelerate(t)), tr) for t, tr in _merged(self.stages,
                                                                          self.cached)]
        self.pending: list = []
        self._loads = None
        self._plain = None  # FileDataset's line reading done natively (``_lines``)
        self._read = None
        self._cache = {}

    # -- in the worker -----------------------------------------------------------------
    def _entry(self, item: dict) -> dict:
        if self.kind != LINES:
            return pickle.loads(item["p"])
        if self._loads is None:
            from gluonts import json

            self._loads = json.loads
            self._read = LineReader(self.files or [])
        if self._plain is None:
            from ._lines import plain_reader

            self._plain = (plain_reader(self.fns) if self.native else None) or False
        i = int(item["i"])
        if self._plain:
            entry = self._plain.kept(i)
            if entry is not None:
                return entry
        line = self._read(item)
        if self._plain:
            entry = self._plain(line, i)
            if entry is not None:
                return entry
        try:
            entry = self._loads(line)
        except ValueError:
            from gluonts.exceptions import GluonTSDataError

            raise GluonTSDataError(f"Could not read json line, {line!r}") from None
        for fn in self.fns:
            entry = fn(entry)
        return entry

    def windows(self, item: dict) -> list:
        i = int(item["i"])
        s = entry_seed(self.seed, i, int(item["ep"]))
        np.random.seed(s)
        random.seed(s)
        n = self.cached
        if n >= 0 and i in self._cache:
            data = self._cache[i]
        else:
            data = [self._entry(item)]
            if n >= 0:  # the stages under GluonTS's Cached: once per entry
                for t, is_train in self.stages[:n]:
                    data = t(data, is_train)
                data = self._cache[i] = list(data)
        for t, is_train in self.stages[max(n, 0):]:
            data = t(data, is_train)
        return list(data)

    def __call__(self, item: dict) -> list:
        try:
            ws = self.windows(item)
        except Exception as e:  # noqa: BLE001 - re-raised in the parent with its type
            return [error_item(e)]
        if not self.batch_in_worker:
            return [_batch.encode(ws)] if ws else []
        self.pending.extend(ws)
        out = []
        bs = self.batch_size
        while len(self.pending) >= bs:
            out.append(_batch.encode(self.pending[:bs]))
            del self.pending[:bs]
        return out

    def finish(self) -> list:
        out = [_batch.encode(self.pending)] if self.pending else []
        self.pending = []
        return out


def _merged(stages: list, cached: int) -> list:
    """``stages`` with those after the cached ones (all of them without a cache) made one
    ``Chain`` when they share ``is_train``: the same steps in the same order, so that a run
    of steps split between the dataset's transformation and the loader's (an estimator's
    transformation and its instance splitter) is seen whole by ``_core.fuse``."""
    from gluonts.transform import Chain

    head, tail = stages[:max(cached, 0)], stages[max(cached, 0):]
    if len(tail) < 2 or len({bool(tr) for _, tr in tail}) != 1:
        return stages
    return head + [(Chain([t for t, _ in tail]), tail[0][1])]


def error_item(e: BaseException) -> dict:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    try:
        blob = pickle.dumps((e, tb))
    except Exception:  # noqa: BLE001 - an unpicklable exception: its text only
        blob = pickle.dumps((RuntimeError(f"{type(e).__name__}: {e}"), tb))
    return {"err": np.frombuffer(blob, np.uint8)}


class RemoteTraceback(Exception):
    """The worker's traceback, chained as the ``__cause__`` of a re-raised exception."""

    def __str__(self) -> str:
        return "\n\nin a shmpipe worker process:\n" + self.args[0]


def raise_error(item: dict) -> None:
    """Raises the exception a worker sent (its own type when it unpickles)."""
    try:
        e, tb = pickle.loads(item["err"])
    except Exception as u:  # noqa: BLE001 - an exception class that does not unpickle
        raise RuntimeError(f"a shmpipe worker failed; its exception did not unpickle: {u}")
    raise e from RemoteTraceback(tb)
