"""Run by test_pipeline_fork.py: iterates a pipeline and forks a helper. Modes:
``exit``: the helper exits normally (sys.exit: the interpreter finalizes the helper's copy of
the objects, the pipeline's among them); ``iterate``: the helper tries to take an output and
prints what happened. Then the parent takes 200 more outputs and prints ``OK 200``.
``enqueue``: the same for a pipeline fed with ``enqueue`` (see ``main_enqueue``)."""

import os
import signal
import sys

import numpy as np

import shmpipe
from process_steps import ident


def main(mode):
    p = shmpipe.Pipeline([{"n": i, "x": np.zeros(4, np.float32)} for i in range(64)],
                         [ident], workers=2, epochs=None)
    it = iter(p)
    next(it)
    pids = list(p.pids)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        # A fork that hangs (as the iteration of its copy did) must not outlive the test.
        signal.alarm(20)
        os.close(r)
        if mode == "iterate":
            try:
                next(it)
                said = "GOT an output"
            except Exception as e:  # noqa: BLE001
                said = f"REFUSED {type(e).__name__}: {e}"
            os.write(w, said.encode())
        sys.exit(0)  # a forked helper whose work is done
    os.close(w)
    said = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    print(f"CHILD {said}", flush=True)
    got = 0
    try:
        for _ in range(200):
            next(it)
            got += 1
        print(f"OK {got}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"FAILED after {got} items: {type(e).__name__}: {e}", flush=True)
    finally:
        p.close()
    alive = [q for q in pids if os.path.exists(f"/proc/{q}")]
    print(f"pids {pids} left {alive}", flush=True)


def main_enqueue():
    """Enqueue mode: the fork's copy refuses enqueue, dequeue, close_input and pending, and
    its exit leaves the parent's run alone; the parent then feeds and takes 200 more."""
    p = shmpipe.Pipeline([ident], workers=2)
    p.enqueue({"n": -1})
    assert p.dequeue()["n"] == -1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # as in main
        os.close(r)
        said = []
        for name, call in [("enqueue", lambda: p.enqueue({"n": 0})), ("dequeue", p.dequeue),
                           ("close_input", p.close_input), ("pending", lambda: p.pending)]:
            try:
                call()
                said.append(f"{name} WORKED")
            except shmpipe.PipelineError as e:
                said.append(f"{name} REFUSED" if "fork" in str(e) else f"{name} {e}")
            except Exception as e:  # noqa: BLE001
                said.append(f"{name} {type(e).__name__}: {e}")
        os.write(w, ", ".join(said).encode())
        sys.exit(0)
    os.close(w)
    said = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    print(f"CHILD {said}", flush=True)
    try:
        for i in range(200):
            p.enqueue({"n": i})
        p.close_input()
        got = sorted(out["n"] for out in iter(p.dequeue, None))
        print("OK 200" if got == list(range(200)) else f"WRONG {got[:10]}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"FAILED: {type(e).__name__}: {e}", flush=True)
    finally:
        p.close()


if __name__ == "__main__":
    if sys.argv[1] == "enqueue":
        main_enqueue()
    else:
        main(sys.argv[1])
