"""Review 18 (an attacker's review of the pipeline and the torch loader): out-of-range
options that aborted the process or gave confusing errors, a fork server that died silently,
and the ``__main__``-guard check of steps. Each case that could abort or hang runs in a fresh
interpreter (a subprocess with a time limit), so an abort is a failure, not a lost run."""

import os
import sys
import textwrap

import pytest

import shmpipe
from procs import run_python
from shmpipe import _steps

HERE = os.path.dirname(os.path.abspath(__file__))


def run(code=None, limit=120, env=None, path=None):
    """`procs.run_python` with this file's default time limit."""
    return run_python(code, limit, env, path)


# -- hole 1: a huge shuffle buffer ------------------------------------------------------------

def test_review18_a_huge_shuffle_buffer_is_refused_naming_it_not_an_abort():
    rc, out = run("""
        import shmpipe, pipeline_steps as s
        try:
            p = shmpipe.Pipeline(list(range(20)), [s.add_1], workers=1, shuffle=True,
                                 shuffle_buffer=2**40)
            print("ENDED", sorted(p))
        except ValueError as e:
            print("RAISED", e)
    """)
    assert rc == 0, f"the process died (return code {rc}):\n{out}"
    assert "RAISED shuffle_buffer=1099511627776" in out, out


@pytest.mark.parametrize("workers", [0, 1])
def test_review18_the_largest_shuffle_buffer_runs_without_reserving_it(workers):
    # In-memory sources are fed by this process, through a shuffle buffer made here: it
    # reserved room for every item up front (2**32 items: 32 GiB) and aborted.
    rc, out = run(f"""
        import shmpipe, pipeline_steps as s
        p = shmpipe.Pipeline(list(range(20)), [s.add_1], workers={workers}, shuffle=True,
                             shuffle_buffer=2**32)
        print("ENDED", sorted(p) == list(range(1, 21)))
    """)
    assert rc == 0 and "ENDED True" in out, f"return code {rc}:\n{out}"


# -- hole 5: numbers out of range --------------------------------------------------------------

@pytest.mark.parametrize("kw, named", [
    ("seed=2**64", "seed=18446744073709551616"),
    ("seed=-1", "seed=-1"),
    ("prefetch=2**62", "prefetch=4611686018427387904"),
    ("shuffle_buffer=2**64", "shuffle_buffer=18446744073709551616"),
    ("max_in_flight=2**64", "max_in_flight=18446744073709551616"),
    ("epochs=2**64", "epochs=18446744073709551616"),
    ("batch_bytes=2**64", "batch_bytes=18446744073709551616"),
    ("emitters=2**64", "emitters=18446744073709551616"),
    ("workers=2**64", "workers=18446744073709551616"),
])
def test_review18_numbers_out_of_range_are_a_value_error_naming_the_parameter(kw, named):
    rc, out = run(f"""
        import shmpipe, pipeline_steps as s
        try:
            kw = dict(workers=1)
            kw.update(dict({kw}))
            p = shmpipe.Pipeline(list(range(4)), [s.add_1], **kw)
            print("ENDED", sorted(p))
        except ValueError as e:
            print("RAISED", e)
        except BaseException as e:
            print("WRONG", type(e).__name__, e)
    """)
    assert rc == 0, f"the process died (return code {rc}):\n{out}"
    assert f"RAISED {named}: " in out, out
    # The message says what the parameter takes.
    assert " to " in out.split("RAISED", 1)[1], out


@pytest.mark.parametrize("loader", ["TrainLoader", "ValidationLoader"])
def test_review18_the_time_series_loaders_check_their_seed_when_made(loader):
    import shmpipe.timeseries

    with pytest.raises(ValueError, match=r"seed=18446744073709551616: "):
        getattr(shmpipe.timeseries, loader)(
            [{"start": "2020-01-01", "target": [1.0] * 50}], freq="D", context_length=4,
            prediction_length=2, seed=2**64)


@pytest.mark.parametrize("loader", ["TrainLoader", "ValidationLoader"])
def test_review18_the_time_series_loaders_check_their_batch_size_when_made(loader):
    # The Rust step reserved room for a whole batch up front: 2**40 rows aborted the worker.
    import shmpipe.timeseries

    with pytest.raises(ValueError, match=r"batch_size=1099511627776: out of range; pass a "
                                         r"whole number from 1 to 2\*\*24"):
        getattr(shmpipe.timeseries, loader)(
            [{"start": "2020-01-01", "target": [1.0] * 50}], freq="D", context_length=4,
            prediction_length=2, batch_size=2**40)


# -- hole 3: the __main__-guard check of steps ---------------------------------------------

