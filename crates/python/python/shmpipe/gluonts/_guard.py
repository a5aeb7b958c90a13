"""What GluonTS's own loader checks and reports that shmpipe's worker processes cannot see
alone: a stream that makes no training window, and which line of which file an error is on.

**No window.** GluonTS's ``FlatMapTransformation`` (the ``InstanceSplitter``, a
``FilterTransformation``) raises ``Exception("Reached maximum number of idle
transformation calls ...")`` when more than its ``max_idle_transforms`` inputs in a row
(``gluonts.env``, 100; an estimator's ``train`` sets ``max(len(data), 100)``) gave no
output: without it the endless training stream loops for ever over series too short for
the splitter. A worker sees every ``num_workers``-th entry only, and each through the chain
alone (the count never grows there), so :class:`CountingStep` tells the parent: once it has
had ``REPORT_AFTER`` entries in a row without a window, it sends ``{"idle": k}`` for each
further one (``k``: the entry's position in the stream, :class:`Counted`).
:class:`IdleCheck`, in the parent, which gets the items in stream order, raises GluonTS's
exception when the positions it was sent make a run of more than the limit: every entry of
such a run made no window (a window-making entry sends nothing and breaks the run), so it
never raises where GluonTS would not; on an endless stream without windows every worker
reports every entry after its first ``REPORT_AFTER``, and the run grows.

**Where.** An error of a worker (the item carries the entry's index ``"i"``) and an error
of the fast path's Rust reader are named with the file and line they came from; for the
fast path, the line is read again the way GluonTS would (``json.loads``, ``FileDataset``'s
``ProcessDataEntry``, the chain) and what GluonTS raises there is raised, with its type.
"""

from __future__ import annotations

import copy
import random
import re
import warnings
from typing import Any, Optional

import numpy as np

from ._source import EntrySource
from ._step import TransformStep

REPORT_AFTER = 4


def idle_limit(stages: list) -> tuple[int, Any]:
    """``(limit, transformation)``: how many entries in a row without a window make
    GluonTS's loader raise, and the chain's last ``FlatMapTransformation`` (the splitter);
    ``(0, None)``: no check (no such step, or one with the check off, ``<= 0``).

    One step (the splitter) with ``max_idle_transforms`` L: L. With several in a row
    (a ``FilterTransformation`` before the splitter), an entry without a window is idle in
    one of them only, and each counts its own inputs: GluonTS raises for sure only after
    ``prod(L_i + 1) - 1`` (fewer would raise here where GluonTS may not)."""
    from gluonts.transform import Chain
    from gluonts.transform._base import FlatMapTransformation

    limits: list = []
    last = None

    def walk(t):
        nonlocal last
        if isinstance(t, Chain):
            for s in t.transformations:
                walk(s)
        elif isinstance(t, FlatMapTransformation):
            limits.append(int(getattr(t, "max_idle_transforms", 0) or 0))
            last = t

    for t, _ in stages:
        walk(t)
    if not limits or min(limits) <= 0:
        return 0, None
    return int(np.prod([n + 1 for n in limits], dtype=object)) - 1, last


def no_window_error(limit: int, t: Any) -> Exception:
    """GluonTS's own exception (``FlatMapTransformation.__call__``, of ``t``), with what it
    means (``limit``: :func:`idle_limit`'s)."""
    sampler = getattr(t, "instance_sampler", None)
    need = ""
    if sampler is not None:
        need = (f" (its instance sampler {type(sampler).__name__} needs min_past="
                f"{getattr(sampler, 'min_past', '?')} and min_future="
                f"{getattr(sampler, 'min_future', '?')} points around a window)")
    return Exception(
        "Reached maximum number of idle transformation calls.\nThis means the "
        f"transformation looped over {t.max_idle_transforms} inputs without returning any "
        "output.\n"
        f"shmpipe.gluonts: {limit + 1} entries in a row of the training stream made no "
        f"training window: are the series shorter than the {type(t).__name__} needs"
        f"{need}? (GluonTS's TrainDataLoader raises the same.)\n"
        f"This occurred in the following transformation:\n{t}")


class IdleCheck:
    """In the parent: the ``{"idle": k}`` items in stream order (see the module doc)."""

    def __init__(self, limit: int, t: Any):
        self.limit, self.t = limit, t
        self.last, self.run = -2, 0

    def see(self, item: dict) -> None:
        k = int(item["idle"])
        self.run = self.run + 1 if k == self.last + 1 else 1
        self.last = k
        if self.limit and self.run > self.limit:
            raise no_window_error(self.limit, self.t)


