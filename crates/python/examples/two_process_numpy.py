"""Two processes, numpy arrays zero-copy: a producer fills arrays in shared memory in place,
a multiprocessing spawn child reads them where they lie.

    python crates/python/examples/two_process_numpy.py
"""

import multiprocessing as mp

import numpy as np

import shmpipe


def consumer(handle):
    rx = handle.open()
    for msg in rx:  # ends when the producer closes
        frame = msg["frame"]  # a numpy view into shared memory: no copy
        print(f"frame {msg.meta['i']}: shape {frame.shape}, mean {frame.mean():.1f}")


if __name__ == "__main__":
    tx, handle = shmpipe.pipe(blocks=4, block_size=4 << 20)
    child = mp.get_context("spawn").Process(target=consumer, args=(handle,))
    child.start()
    for i in range(5):
        frame = tx.loan((480, 640, 3), np.float32)  # a writable array inside the pool
        frame[:] = i  # the only write of the data
        tx.send({"frame": frame}, meta={"i": i})
    tx.close()
    child.join()
