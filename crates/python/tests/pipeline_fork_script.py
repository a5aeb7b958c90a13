"""Run by test_pipeline_fork.py: iterates a pipeline and forks a helper. Modes:
``exit``: the helper exits normally (sys.exit: the interpreter finalizes the helper's copy of
the objects, the pipeline's among them); ``iterate``: the helper tries to take an output and
prints what happened. Then the parent takes 200 more outputs and prints ``OK 200``."""

import os
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


if __name__ == "__main__":
    main(sys.argv[1])