class Counted(EntrySource):
    """An :class:`EntrySource` whose items also say their position in the stream (``"k"``:
    0, 1, 2, ... across epochs), for the check of runs without a window."""

    def __init__(self, kind: int, data: list):
        super().__init__(kind, data)
        self._k = 0

    @classmethod
    def of(cls, s: EntrySource) -> "Counted":
        c = cls(s.kind, s.data)
        c.shuffle_buffer_length, c.seed = s.shuffle_buffer_length, s.seed
        return c

    def __getitem__(self, i: int) -> dict:
        item = super().__getitem__(i)
        item["k"], self._k = self._k, self._k + 1
        return item


def _quiet_gluonts_json() -> None:
    # gluonts.json warns on import when neither orjson nor ujson is installed: the user's
    # process has printed it once already, every worker would print it again.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using `json`-module")
        import gluonts.json  # noqa: F401


class CountingStep(TransformStep):
    """A :class:`TransformStep` that reports runs of entries without a window (training)
    and names the entry an error came from (``"i"``)."""

    def __init__(self, *args: Any, idle_limit: int = 0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.idle_limit = idle_limit
        self._idle, self._made = 0, True

    def __getstate__(self):
        return dict(super().__getstate__(), idle_limit=self.idle_limit)

    def __setstate__(self, st):
        _quiet_gluonts_json()
        super().__setstate__(st)
        self.idle_limit = st["idle_limit"]
        self._idle, self._made = 0, True

    def windows(self, item: dict) -> list:
        ws = super().windows(item)
        self._made = bool(ws)
        return ws

    def __call__(self, item: dict) -> list:
        self._made = True
        out = super().__call__(item)
        if out and "err" in out[0]:
            out[0]["i"] = np.int64(item["i"])
            return out
        if not self.idle_limit or self._made:
            self._idle = 0
            return out
        self._idle += 1
        if self._idle >= REPORT_AFTER and "k" in item:
            out.append({"idle": np.int64(item["k"])})
        return out


# -- where an error came from -----------------------------------------------------------------

def line_of(files: list, j: int) -> Optional[tuple[str, int]]:
    """``(path, 0-based line)`` of entry ``j`` of the JSON-lines files ``[(path, start, n)]``
    (``_source``'s ``EntrySource`` data)."""
    from ._source import _line_ranges

    for path, start, n in files:
        count = len(_line_ranges(path, start, n))
        if j < count:
            return path, start + j
        j -= count
    return None


def note(e: BaseException, path: str, line: int) -> None:
    """Names ``path:line`` (1-based, as editors count) in ``e``'s traceback."""
    if hasattr(e, "add_note"):  # Python 3.11+
        e.add_note(f"(the entry read from {path}:{line + 1})")


_AT = re.compile(r"bad record at (.+):(\d+)[,:]")


def replay(err: BaseException, files: list, fns: list, stages: list,
           scan: int = 100_000) -> Optional[BaseException]:
    """What GluonTS raises reading the files the fast path failed on (``err``: the Rust
    reader's or step's error), with the file and line noted; ``None`` if GluonTS reads them
    (the Rust reader is stricter) or no error was found in the first ``scan`` lines, or
    ``err`` is not about the data (neither a reader's bad record nor a step's error).

    Lines are read in order as ``FileDataset`` reads them (``json.loads``, then the ``Map``
    functions: ``ProcessDataEntry``) up to the line the Rust reader names (the first error
    GluonTS meets may be on an earlier line the Rust reader takes, e.g. an integer too large
    for a float), and that line (or, when none is named, each line) goes through the chain
    too."""
    from gluonts import json as gjson
    from gluonts.exceptions import GluonTSDataError

    from .. import StepError

    m = _AT.search(str(err))
    named = (m.group(1), int(m.group(2)) - 1) if m else None
    if named is None:
        if not isinstance(err, StepError):  # not the data's (a worker died, ...)
            return None
        scan = min(scan, 10_000)  # the whole chain on each line
    st, pst = np.random.get_state(), random.getstate()
    try:
        stages = copy.deepcopy(stages)
        seen = 0
        for path, start, n in files:
            with open(path, "rb") as f:
                for k, line in enumerate(f):
                    if k < start:
                        continue
                    if n is not None and k >= start + n:
                        break
                    seen += 1
                    at_named = named is not None and (path, k) == named
                    if seen > scan and not at_named:
                        if named is None:
                            return None
                        continue  # only the named line, then
                    try:
                        try:
                            e = gjson.loads(line)
                        except ValueError:
                            raise GluonTSDataError(
                                f"Could not read json line {k}, {line}") from None
                        for fn in fns:
                            e = fn(e)
                        if named is None or at_named:
                            data = [e]
                            for t, tr in stages:
                                data = t(data, tr)
                            for _ in data:
                                pass
                    except Exception as bad:  # noqa: BLE001 - GluonTS's own, of any type
                        note(bad, path, k)
                        return bad
                    if at_named:
                        return None
    finally:
        np.random.set_state(st)
        random.setstate(pst)
    return None
