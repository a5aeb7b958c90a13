"""What the parent process of a pipeline may be like, and how a worker's own exit is
reported (issue 16, review of the pipeline part, minor findings)."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import shmpipe
from process_steps import exit_3_on_5, ident

HERE = os.path.dirname(__file__)

SCRIPT = """
import sys
sys.path.insert(0, {here!r})
import numpy as np
import shmpipe
from process_steps import ident

if __name__ == "__main__":
    p = shmpipe.Pipeline([{{"n": i, "x": np.zeros(4, np.float32)}} for i in range(20)],
                         [ident], workers=2)
    n = sum(1 for _ in p)
    with open(sys.argv[1], "w") as f:
        f.write(f"OK {{n}}")
"""


@pytest.mark.parametrize("closed", ["1>&-", "2>&-", "1>&- 2>&-"])
def test_a_parent_with_a_closed_stdout_or_stderr_runs_pipelines(tmp_path, closed):
    """``python x.py 1>&-``: every worker failed at start-up (``sys.stdout.reconfigure`` on
    ``None``), so every pipeline failed."""
    script = tmp_path / "closed.py"
    script.write_text(SCRIPT.format(here=HERE))
    result = tmp_path / "result.txt"
    out = subprocess.run(["sh", "-c", f'"$0" "$1" "$2" {closed}', sys.executable,
                          str(script), str(result)],
                         capture_output=True, text=True, timeout=120)
    got = result.read_text() if result.exists() else None
    assert got == "OK 20", (out.returncode, out.stderr)


def test_a_step_that_exits_is_reported_with_its_code():
    """A step that ends its worker with ``os._exit(3)`` was reported as a worker that "could
    not set up its connections" (3 is also the pipeline's own setup-failure code)."""
    p = shmpipe.Pipeline([{"n": i} for i in range(20)], [exit_3_on_5], workers=2)
    with pytest.raises(shmpipe.WorkerDied) as e:
        list(p)
    msg = str(e.value)
    assert "exited with code 3" in msg and "set up" not in msg, msg


def test_close_from_two_threads_closes_the_source_once():
    """``Pipeline.close`` from two threads at once (a finalizer and the user, or two users):
    the source's descriptor was closed twice, the second time possibly someone else's
    descriptor that took its number."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    errors = []
    try:
        for _ in range(30):
            p = shmpipe.Pipeline([{"n": i} for i in range(4)], [ident], workers=1)
            it = iter(p)
            next(it)
            barrier = threading.Barrier(4)

            def close():
                barrier.wait()
                try:
                    p.close()
                except Exception as e:  # noqa: BLE001
                    errors.append(repr(e))

            def squat():
                # Takes whatever numbers come free, as any other thread of a program may.
                barrier.wait()
                fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(20)]
                for fd in fds:
                    try:
                        os.close(fd)
                    except OSError as e:
                        errors.append(f"a squatter's descriptor was closed under it: {e!r}")

            ts = [threading.Thread(target=close) for _ in range(3)] + [threading.Thread(target=squat)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            del it
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[:5]
