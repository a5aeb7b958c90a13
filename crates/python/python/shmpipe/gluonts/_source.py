"""What the emitter process reads: a GluonTS dataset taken apart into a random-access source.

:func:`plan` looks through the wrappers GluonTS puts around data (``TransformedDataset``
from ``Transformation.apply``, ``Cached``, ``Map`` from ``FileDataset``/``ListDataset``,
``DatasetCollection``) down to what holds the data:

- JSON-lines files (``FileDataset`` over ``.json``/``.jsonl`` files): the emitter sends
  each line's place in its file (``"f"``: the file's index, ``"a"``: its first byte,
  ``"n"``: its length); the workers read the line themselves, parse it
  (``gluonts.json.loads``, or ``_lines`` natively) and apply the ``Map`` functions above
  them (``ProcessDataEntry``), as ``FileDataset`` does. (The emitter sent the bytes until
  2026-12-04: reading and copying them cost the trainer's process ~40 us per 50 kB line.)
- anything else: the entries, read once here (``list(dataset)``), pickled one by one;
  the workers unpickle them.

Transformations found on the way (``TransformedDataset``) are handed back, to run in the
workers before the loader's own ``transform``. What sits under a ``Cached`` wrapper (e.g.
the estimator's transformation with ``train(..., cache_data=True)``) is computed once per
entry by each worker and kept there, as ``Cached`` keeps it in GluonTS's own process.

The source (:class:`EntrySource`) runs in the emitter process. Each item it sends holds
the entry (``"p"``: bytes, or a line's place), its index in the dataset (``"i"``) and how many times that
entry was read before (``"ep"``): the workers seed each entry's transformation from
``(seed, i, ep)``, so its random windows do not depend on the number of workers.
"""

from __future__ import annotations

import mmap
import os
import pickle
import random
from typing import Any

import numpy as np

LINES, PICKLED = 0, 1


def _unwrap(ds: Any) -> tuple[Any, list, list, int]:
    """``(data, map_fns, stages, cached)``: the innermost data, the ``Map`` functions over it
    (innermost first), the ``(transformation, is_train)`` stages above them (innermost
    first), and how many of those stages sit under a ``Cached`` wrapper (-1: no cache)."""
    from gluonts.itertools import Cached, Map
    from gluonts.transform import TransformedDataset

    fns: list = []
    stages: list = []
    outside = None  # stages found above the outermost Cached
    while True:
        if isinstance(ds, TransformedDataset):
            if fns:  # a transformation under a Map: keep it as data
                break
            stages.insert(0, (ds.transformation, ds.is_train))
            ds = ds.base_dataset
        elif isinstance(ds, Cached):
            if outside is None:
                outside = len(stages)
            ds = ds.iterable
        elif isinstance(ds, Map):
            fns.insert(0, ds.fn)
            ds = ds.iterable
        else:
            break
    return ds, fns, stages, -1 if outside is None else len(stages) - outside


def _json_files(ds: Any) -> list[tuple[str, int, int | None]] | None:
    """``[(path, start, n)]`` when ``ds`` is plain JSON-lines files, else ``None``."""
    from gluonts.dataset.jsonl import JsonLinesFile

    if isinstance(ds, JsonLinesFile):
        if str(ds.path).endswith(".gz"):
            return None
        return [(os.fspath(ds.path), int(ds.start), None if ds.n is None else int(ds.n))]
    return None


def _collection(ds: Any) -> tuple[list, list] | None:
    """A ``DatasetCollection`` of JSON-lines files with the same ``Map`` functions."""
    from gluonts.dataset import DatasetCollection

    if not isinstance(ds, DatasetCollection) or ds.interleave:
        return None
    files, fns0 = [], None
    for d in ds.datasets:
        inner, fns, stages, cached = _unwrap(d)
        f = _json_files(inner)
        if f is None or stages or cached >= 0:
            return None
        blob = pickle.dumps(fns)
        if fns0 is None:
            fns0 = (blob, fns)
        elif blob != fns0[0]:
            return None
        files.extend(f)
    return files, (fns0[1] if fns0 else [])


def plan(dataset: Any) -> tuple["EntrySource", list, list, int]:
    """``(source, map_fns, stages, cached)`` for ``dataset`` (see the module doc)."""
    data, fns, stages, cached = _unwrap(dataset)
    files = _json_files(data)
    if files is None:
        coll = _collection(data)
        if coll is not None and not fns:
            files, fns = coll
    if files is not None:
        try:
            pickle.dumps(fns)
        except Exception:  # noqa: BLE001 - an unpicklable Map function: read it here
            files = None
    if files is not None:
        return EntrySource(LINES, files), fns, stages, cached
    for fn in fns:  # innermost first: read through the Map functions here
        data = map(fn, data)
    entries = [pickle.dumps(e, protocol=5) for e in data]
    return EntrySource(PICKLED, entries), [], stages, cached


