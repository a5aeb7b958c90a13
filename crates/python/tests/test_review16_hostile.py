"""Issue 16 review (review-16): a hostile or careless worker, and waits given odd timeouts.

These held on main (they pass): kept as guards of what a hostile step may do. Each test runs the pipeline in a subprocess with a time limit, so that a hang is a failure
and not a stuck test run."""

import numpy as np
import pytest

import shmpipe
from procs import run_python


def run(code=None, limit=60, env=None, path=None):
    """`procs.run_python` with this file's default time limit."""
    return run_python(code, limit, env, path)


PIPE = """
    import numpy as np, shmpipe, review16_steps as s
    items = [{"n": i, "x": np.full(300, i, dtype=np.float32)} for i in range(40)]
    try:
        out = list(shmpipe.Pipeline(items, [s.%s], workers=1%s))
        print("ENDED", len(out))
    except Exception as e:
        print("RAISED", type(e).__name__, e)
"""


@pytest.mark.parametrize("ordered", [False, True])
def test_review16_a_worker_that_forges_its_exit_announcement_does_not_hang_the_parent(ordered):
    rc, out = run(PIPE % ("forge_exit_at_3", ", ordered=True" if ordered else ""))
    assert rc is not None, "parent still blocked 60 s after its only worker exited:\n" + out
    assert "RAISED" in out or "ENDED 40" in out, out


def test_review16_garbage_control_messages_then_an_odd_exit_are_reported():
    rc, out = run(PIPE % ("garbage_then_exit_at_3", ""))
    assert rc is not None, "parent still blocked 60 s after its only worker exited:\n" + out
    assert "RAISED" in out, out


def test_review16_a_step_that_forks_the_worker():
    rc, out = run(PIPE % ("fork_at_3", ""))
    assert rc is not None, "parent still blocked 60 s after the worker forked:\n" + out
    assert "RAISED" in out or "ENDED 40" in out, out


def test_review16_a_worker_that_scribbles_over_the_parents_memfds_is_reported():
    """A worker of the same user opens /proc/<parent>/fd/<n> for every memfd of the parent
    (every channel of the pipeline) and overwrites it: the parent raises, it neither crashes
    nor hangs."""
    rc, out = run(PIPE % ("scribble_parent_memfds_at_5", ""))
    assert rc is not None, "parent still blocked 60 s after the scribbling:\n" + out
    assert rc == 0 and "RAISED" in out, out


@pytest.mark.parametrize("ordered", [False, True])
def test_review16_a_worker_that_closes_every_descriptor_does_not_hang_the_parent(ordered):
    rc, out = run(PIPE % ("close_all_fds_at_3", ", ordered=True" if ordered else ""))
    assert rc is not None, "parent still blocked 60 s:\n" + out
    assert "RAISED" in out or "ENDED 40" in out, out


def test_review16_a_step_that_exits_with_the_pipelines_own_code_is_reported():
    rc, out = run(PIPE % ("exit_code_at_3", ""))
    assert rc is not None and "RAISED WorkerDied" in out and "on its own" in out, out
