"""Faults under shmpipe.torch.DataLoader: dead workers, a killed trainer, Ctrl-C."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

import torch_datasets as tds  # noqa: E402
from shmpipe.torch import DataLoader  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("how,expect", [
    ("kill", r"DataLoader worker \(pid \d+\) is killed by signal: Killed"),
    ("segfault", r"DataLoader worker \(pid \d+\) is killed by signal: Segmentation fault"),
    ("exit", r"DataLoader worker \(pid \d+\) exited unexpectedly with exit code 3"),
])
def test_a_dead_worker_is_reported_with_its_pid_and_cause(how, expect):
    dl = DataLoader(tds.Dies(20, bad=5, how=how), batch_size=2, num_workers=2)
    t = time.monotonic()
    with pytest.raises(RuntimeError, match=expect):
        for _ in dl:
            pass
    assert time.monotonic() - t < 30


def test_the_other_workers_exit_after_a_worker_died():
    it = iter(DataLoader(tds.Dies(20, bad=5, how="kill"), batch_size=2, num_workers=2))
    workers = it._workers
    with pytest.raises(RuntimeError):
        list(it)
    del it
    for w in workers:
        w.join(30)
        assert not w.is_alive()


SCRIPT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {here!r})
    import torch_datasets as tds
    import shmpipe.torch._context
    from shmpipe.torch import DataLoader
    if __name__ == "__main__":
        it = iter(DataLoader(tds.Slow(1000, delay=0.05), batch_size=2, num_workers=2))
        next(it)
        pids = [w.pid for w in it._workers] + [shmpipe.torch._procs._fork_server()._forkserver_pid]
        print(" ".join(map(str, pids)), flush=True)
        {tail}
""")


def run_script(tmp_path, tail):
    path = tmp_path / "trainer.py"
    path.write_text(SCRIPT.format(here=HERE, tail=tail))
    p = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line, p.stderr.read()
    return p, [int(x) for x in line.split()]


def wait_gone(pids, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_killing_the_trainer_ends_every_worker_and_the_fork_server(tmp_path):
    p, pids = run_script(tmp_path, "time.sleep(60)")
    try:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        t = time.monotonic()
        left = wait_gone(pids, 10)
        assert not left, f"still alive {time.monotonic() - t:.1f} s after the trainer died"
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        p.kill()
        p.wait()


def test_ctrl_c_raises_keyboard_interrupt_and_workers_exit(tmp_path):
    tail = textwrap.dedent("""
        try:
            for _ in it:
                pass
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise SystemExit(0)
    """).strip().replace("\n", "\n    ")
    p, pids = run_script(tmp_path, tail)
    try:
        time.sleep(0.5)
        os.kill(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=30)
        assert "interrupted" in out, err
        assert p.returncode == 0
        assert not wait_gone(pids[:-1], 10)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
            p.wait()
