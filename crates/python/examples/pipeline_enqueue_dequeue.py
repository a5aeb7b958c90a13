"""The seed's interface: enqueue items, dequeue outputs; workers=0 for debugging; persistent
workers over epochs; seeds that do not depend on the worker count.

    python crates/python/examples/pipeline_enqueue_dequeue.py
"""

import threading

import numpy as np

import shmpipe


def add_1(arg):
    return arg + 1


def load(batch):
    """A map-style dataset's fetch: a batch of indices in, one batch of samples out (as a
    torch DataLoader worker does)."""
    idx = np.asarray(batch["idx"])
    x = np.stack([np.full(8, i, np.float32) for i in idx])
    return {"idx": idx, "x": x}


def augment(item):
    """Randomness from shmpipe.item_rng(): per input, never per worker."""
    rng = shmpipe.item_rng()
    item["x"] = item["x"] + rng.normal(scale=0.1, size=item["x"].shape).astype(np.float32)
    return item


def windows(item):
    """Flat-map: two random windows of 4 per series."""
    rng = shmpipe.item_rng()
    starts = rng.integers(0, len(item["x"]) - 4, size=2)
    return [{"id": item["id"], "start": int(s), "x": item["x"][s:s + 4]} for s in starts]


if __name__ == "__main__":
    # 1. The seed discussion's example.
    p = shmpipe.Pipeline([add_1, add_1], workers=4)
    p.start()
    p.enqueue(3)
    assert p.dequeue() == 5
    p.close_input()
    assert p.dequeue() is None  # the exact end of stream
    p.close()
    print("enqueue(3) -> dequeue() == 5; then None at the end")

    # 2. A feeder thread and a consumer, in order, with back-pressure: the feeder waits
    #    while max_in_flight batches are in the pipeline. Batches of indices, as a
    #    DataLoader sends them to its workers.
    with shmpipe.Pipeline([load], workers=2, ordered=True, max_in_flight=8) as p:
        def feed():
            for b in range(100):
                p.enqueue({"idx": list(range(b * 32, b * 32 + 32))})
            p.close_input()

        t = threading.Thread(target=feed)
        t.start()
        first = [int(out["idx"][0]) for out in iter(p.dequeue, None)]
        t.join()
    assert first == [b * 32 for b in range(100)]
    print(f"{len(first)} batches in order from a feeder thread, at most 8 in flight")

    # 3. workers=0: the steps run here, in this thread (a breakpoint() in a step stops
    #    here); a step's exception is the StepError's __cause__.
    with shmpipe.Pipeline([add_1], workers=0) as p:
        p.enqueue("not a number")
        try:
            p.dequeue()
        except shmpipe.StepError as e:
            print(f"workers=0: step {e.step!r} failed with {type(e.__cause__).__name__}")

    # 4. Persistent workers: three epochs, the same processes; every epoch shuffled anew.
    data = [{"id": i, "x": np.arange(20, dtype=np.float32) * i} for i in range(200)]
    with shmpipe.Pipeline(data, steps=[augment, windows], workers=2, shuffle=True, seed=7,
                          ordered=True, persistent_workers=True) as p:
        epochs = []
        for epoch in range(3):
            epochs.append([(o["id"], o["start"], float(o["x"][0])) for o in p])
            print(f"epoch {epoch}: {len(epochs[-1])} windows from workers {p.pids}")

    # 5. The same seed, any worker count: the same windows, in the same order.
    for workers in (0, 1, 3):
        with shmpipe.Pipeline(data, steps=[augment, windows], workers=workers, shuffle=True,
                              seed=7, ordered=True, epochs=3) as p:
            assert [(o["id"], o["start"], float(o["x"][0])) for o in p] == sum(epochs, [])
    print("seed 7 gives the same windows with 0, 1, 2 and 3 workers")
