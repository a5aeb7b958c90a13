"""Arrays between two Python processes: shmpipe (a loan filled in place, a plain send, and the
batch form send_many/recv_many) vs multiprocessing.Queue, vs multiprocessing.shared_memory with
names passed on a queue, vs a pipe. Ratios printed, rates in records (arrays) per second.

Work per message, the same for every transport (as in the Rust harness, crates/bench): the
producer writes every element of message ``seq`` (value ``seq % 4 + 1``), the consumer reads
every element (a numpy sum, in place: float32 sums of these integers stay below 2**24, so
they are exact) and checks it. OpenBLAS's idle threads (which spin, stealing a core from
whichever process is the other end) are turned off for every transport alike. The consumer
times from the end of a warm-up to the last message.

    python crates/python/bench/bench_transport.py                   # 16 and 1M floats
    python crates/python/bench/bench_transport.py --rust            # + the Rust harness's shm-zero-copy figure in the same run

The batch form moves BATCH records of 16 floats per call; its peer is mp.Queue with one
record per put (the goal's reference), and, for context, mp.Queue with BATCH records per put.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time
import uuid

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy; inherited by the children

import numpy as np  # noqa: E402

import shmpipe  # noqa: E402

WARMUP = 0.1


def _check(x: np.ndarray, seq: int) -> None:
    want = float((seq % 4 + 1) * x.size)
    got = float(x.sum())  # reads every element; exact (integers < 2**24)
    if got != want:
        raise AssertionError(f"message {seq}: sum {got} != {want}")


class _Clock:
    def __init__(self):
        self.t0 = None
        self.n0 = 0
        self.start = time.perf_counter()

    def tick(self, n: int) -> None:
        if self.t0 is None and time.perf_counter() - self.start > WARMUP:
            self.t0, self.n0 = time.perf_counter(), n

    def rate(self, n: int) -> float:
        t0, n0 = (self.t0, self.n0) if self.t0 is not None else (self.start, 0)
        return (n - n0) / (time.perf_counter() - t0)


# --- shmpipe ---------------------------------------------------------------------------

BATCH = 512


def shm_producer(name, n, duration, ready, mode):
    tx = shmpipe.Sender.create(name, blocks=8, block_size=max(1 << 20, n * 4), threshold=1 << 16)
    ready.set()
    tx.wait_for_consumer(30)
    end = time.perf_counter() + duration
    seq = 0
    small = np.empty(n, np.float32)
    f32 = np.float32
    if mode == "batch":
        xs = np.empty((BATCH, n), np.float32)
        col = xs[:, :1]
        base = np.arange(BATCH)
        while time.perf_counter() < end:
            col[:, 0] = (base + seq) % 4 + 1  # every element of every record written:
            xs[:] = col                         # the first column, then broadcast
            tx.send_many({"x": xs})
            seq += BATCH
    else:
        while time.perf_counter() < end:
            if mode == "loan":
                buf = tx.loan((n,), f32)
                buf.fill(seq % 4 + 1)
                tx.send({"x": buf})
                del buf  # its block comes back once the consumer is done too
            else:
                small.fill(seq % 4 + 1)
                tx.send({"x": small})
            seq += 1
    tx.close()


def shm_consumer(name, q, mode):
    rx = shmpipe.Receiver.open(name, timeout=30)
    clock, seq = _Clock(), 0
    if mode == "batch":
        while True:
            try:
                x = rx.recv_many()["x"]
            except shmpipe.Disconnected:
                break
            _check_rows(x, seq)
            seq += len(x)
            clock.tick(seq)
    else:
        for m in rx:
            _check(m["x"], seq)
            seq += 1
            clock.tick(seq)
    q.put(clock.rate(seq))


def _check_rows(x: np.ndarray, seq: int) -> None:
    want = ((np.arange(seq, seq + len(x)) % 4 + 1) * x.shape[1]).astype(np.float32)
    got = x.sum(axis=1)  # reads every element of every record; exact (small integers)
    if not np.array_equal(got, want):
        raise AssertionError(f"records {seq}..{seq + len(x)}: sums differ")


# --- multiprocessing.Queue ---------------------------------------------------------------

def queue_producer(q, n, duration, batch=1):
    end = time.perf_counter() + duration
    seq = 0
    base = np.arange(batch)
    while time.perf_counter() < end:
        if batch == 1:
            q.put(np.full(n, seq % 4 + 1, np.float32))
        else:
            xs = np.empty((batch, n), np.float32)
            xs[:] = ((base + seq) % 4 + 1)[:, None]
            q.put(xs)
        seq += batch
    q.put(None)


def queue_consumer(q, out, batch=1):
    clock, seq = _Clock(), 0
    while (x := q.get()) is not None:
        if batch == 1:
            _check(x, seq)
            seq += 1
        else:
            _check_rows(x, seq)
            seq += len(x)
        clock.tick(seq)
    out.put(clock.rate(seq))


# --- multiprocessing.shared_memory, names on a queue --------------------------------------

SLOTS = 8


def sm_producer(q, free, n, duration, names):
    from multiprocessing import shared_memory
    segs = [shared_memory.SharedMemory(name=nm) for nm in names]
    arrs = [np.ndarray((n,), np.float32, buffer=s.buf) for s in segs]
    end = time.perf_counter() + duration
    seq = 0
    while time.perf_counter() < end:
        i = free.get()
        arrs[i].fill(seq % 4 + 1)
        q.put((names[i], i))
        seq += 1
    q.put(None)
    del arrs
    for s in segs:
        s.close()


def sm_consumer(q, free, n, out):
    from multiprocessing import shared_memory
    attached = {}
    clock, seq = _Clock(), 0
    while (msg := q.get()) is not None:
        nm, i = msg
        if nm not in attached:  # attach once per segment, like a real user would cache
            s = shared_memory.SharedMemory(name=nm)
            attached[nm] = (s, np.ndarray((n,), np.float32, buffer=s.buf))
        _check(attached[nm][1], seq)
        free.put(i)
        seq += 1
        clock.tick(seq)
    out.put(clock.rate(seq))
    for s, a in attached.values():
        del a
    attached.clear()


# --- a pipe ---------------------------------------------------------------------------------

def pipe_producer(conn, n, duration):
    end = time.perf_counter() + duration
    seq = 0
    while time.perf_counter() < end:
        conn.send_bytes(np.full(n, seq % 4 + 1, np.float32))
        seq += 1
    conn.send_bytes(b"")
    conn.close()


def pipe_consumer(conn, out):
    clock, seq = _Clock(), 0
    while b := conn.recv_bytes():
        _check(np.frombuffer(b, np.float32), seq)
        seq += 1
        clock.tick(seq)
    out.put(clock.rate(seq))


def run(kind: str, n: int, duration: float) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = []
    cleanup = []
    if kind.startswith("shmpipe"):
        mode = {"shmpipe loan": "loan", "shmpipe send": "send", "shmpipe send_many": "batch"}[kind]
        name = f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        ready = ctx.Event()
        procs = [ctx.Process(target=shm_producer, args=(name, n, duration, ready, mode))]
        procs[0].start()
        ready.wait(30)
        procs.append(ctx.Process(target=shm_consumer, args=(name, out, mode)))
        procs[1].start()
    elif kind.startswith("mp.Queue"):
        batch = BATCH if kind.endswith("batched") else 1
        q = ctx.Queue(maxsize=64)
        procs = [ctx.Process(target=queue_producer, args=(q, n, duration, batch)),
                 ctx.Process(target=queue_consumer, args=(q, out, batch))]
    elif kind == "shared_memory":
        from multiprocessing import shared_memory
        segs = [shared_memory.SharedMemory(create=True, size=n * 4) for _ in range(SLOTS)]
        cleanup = segs
        q, free = ctx.Queue(), ctx.Queue()
        for i in range(SLOTS):
            free.put(i)
        names = [s.name for s in segs]
        procs = [ctx.Process(target=sm_producer, args=(q, free, n, duration, names)),
                 ctx.Process(target=sm_consumer, args=(q, free, n, out))]
    elif kind == "pipe":
        r, w = ctx.Pipe(duplex=False)
        procs = [ctx.Process(target=pipe_producer, args=(w, n, duration)),
                 ctx.Process(target=pipe_consumer, args=(r, out))]
    for p in procs:
        if not p.is_alive() and p.exitcode is None:
            p.start()
    try:
        rate = out.get(timeout=duration + 60)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        for s in cleanup:
            s.close()
            s.unlink()
    return rate


def rust_zero_copy() -> dict[str, float]:
    """msgs/s of the Rust harness's shm-zero-copy transport at 16 and 1M floats (same run)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    cmd = ["cargo", "run", "--release", "-q", "-p", "shmpipe-bench", "--", "transport",
           "--sizes", "16,1M", "--transports", "shm-zero-copy", "--rounds", "3", "--no-progress"]
    res = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=1800)
    out = {}
    size = None
    for line in res.stdout.splitlines():  # sections "16 f32 (64 B)", rows "  shm-zero-copy  602 k ..."
        h = re.match(r"^(\d+) f32", line)
        if h:
            size = int(h.group(1))
        m = re.match(r"^\s*shm-zero-copy\s+([\d.]+)\s*([kM]?)\s", line)
        if m and size is not None:
            rate = float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6}[m.group(2)]
            out["16" if size == 16 else "1M"] = rate
    if not out:
        print(res.stdout[-2000:], res.stderr[-2000:], file=sys.stderr)
    return out


