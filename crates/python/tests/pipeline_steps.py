"""Steps used by test_pipeline.py (importable by the worker processes)."""

import os
import time

import numpy as np


def double(item):
    item["x"] = item["x"] * 2
    return item


def fan(item):
    """0, 1 or 2 outputs per input."""
    return [dict(item, sub=j) for j in range(item["n"] % 3)]


def fail_on_7(item):
    if item["n"] == 7:
        raise ZeroDivisionError("seven is right out")
    return item


def tag_pid(item):
    item["pid"] = os.getpid()
    return item


def slow(item):
    time.sleep(0.05)
    return item


class Pairs:
    """Stateful: emits inputs in pairs; a last odd one at the end (finish)."""

    def __init__(self):
        self.held = []

    def __call__(self, item):
        self.held.append(item)
        if len(self.held) == 2:
            out, self.held = self.held, []
            return out
        return None

    def finish(self):
        return self.held


def items(n, width=4):
    return [{"n": i, "x": np.full(width, i, np.float32)} for i in range(n)]


def shout(item):
    print(f"step saw {item['n']}")
    return item


def count_true(item):
    """Reads the bool mask in the worker and passes every array on unchanged."""
    item["trues"] = int(item["mask"].sum())
    return item


# ----- the seed interface (test_pipeline_enqueue.py)

def add_1(arg):
    """The seed discussion's step: any value in, the value plus one out."""
    return arg + 1


def noisy_split(item):
    """Two outputs per input, each with draws of the input's own generator."""
    import shmpipe
    rng = shmpipe.item_rng()
    return [dict(item, sub=j, r=float(rng.random()), w=int(rng.integers(0, 1000)))
            for j in range(2)]


def noisy(item):
    import shmpipe
    item["r2"] = float(shmpipe.item_rng().random())
    return item


def slow_tag_pid(item):
    time.sleep(0.02)
    item["pid"] = os.getpid()
    return item


def sleepy(item):
    time.sleep(30)
    return item


def debug_me(item):
    """workers=0: a breakpoint here stops the calling process's pdb."""
    breakpoint()  # noqa: T100 - the test drives pdb through stdin
    item["seen"] = 1
    return item


class Opaque:
    """Not an item (no dict, array or scalar): a step may hand it to the next Python step,
    which runs in the same worker on the object as it is, but it could not cross processes."""

    def __init__(self, item):
        self.item = item


def wrap(item):
    return Opaque(item)


def unwrap(obj):
    assert isinstance(obj, Opaque), f"expected the Opaque object itself, got {type(obj)}"
    return obj.item
