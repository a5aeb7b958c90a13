"""Where a worker's time goes on the GluonTS user-chain path, in this process.

Runs the worker step of ``shmpipe.gluonts.TrainDataLoader`` (``_step.TransformStep``: JSON
parse, ``FileDataset``'s processing, the user's chain, batch encoding) over the benchmark's
entries, as a worker does, and prints CPU time per window, then cProfile's top functions:

    python crates/python/bench/profile_gluonts_worker.py [--entries 1000] [--gluonts-code]
        [--deepar] [--top 25] [--data /tmp/shmpipe_gluonts_long.jsonl]

``--deepar``: DeepAR's chain without the user's step; ``--gluonts-code``: ``fast_path=False``
(every step GluonTS's own code).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gluonts_training as bench  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/tmp/shmpipe_gluonts_long.jsonl")
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--gluonts-code", action="store_true")
    ap.add_argument("--deepar", action="store_true")
    a = ap.parse_args()
    from gluonts.dataset.common import FileDataset
    from gluonts.torch.batchify import batchify

    from shmpipe.gluonts import TrainDataLoader

    if not os.path.exists(a.data):
        bench.generate(a.data)
    dl = TrainDataLoader(FileDataset(a.data, freq="h"), transform=bench.training_chain(
        not a.deepar), batch_size=bench.BATCH, stack_fn=batchify, num_workers=1, seed=0,
        fast_path=not a.gluonts_code)
    if dl.fast_path:
        sys.exit("the chain is on the Rust fast path: nothing of the worker to profile")
    import pickle

    step = pickle.loads(pickle.dumps(dl._step))  # the worker's own copy
    src = dl._source
    items = [src[i % len(src)] for i in range(a.entries)]
    out = []

    def run():
        for it in items:
            out.extend(step(it))
        out.extend(step.finish())

    t0 = time.process_time()
    run()
    cpu = time.process_time() - t0
    windows = sum(int(b["n"]) for b in out)
    print(f"{a.entries} entries, {windows} windows: {cpu / a.entries * 1e3:.3f} ms CPU per "
          f"entry, {cpu / max(windows, 1) * 1e3:.3f} ms per window")
    out.clear()
    step.pending = []
    pr = cProfile.Profile()
    pr.enable()
    run()
    pr.disable()
    st = pstats.Stats(pr)
    st.sort_stats("tottime").print_stats(a.top)
    st.sort_stats("cumulative").print_stats(a.top)
    np.random.seed(0)


if __name__ == "__main__":
    main()
