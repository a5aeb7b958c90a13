"""What workers see of the trainer's process state (trial 19): ``os.environ`` as it is when the
iterator starts and the trainer's ``sys.argv`` (as torch's ``spawn`` passes them), and a
``__main__`` without a file (a notebook, ``python -c``, ``python -``), whose classes no fresh
worker can import: refused in the trainer with a clear error, never a worker that dies."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import procs

pytest.importorskip("torch")

# The trainer: a module-level argparse with a required argument (read when the workers import
# the script), environment changes after `import shmpipe.torch` (PS_DROPPED is set when it
# starts), and what each worker sees of them in __setstate__ (the dataset unpickled),
# worker_init_fn and __getitem__. (Under spawn the script's module level runs again in each
# worker: it leaves the environment alone here.)
SCRIPT = textwrap.dedent("""
    import argparse, json, os, sys, threading, time
    if {threads}:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    import torch
    import shmpipe.torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    ARGS = parser.parse_args()
    SEEN = {{}}

    def init(worker_id):
        SEEN["init"] = os.environ.get("PS_VAR")

    class DS(torch.utils.data.Dataset):
        def __init__(self):
            self.n = 4          # (a state: unpickling calls __setstate__)
        def __setstate__(self, state):
            self.__dict__.update(state)
            self.unpickled = os.environ.get("PS_VAR")
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            return json.dumps({{"item": os.environ.get("PS_VAR"), "init": SEEN.get("init"),
                               "unpickled": getattr(self, "unpickled", "inherited"),
                               "dropped": os.environ.get("PS_DROPPED"), "argv": sys.argv,
                               "name": ARGS.name, "pid": os.getpid()}})

    if __name__ == "__main__":
        del os.environ["PS_DROPPED"]
        os.environ["PS_VAR"] = "when the loader was made"
        loader = shmpipe.torch.DataLoader(DS(), batch_size=None, num_workers=2,
                                          worker_init_fn=init, {kw})
        os.environ["PS_VAR"] = "when the iterator started"
        it = iter(loader)
        os.environ["PS_VAR"] = "after the start"
        print(json.dumps([json.loads(x) for x in it]), flush=True)
""")


@pytest.mark.parametrize("threads,kw", [
    (False, ""),                                    # the fork server is a fork of the trainer
    (True, ""),                                     # ... a fresh interpreter
    (False, "multiprocessing_context='forkserver'"),
    (False, "multiprocessing_context='spawn'"),     # (torch's own rules: as they were)
    (False, "multiprocessing_context='fork'"),
], ids=["forked-server", "spawned-server", "forkserver", "spawn", "fork"])
def test_workers_see_the_environment_and_argv_of_the_iterators_start(tmp_path, threads, kw):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.format(threads=threads, kw=kw))
    argv = [str(path), "--name", "run 7", "--name=run 8"]
    code, out = _run([sys.executable, *argv], env={"SHMPIPE_TORCH_FORK": None,
                                                    "SHMPIPE_TORCH_EAGER": None,
                                                    "PS_DROPPED": "deleted in main",
                                                    "PS_VAR": None})
    assert code == 0, out
    items = json.loads(out.strip().splitlines()[-1])
    assert len({i["pid"] for i in items}) == 2, items
    for i in items:
        assert i["item"] == "when the iterator started", i
        assert i["init"] == "when the iterator started", i
        assert i["unpickled"] in ("when the iterator started", "inherited"), i
        assert i["dropped"] is None, i
        assert i["argv"] == argv, i
        assert i["name"] == "run 8", i


NOTEBOOK = textwrap.dedent("""
    import threading, time, torch
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    from shmpipe.torch import DataLoader
    import torch_datasets

    class DS(torch.utils.data.Dataset):
        def __len__(self): return 4
        def __getitem__(self, i): return torch.tensor(i)

    def collate(batch):
        return torch.stack(batch).tolist()

    for name, make in [("module", lambda: DataLoader(torch_datasets.Counting(4), batch_size=2,
                                                     num_workers=2)),
                       ("main", lambda: DataLoader(DS(), batch_size=2, num_workers=2)),
                       ("collate", lambda: DataLoader(torch_datasets.Counting(4),
                                                      batch_size=2, num_workers=2,
                                                      collate_fn=collate)),
                       ("fork", lambda: DataLoader(DS(), batch_size=2, num_workers=2,
                                                   multiprocessing_context="fork"))]:
        try:
            print(name, [b if isinstance(b, list) else b.tolist() for b in make()], flush=True)
        except Exception as e:
            print(name, type(e).__name__, str(e).replace("\\n", " "), flush=True)