def _line_ranges(path: str, start: int, n: int | None) -> np.ndarray:
    """``(k, 2)`` int64 byte ranges of lines ``start..start+n`` of ``path``, split as
    iterating the file in binary mode splits it (what ``JsonLinesFile`` does)."""
    size = os.path.getsize(path)
    if size == 0:
        return np.zeros((0, 2), np.int64)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        nl = np.flatnonzero(np.frombuffer(m, np.uint8) == 10)
    ends = nl + 1
    if len(ends) == 0 or ends[-1] != size:
        ends = np.append(ends, size)
    starts = np.concatenate([[0], ends[:-1]])
    r = np.stack([starts, ends], axis=1).astype(np.int64)
    return r[start:] if n is None else r[start:start + n]


class EntrySource:
    """The emitter's random-access view of the entries (pickled to the emitter process).

    ``shuffle_buffer_length`` (training): the stream is GluonTS's
    ``PseudoShuffled(Cyclic(dataset), shuffle_buffer_length)``: entries in order, each one
    through a buffer from which a seeded random one is taken.
    """

    def __init__(self, kind: int, data: list):
        self.kind, self.data = kind, data
        self.shuffle_buffer_length: int | None = None
        self.seed = 0
        self._ranges: list | None = None

    def configured(self, shuffle_buffer_length: int | None, seed: int) -> "EntrySource":
        s = EntrySource(self.kind, self.data)
        s.shuffle_buffer_length, s.seed = shuffle_buffer_length, seed
        return s

    def __getstate__(self):
        return {"kind": self.kind, "data": self.data,
                "shuffle_buffer_length": self.shuffle_buffer_length, "seed": self.seed}

    def __setstate__(self, st):
        self.__init__(st["kind"], st["data"])
        self.shuffle_buffer_length, self.seed = st["shuffle_buffer_length"], st["seed"]

    # -- in the emitter ------------------------------------------------------------------
    def _index(self) -> None:
        if self.kind == LINES:
            ranges = []
            for fi, (path, start, n) in enumerate(self.data):
                r = _line_ranges(path, start, n)
                ranges.append(np.column_stack([np.full(len(r), fi, np.int64), r]))
            self._ranges = np.concatenate(ranges) if ranges else np.zeros((0, 3), np.int64)
            self._n = len(self._ranges)
        else:
            self._ranges = []
            self._n = len(self.data)
        self._visits = np.zeros(self._n, np.int64)
        self._next = 0  # position in the cyclic stream (shuffled reading)
        self._buffer: list[int] = []
        self._rng = random.Random(self.seed)

    def __len__(self) -> int:
        if self._ranges is None:
            self._index()
        return self._n

    def _pick(self, i: int) -> int:
        L = self.shuffle_buffer_length
        if not L:
            return i
        while len(self._buffer) < L:
            self._buffer.append(self._next % self._n)
            self._next += 1
        return self._buffer.pop(self._rng.randrange(len(self._buffer)))


    def __getitem__(self, i: int) -> dict:
        if self._ranges is None:
            self._index()
        j = self._pick(i)
        ep = int(self._visits[j])
        self._visits[j] += 1
        if self.kind == PICKLED:
            return {"i": j, "ep": ep, "p": np.frombuffer(self.data[j], np.uint8)}
        fi, a, b = (int(x) for x in self._ranges[j])
        return {"i": j, "ep": ep, "f": fi, "a": a, "n": b - a}


class LineReader:
    """A worker's reading of the lines an :class:`EntrySource` of files points at."""

    def __init__(self, paths: list):
        self.paths = paths
        self._fds: dict = {}

    def __call__(self, item: dict) -> bytes:
        fi = int(item["f"])
        fd = self._fds.get(fi)
        if fd is None:
            if len(self._fds) >= 64:  # a dataset of many files: keep a few open
                for old in list(self._fds)[:32]:
                    os.close(self._fds.pop(old))
            fd = self._fds[fi] = os.open(self.paths[fi], os.O_RDONLY | os.O_CLOEXEC)
        n = int(item["n"])
        line = os.pread(fd, n, int(item["a"]))
        if len(line) != n:
            raise OSError(f"{self.paths[fi]}: {n} bytes at {int(item['a'])} expected, "
                          f"{len(line)} read (the file changed while it was read)")
        return line

