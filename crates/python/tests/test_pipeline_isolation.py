"""What a Python pipeline's processes hold and pass on (issue 16, holes 8, 9 and 11): the
pickled source reaches the emitters only, sealed and read-only, and no other process (a
worker, a program the parent starts with ``os.system``); the role variable does not reach
programs a step starts; an unusual ``sys.path`` entry does not kill the workers."""

import os
import sys

import numpy as np

import shmpipe
from isolation_steps import fd_links, report_fds, report_role

SOURCE_MEMFD = "/memfd:shmpipe-source"


def items(n):
    return [{"n": i, "x": np.full(4, i, dtype=np.float32)} for i in range(n)]


def test_the_source_memfd_reaches_the_emitters_only_sealed_and_read_only(tmp_path):
    p = shmpipe.Pipeline(items(8), [report_fds], workers=2, emitters=1, epochs=None)
    it = iter(p)
    try:
        first = next(it)
        # Workers do not hold the pickled source.
        assert SOURCE_MEMFD not in first["memfds"], first["memfds"]
        # Nor does a program the parent starts while the pipeline runs.
        listing = tmp_path / "fds.txt"
        assert os.system(f"ls -l /proc/self/fd/ > {listing} 2>&1") == 0
        assert "shmpipe-source" not in listing.read_text(), listing.read_text()
        # The emitter holds it read-only (pids: the emitter first, then the workers).
        emitter = p.pids[0]
        held = [n for n, to in fd_links(emitter).items() if to.startswith(SOURCE_MEMFD)]
        assert len(held) == 1, fd_links(emitter)
        with open(f"/proc/{emitter}/fdinfo/{held[0]}") as f:
            flags = int(next(l for l in f if l.startswith("flags:")).split()[1], 8)
        assert flags & os.O_ACCMODE == os.O_RDONLY, oct(flags)
        for _ in range(20):
            next(it)
    finally:
        p.close()


def test_the_role_variable_does_not_reach_programs_a_step_starts():
    out = list(shmpipe.Pipeline(items(2), [report_role], workers=1))
    assert len(out) == 2
    for o in out:
        assert o["role_here"] == 0 and o["role_gone_in_child"] == 1, o


def test_a_sys_path_entry_outside_the_bmp_does_not_kill_the_workers(tmp_path):
    odd = str(tmp_path / "emoji-\U0001F600-dir")
    os.mkdir(odd)
    sys.path.insert(0, odd)
    try:
        out = list(shmpipe.Pipeline(items(6), [report_fds], workers=2))
    finally:
        sys.path.remove(odd)
    assert sorted(o["n"] for o in out) == list(range(6))
