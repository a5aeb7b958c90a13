"""The fork server made by forking the trainer at ``import shmpipe.torch`` (``_forked.py``):
when it is made, what it keeps of the trainer (nothing open, no atexit), and that workers
forked from it find the trainer's classes and die with it."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))

# Runs in a fresh process; {before} runs before `import shmpipe.torch`.
SCRIPT = textwrap.dedent("""
    import atexit, json, os, select, sys, threading, time
    sys.path.insert(0, {here!r})
    import numpy as np
    import torch
    {before}
    import shmpipe.torch

    class Defined(torch.utils.data.Dataset):      # after the import: workers must find it
        def __len__(self):
            return 10
        def __getitem__(self, i):
            return np.full(4, i, np.float32)

    def server_fds(pid):
        out = {{}}
        for fd in os.listdir(f"/proc/{{pid}}/fd"):
            try:
                out[fd] = os.readlink(f"/proc/{{pid}}/fd/{{fd}}")
            except FileNotFoundError:
                pass
        return out

    if __name__ == "__main__":
        # (after the loader: a spawned server has surely exec'd by then)
        batches = [b.tolist() for b in shmpipe.torch.DataLoader(Defined(), batch_size=5,
                                                               num_workers=2)]
        pid = shmpipe.torch._procs._fork_server()._forkserver_pid
        with open(f"/proc/{{pid}}/cmdline", "rb") as f:
            cmd = f.read().split(b"\\0")
        ppid = int(open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[1])
        out = {{"server": pid, "forked": b"-c" not in cmd, "ppid_is_me": ppid == os.getpid(),
               "me": os.getpid(),
               "fds": server_fds(pid), "batches": batches}}
        {after}
        print(json.dumps(out), flush=True)
""")


def run(tmp_path, before="", after="", env=None, name="trainer.py"):
    path = tmp_path / name
    path.write_text(SCRIPT.format(here=HERE, before=before.strip(),
                                  after=textwrap.indent(after, " " * 4).strip()))
    full_env = dict(os.environ)
    for k in ("SHMPIPE_TORCH_FORK", "SHMPIPE_TORCH_EAGER", "SHMPIPE_TORCH_FORK_MAX_MB"):
        full_env.pop(k, None)
    full_env.update(env or {})
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                       env=full_env, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    gone(out["server"])
    return out, r


def gone(pid, seconds=10):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"the fork server {pid} outlived its trainer")


EXPECTED = [[[float(i)] * 4 for i in range(5)], [[float(i)] * 4 for i in range(5, 10)]]


def test_a_single_threaded_trainer_forks_its_fork_server_at_import(tmp_path):
    # A pipe open before the import: the trainer closes its write end and must see EOF at
    # once (a server holding the write end would keep it open). An atexit handler registered
    # before the import must run once (in the trainer), never in the server.
    before = textwrap.dedent(f"""
        r, w = os.pipe()
        log = {str(tmp_path / "atexit.log")!r}
        atexit.register(lambda: open(log, "a").write(f"{{os.getpid()}}\\n"))
    """)
    after = textwrap.dedent("""
        os.close(w)
        out["eof"] = bool(select.select([r], [], [], 10)[0]) and os.read(r, 1) == b""
        out["pipe_in_server"] = any(v.startswith("pipe:") and os.readlink(f"/proc/self/fd/{r}") == v
                                    for v in out["fds"].values())
    """)
    out, _ = run(tmp_path, before=before, after=after)
    assert out["forked"] and out["ppid_is_me"]
    assert out["batches"] == EXPECTED
    assert out["eof"] and not out["pipe_in_server"]
    assert (tmp_path / "atexit.log").read_text().split() == [str(out["me"])]


@pytest.mark.parametrize("why,before,env", [
    ("a thread runs", "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()",
     {}),
    ("SHMPIPE_TORCH_FORK=0", "", {"SHMPIPE_TORCH_FORK": "0"}),
    ("a limit below what torch takes", "", {"SHMPIPE_TORCH_FORK_MAX_MB": "16"}),
    ("a channel is mapped", "from shmpipe import _native\n"
     "tx = _native.Sender.anonymous(slots=64, blocks=2, block_size=4096)", {}),
])
def test_otherwise_the_fork_server_is_a_fresh_interpreter(tmp_path, why, before, env):
    out, _ = run(tmp_path, before=before, env=env)
    assert not out["forked"], (why, out)
    assert out["batches"] == EXPECTED


def test_killing_a_trainer_ends_its_forked_server(tmp_path):
    path = tmp_path / "sleeper.py"
    path.write_text(SCRIPT.format(here=HERE, before="", after="print(json.dumps(out), "
                                  "flush=True)\n    time.sleep(60)"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHMPIPE_TORCH_")}
    p = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        out = json.loads(line)
        assert out["forked"]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        gone(out["server"])
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_module_half_imported_at_the_fork_is_imported_whole_by_workers(tmp_path):
    # halfway.py imports shmpipe.torch at its top (the fork happens inside that import),
    # and defines its dataset after: workers must see the whole module, not the first line.
    (tmp_path / "halfway.py").write_text(textwrap.dedent("""
        import numpy as np
        import shmpipe.torch
        import torch

        class Late(torch.utils.data.Dataset):
            def __len__(self):
                return 10
            def __getitem__(self, i):
                return np.full(4, i, np.float32)
    """))
    before = f"sys.path.insert(0, {str(tmp_path)!r})\nimport halfway"
    after = textwrap.dedent("""
        out["late"] = [b.tolist() for b in shmpipe.torch.DataLoader(halfway.Late(), batch_size=5,
                                                                     num_workers=2)]
    """)
    out, _ = run(tmp_path, before=before, after=after)
    assert out["forked"]
    assert out["late"] == EXPECTED


def test_a_process_of_the_forked_server_can_start_its_own_fork_server_processes():
    import shmpipe.torch._context
    import torch_datasets as tds
    server = shmpipe.torch._procs._fork_server()._forkserver_pid
    with open(f"/proc/{server}/cmdline", "rb") as f:
        if b"-c" in f.read().split(b"\0"):
            pytest.skip("this test process's fork server is a spawned one")
    p = shmpipe.torch._context.CONTEXT.Process(target=tds.start_a_forkserver_child)
    p.start()
    try:
        p.join(120)
        assert p.exitcode == 0
    finally:
        if p.is_alive():
            p.kill()
            p.join()
