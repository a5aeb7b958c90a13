"""The fork server's lifecycle (``_procs.py``, ``_forked.py``): in processes forked from the
trainer, after the server died, and what a forked server keeps of a large trainer.

Each test runs a trainer in a fresh interpreter (the server is made at ``import
shmpipe.torch``), which prints JSON lines; every process it made must be gone afterwards."""

import json
import os

import pytest

pytest.importorskip("torch")

from procs import gone, run_python  # noqa: E402
from shmpipe.torch import _forked  # noqa: E402

# The defaults (a fork server forked from the trainer at import if that is safe), whatever
# the environment running the tests says.
ENV = {"SHMPIPE_TORCH_FORK": "1", "SHMPIPE_TORCH_EAGER": "1",
       _forked.MAX_ANON_ENV: str(_forked.MAX_ANON_MIB)}

EXPECTED = [[[i, 1, 1], [i + 1, 1, 1]] for i in range(0, 8, 2)]


def run(code, limit=300):
    rc, out = run_python(code, limit=limit, env=ENV)
    assert rc == 0, out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    servers = [x[k] for x in lines for k in ("server", "old", "new") if x.get(k)]
    assert servers, out
    for pid in servers:     # ended with the process that made it (its parent reaps it)
        assert gone(pid) or _wait_gone(pid), f"fork server {pid} outlived its trainer"
    return lines, out


def _wait_gone(pid, seconds=30):
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if gone(pid):
            return True
        time.sleep(0.05)
    os.kill(pid, 9)
    return False


def test_a_process_forked_from_the_trainer_runs_loaders_with_workers():
    # A fork-context multiprocessing.Process (what Lightning's ddp_fork / ddp_notebook ranks
    # are) and a bare os.fork(), both after `import shmpipe.torch`: each gets a fork server
    # of its own, made the shmpipe way, and the trainer's own server is untouched.
    lines, out = run("""
        import json, multiprocessing as mp, os
        import shmpipe.torch
        import forkserver_steps as fs

        if __name__ == "__main__":
            fs.report("trainer")
            p = mp.get_context("fork").Process(target=fs.report, args=("mp-fork",))
            p.start()
            p.join()
            pid = os.fork()
            if pid == 0:
                fs.report("os.fork")
                os._exit(0)
            os.waitpid(pid, 0)
            fs.report("trainer again")
    """)
    by = {x["where"]: x for x in lines}
    assert set(by) == {"trainer", "mp-fork", "os.fork", "trainer again"}, out
    for where, x in by.items():
        assert x.get("batches") == EXPECTED, (where, out)
    assert by["trainer again"]["server"] == by["trainer"]["server"]
    assert by["trainer"]["server"] not in (by["mp-fork"]["server"], by["os.fork"]["server"])


def test_a_dead_fork_server_is_made_again_the_shmpipe_way():
    # Killed (an OOM kill): the next loader's workers still come from a server that
    # preloaded torch and marks its processes, not from multiprocessing's plain restart.
    lines, out = run("""
        import json, os, signal
        import shmpipe.torch
        import forkserver_steps as fs

        if __name__ == "__main__":
            first = fs.epoch()
            old = fs.server_pid()
            os.kill(old, signal.SIGKILL)
            fs.wait_gone(old)
            second = fs.epoch()
            third = fs.epoch()
            print(json.dumps({"first": first, "second": second, "third": third,
                              "old": old, "new": fs.server_pid()}), flush=True)
    """)
    x = lines[-1]
    assert x["first"] == EXPECTED, out
    assert x["second"] == EXPECTED and x["third"] == EXPECTED, out


def test_a_trainer_that_holds_much_memory_at_import_spawns_its_fork_server():
    # 600 MiB loaded before `import shmpipe.torch`: a fork of the trainer would keep it
    # resident for the whole run; the server is a fresh interpreter instead.
    lines, out = run("""
        import json
        import numpy as np
        data = np.ones(600 << 20, np.uint8)
        import shmpipe.torch
        import forkserver_steps as fs

        if __name__ == "__main__":
            batches = fs.epoch()
            server = fs.server_pid()
            print(json.dumps({"batches": batches, "server": server,
                              "server_anon_mib": fs.rss_anon_mib(server)}), flush=True)
    """)
    x = lines[-1]
    assert x["batches"] == EXPECTED, out
    assert x["server_anon_mib"] < 600, out