def _script(tmp_path, text):
    p = tmp_path / "script.py"
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_review18_a_step_in_the_else_of_the_main_guard_is_accepted(tmp_path):
    path = _script(tmp_path, """
        if __name__ == "__main__":
            pass
        else:
            def step(x):
                return x
        if __name__ == "__main__":
            pass
        elif True:
            def other(x):
                return x
    """)
    assert not _steps._under_main_guard(path, "step")
    assert not _steps._under_main_guard(path, "other")


def test_review18_a_step_in_the_else_of_another_if_is_accepted(tmp_path):
    path = _script(tmp_path, """
        import os
        if os.environ.get("NO_SUCH_VARIABLE"):
            pass
        else:
            def step(x):
                return x
        if __name__ != "__main__":
            pass
        else:
            def guarded(x):
                return x
    """)
    assert not _steps._under_main_guard(path, "step")
    assert _steps._under_main_guard(path, "guarded"), "only the main script runs that else"


@pytest.mark.parametrize("line", ["x = " + "+".join(["1"] * 100000),
                                  "x = " + "-" * 100000 + "1"])
def test_review18_a_script_the_check_cannot_parse_does_not_crash_it(tmp_path, line):
    # ast.parse raises RecursionError (a long sum) or MemoryError (a long chain of unary
    # minus) on these (the script on disk need not be the one running: it may have been
    # edited since): the check falls back to accepting (workers report what they find).
    path = _script(tmp_path, "def step(x):\n    return x\n" + line + "\n")
    assert not _steps._under_main_guard(path, "step")


def test_review18_a_deeply_nested_script_does_not_crash_the_check(tmp_path):
    # The walk of the syntax tree recurses once per block: near the recursion limit (a step
    # made deep in the caller's recursion) it overflowed.
    depth = 90
    lines = ["x = 1"] + [" " * i + "if x:" for i in range(depth)]
    lines.append(" " * depth + "def step(y):")
    lines.append(" " * depth + "    return y")
    path = _script(tmp_path, "\n".join(lines) + "\n")
    assert not _steps._under_main_guard(path, "step")

    def deep(n):
        return deep(n - 1) if n else _steps._under_main_guard(path, "step")

    limit = sys.getrecursionlimit()
    try:
        assert deep(limit - 60) is False
    finally:
        sys.setrecursionlimit(limit)


# -- hole 2: a __main__ that exits while the fork server imports it --------------------------

EXITING_SCRIPT = """
import sys
sys.path.insert(0, {here!r})
import numpy as np
import torch
import shmpipe.torch


class DS(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.full(2, i, np.float32)


if __name__ == "__main__":
    try:
        n = sum(1 for _ in shmpipe.torch.DataLoader(DS(), batch_size=4, num_workers=2))
        print("ENDED", n)
    except Exception as e:
        print("RAISED", type(e).__name__, e)
    except BaseException as e:
        print("WRONG", type(e).__name__, e)
{ending}
"""


@pytest.mark.parametrize("ending, what", [("sys.exit(2)", "SystemExit(2)"),
                                          ("raise KeyboardInterrupt", "KeyboardInterrupt")])
@pytest.mark.parametrize("fork", ["1", "0"])
def test_review18_a_main_that_exits_in_the_fork_server_is_a_clear_error(tmp_path, ending,
                                                                          what, fork):
    pytest.importorskip("torch")
    path = tmp_path / "trainer.py"
    path.write_text(EXITING_SCRIPT.format(here=HERE, ending=ending))
    rc, out = run(None, path=str(path), env={"SHMPIPE_TORCH_FORK": fork},
                  limit=300)
    assert rc is not None, "still running after 300 s:\n" + out
    line = next((ln for ln in out.splitlines() if ln.startswith(("RAISED", "ENDED", "WRONG"))),
                out)
    assert line.startswith("RAISED RuntimeError"), out
    assert f"importing __main__ ({path}) in the worker process raised {what}" in line, out
    assert "if __name__ == '__main__':" in line, out


@pytest.mark.parametrize("pf, workers, most", [(2**62, 2, 32768), (40000, 2, 32768),
                                               (0, 2, 32768)])
def test_review18_a_prefetch_factor_out_of_range_is_refused_naming_it(pf, workers, most):
    # 2**62 made the first iteration queue 2**63 tasks (a hang), and the workers fail on a
    # channel of that many blocks.
    pytest.importorskip("torch")
    rc, out = run(f"""
        import numpy as np, torch, shmpipe.torch
        try:
            shmpipe.torch.DataLoader(list(range(8)), batch_size=4, num_workers={workers},
                                     prefetch_factor={pf})
            print("MADE")
        except ValueError as e:
            print("RAISED", e)
    """, limit=300)
    assert rc == 0, f"return code {rc}:\n{out}"
    assert f"RAISED prefetch_factor={pf}: out of range; pass a whole number from 1 to {most}" \
        in out, out