KINDS = {
    "16": ["shmpipe loan", "shmpipe send", "shmpipe send_many", "mp.Queue",
           "mp.Queue batched", "shared_memory", "pipe"],
    "1M": ["shmpipe loan", "mp.Queue", "shared_memory", "pipe"],
}
SIZES = {"16": 16, "1M": 1 << 20}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1.0, help="seconds per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median taken)")
    ap.add_argument("--rust", action="store_true", help="also run the Rust harness (cargo)")
    ap.add_argument("--sizes", default="16,1M", help="comma-separated: 16, 1M")
    args = ap.parse_args()
    sizes = {k: SIZES[k] for k in args.sizes.split(",")}
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, cpus {os.cpu_count()}, "
          f"python {sys.version.split()[0]}, batch {BATCH}")
    res: dict = {}
    for r in range(args.rounds):
        for label, n in sizes.items():
            kinds = KINDS[label]
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            for k in order:
                res.setdefault((label, k), []).append(run(k, n, args.duration))
    med = {key: float(np.median(v)) for key, v in res.items()}
    # The Rust harness right after the Python rounds, in the same invocation.
    rust = rust_zero_copy() if args.rust else {}
    print("| floats | transport | records/s | GB/s | vs mp.Queue (1 per put) |")
    print("|---|---|---|---|---|")
    for label, n in sizes.items():
        q = med[(label, "mp.Queue")]
        for k in KINDS[label]:
            v = med[(label, k)]
            print(f"| {label} | {k} | {v:,.0f} | {v * n * 4 / 1e9:.2f} | {v / q:.1f}x |")
        if label in rust:
            print(f"| {label} | Rust harness shm-zero-copy | {rust[label]:,.0f} | "
                  f"{rust[label] * n * 4 / 1e9:.2f} | {rust[label] / q:.1f}x |")
    print(f"# load at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    goals = []
    if "16" in sizes:
        q16 = med[("16", "mp.Queue")]
        goals += [("16 floats, loan >= 10x mp.Queue", med[("16", "shmpipe loan")] / q16, 10),
                  ("16 floats, send >= 10x mp.Queue", med[("16", "shmpipe send")] / q16, 10),
                  ("16 floats, loan >= send", med[("16", "shmpipe loan")] / med[("16", "shmpipe send")], 1),
                  ("16 floats, batch form >= 30x mp.Queue", med[("16", "shmpipe send_many")] / q16, 30)]
    if "1M" in sizes:
        goals.append(("1M floats >= 50x mp.Queue",
                      med[("1M", "shmpipe loan")] / med[("1M", "mp.Queue")], 50))
        if "1M" in rust:
            goals.append(("1M floats >= 0.8x Rust zero-copy", med[("1M", "shmpipe loan")] / rust["1M"], 0.8))
    for what, got, want in goals:
        print(f"goal {what}: {got:.2f}x {'met' if got >= want else 'NOT met'}")


if __name__ == "__main__":
    main()
