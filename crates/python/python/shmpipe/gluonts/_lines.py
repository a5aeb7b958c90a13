"""``FileDataset``'s reading of a JSON line, done natively for plain lines, in the workers.

A worker of the user-chain path receives each JSON line of a ``FileDataset`` and makes the
entry as ``FileDataset`` does: ``json.loads`` (GluonTS's ``gluonts.json``) and then its
``ProcessDataEntry``. Python's ``json`` was the costliest part of a worker's time on long
series (~0.53 ms of ~0.8 ms per 2,750-point line, 2026-12-04; see
``bench/profile_gluonts_worker.py``). For a line whose only keys are ``start`` and
``item_id`` (strings) and ``target`` (a flat array of numbers and ``null``), the native
reader (``crates/timeseries``'s ``jsonl::parse_plain``) gives what ``json.loads`` gives,
the target already as numpy's float32 array of it; ``ProcessDataEntry`` itself then runs
on that (its ``np.asarray(target, float32)`` leaves the array as it is). Any other line,
and any line it cannot prove it reads as Python does (escaped strings, integers of more
than 15 digits, overflowing numbers, malformed JSON), goes through ``json.loads``: the
entries are GluonTS's, and so are its errors (``tests/test_gluonts_lines.py``).

Only for the ``ProcessDataEntry`` that ``FileDataset`` builds for 1-D float32 targets
(``one_dim_target=True``, periods as starts); other ``Map`` functions get Python's lists.

A worker keeps the plain entries it made (up to ``KEEP_BYTES`` of targets) and gives each
later read of the same line a new dict with a copy of the target, as reading it again
would (a user's step that changes the target in place changes only its own copy): the
training stream reads every line again on every pass, and reading and parsing it was
~0.07 of the ~0.19 ms a worker spends per entry (2026-12-04). Like the Rust fast path,
which parses the file once, a file changed during training is not read again.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np


#: Bytes of targets a worker keeps (the entries beyond are read again on every pass).
KEEP_BYTES = 256 << 20


class PlainReader:
    """``(line, index) -> entry`` (``None``: not a plain line), and ``kept(index)``: the
    entry of a line read before, or ``None``."""

    def __init__(self, parse: Callable[[bytes], Optional[dict]], process: Callable):
        self.parse, self.process = parse, process
        self.entries: dict = {}
        self.nbytes = 0

    def __call__(self, line: bytes, i: int) -> Optional[dict]:
        d = self.parse(line)
        if d is None:
            return None
        e = self.process(d)
        t = e.get("target")
        if type(t) is np.ndarray and self.nbytes + t.nbytes <= KEEP_BYTES:
            self.entries[i] = dict(e, target=t.copy())
            self.nbytes += t.nbytes
        return e

    def kept(self, i: int) -> Optional[dict]:
        e = self.entries.get(i)
        return None if e is None else dict(e, target=e["target"].copy())


def plain_reader(fns: list) -> Optional[PlainReader]:
    """A :class:`PlainReader` when ``fns`` is ``FileDataset``'s processing of 1-D float32
    targets, else ``None``."""
    from gluonts.dataset.common import (
        ProcessDataEntry,
        ProcessStartField,
        ProcessTimeSeriesField,
    )

    from .._native import parse_plain_line

    if len(fns) != 1 or type(fns[0]) is not ProcessDataEntry:
        return None
    process: Any = fns[0]
    trans = getattr(process, "trans", None)
    if not isinstance(trans, list) or len(trans) < 2:
        return None
    start, target = trans[0], trans[1]
    if not (type(start) is ProcessStartField and start.name == "start"
            and not start.use_timestamp):
        return None
    if not (type(target) is ProcessTimeSeriesField and target.name == "target"
            and target.req_ndim == 1 and target.dtype is np.float32):
        return None

    return PlainReader(parse_plain_line, process)