""")


@pytest.mark.parametrize("how", ["-c", "exec", "stdin", "stdin-forked-server"])
def test_a_main_without_a_file_is_refused_in_the_trainer_with_a_clear_error(tmp_path, how):
    code = NOTEBOOK
    if how == "stdin-forked-server":    # no thread: the fork server is a fork of the trainer
        code = "\n".join(line for line in code.splitlines() if "threading.Thread" not in line)
    path = tmp_path / "notebook.py"
    path.write_text(code)
    if how == "-c":
        args, stdin = [sys.executable, "-c", code], None
    elif how == "exec":
        args, stdin = [sys.executable, "-c", f"exec(open({str(path)!r}).read())"], None
    else:
        args, stdin = [sys.executable, "-"], code
    code, out = _run(args, stdin=stdin, env={"PYTHONPATH": procs.HERE})
    assert code == 0, out
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert lines.get("module") == "[[0, 1], [2, 3]]", out
    assert lines.get("fork") == "[[0, 1], [2, 3]]", out
    for name, what in (("main", "DS"), ("collate", "collate")):
        assert lines.get(name, "").startswith("TypeError"), out
        assert f"'{what}'" in lines[name] and 'multiprocessing_context="fork"' in lines[name], out
    assert "Details are lost" not in out and "Traceback" not in out, out
    assert "could not import" not in out, out     # no main script to import: no note


def _run(args, stdin=None, env=None, limit=300):
    """Runs ``args`` in its own session (the whole group is killed if it overruns); (returncode,
    output with stderr). ``env`` entries set to None are removed."""
    full_env = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            full_env.pop(k, None)
        else:
            full_env[k] = v
    p = subprocess.Popen(args, cwd=procs.HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env=full_env)
    try:
        out, _ = p.communicate(stdin, timeout=limit)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        return None, p.communicate()[0]


# The program's own forkserver children (multiprocessing's process-wide fork server) after
# `import shmpipe.torch`: started at their first use, as without shmpipe, so that they see
# the environment as it is then; shmpipe's workers come from its own server.
OWN_SERVER = textwrap.dedent("""
    import json, multiprocessing as mp, os, sys, threading, time
    if {threads}:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    import shmpipe.torch
    import torch_datasets
    from multiprocessing import forkserver

    def child(q):
        q.put((os.environ.get("LATE_VAR"), os.getppid()))

    if __name__ == "__main__":
        running = forkserver._forkserver._forkserver_pid is not None
        batches = [b.tolist() for b in shmpipe.torch.DataLoader(
            torch_datasets.Counting(4), batch_size=2, num_workers=2)]
        os.environ["LATE_VAR"] = "set after the import"
        ctx = mp.get_context("forkserver")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        late, parent = q.get(timeout=60)
        p.join()
        again = [b.tolist() for b in shmpipe.torch.DataLoader(
            torch_datasets.Counting(4), batch_size=2, num_workers=2,
            multiprocessing_context="forkserver")]
        ours = shmpipe.torch._procs._fork_server()._forkserver_pid
        print(json.dumps({{"running": running, "late": late, "ours": parent == ours,
                          "batches": batches, "again": again}}), flush=True)
""")


@pytest.mark.parametrize("threads", [False, True], ids=["forked-server", "spawned-server"])
def test_the_process_wide_fork_server_is_left_to_the_program(tmp_path, threads):
    path = tmp_path / "own_server.py"
    path.write_text(OWN_SERVER.format(threads=threads))
    code, out = _run([sys.executable, str(path)], env={"SHMPIPE_TORCH_FORK": None,
                                                        "SHMPIPE_TORCH_EAGER": None,
                                                        "PYTHONPATH": procs.HERE})
    assert code == 0, out
    got = json.loads(out.strip().splitlines()[-1])
    assert got["batches"] == got["again"] == [[0, 1], [2, 3]], got
    assert not got["running"], got
    assert got["late"] == "set after the import" and not got["ours"], got
