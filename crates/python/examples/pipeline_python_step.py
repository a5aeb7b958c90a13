"""A pipeline with a Python step in two worker processes.

Steps travel to the workers like multiprocessing's spawn targets: by module and name. A
function of this script works (the workers import the script as ``__mp_main__``, so the
``if __name__ == "__main__":`` guard matters); a lambda does not (refused with a clear error).

    python crates/python/examples/pipeline_python_step.py
"""

import numpy as np

import shmpipe


def normalise(item):
    """One output per input."""
    x = item["x"]
    item["x"] = (x - x.mean()) / (x.std() + 1e-6)
    return item


def windows(item):
    """Flat-map: 0..n outputs per input (here: non-overlapping windows of 16)."""
    x = item["x"]
    return [{"id": item["id"], "w": k, "x": x[k:k + 16]} for k in range(0, len(x) - 15, 16)]


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    data = [{"id": i, "x": rng.normal(size=int(rng.integers(10, 100))).astype(np.float32)}
            for i in range(1000)]
    pipe = shmpipe.Pipeline(data, steps=[normalise, windows], workers=2, ordered=True)
    n = 0
    for out in pipe:
        n += 1
    print(f"{n} windows of 16 from {len(data)} series; last: id {out['id']} window {out['w']}")
    try:
        shmpipe.Pipeline(data, steps=[lambda d: d])
    except ValueError as e:
        print("a lambda is refused:", e)
