"""What a Python pipeline's processes hold and pass on (issue 16, holes 8, 9 and 11): an
in-memory source reaches no other process whole (since issue 18 the parent feeds it item by
item: nothing is pickled), neither a worker nor a program the parent starts with
``os.system``; the role variable does not reach programs a step starts; an unusual
``sys.path`` entry does not kill the workers."""

import os
import sys

import numpy as np

import shmpipe
from isolation_steps import fd_links, report_fds, report_role

def items(n):
    return [{"n": i, "x": np.full(4, i, dtype=np.float32)} for i in range(n)]


def test_an_in_memory_source_reaches_no_other_process_whole(tmp_path):
    # Since issue 18 the parent feeds an in-memory source item by item: nothing of it is
    # pickled into a memfd, so no worker, and no program the parent starts, can hold it.
    p = shmpipe.Pipeline(items(8), [report_fds], workers=2, emitters=1, epochs=None)
    it = iter(p)
    try:
        first = next(it)
        assert "shmpipe-source" not in first["memfds"], first["memfds"]
        listing = tmp_path / "fds.txt"
        assert os.system(f"ls -l /proc/self/fd/ > {listing} 2>&1") == 0
        assert "shmpipe-source" not in listing.read_text(), listing.read_text()
        assert "shmpipe-source" not in " ".join(fd_links().values())
        for pid in p.pids:  # workers only: no emitter process
            assert not any("shmpipe-source" in to for to in fd_links(pid).values())
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
