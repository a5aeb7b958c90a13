"""shmpipe.torch.DataLoader vs torch.utils.data.DataLoader, same machine, same run, ratios.

    python crates/python/bench/bench_torch.py            # every scenario
    python crates/python/bench/bench_torch.py small image first pss smallshm

Scenarios (both loaders with the same dataset, the same options, ``num_workers=2`` unless
said; torch with its default start method, fork on Linux; the trainer reads every element
of every batch, as a training step would):

- ``small``: samples of 16 float32, batch 256; three datasets: numpy rows from a custom
  ``Dataset``, torch rows from a custom ``Dataset``, and a ``TensorDataset``. Goal >= 2x.
- ``image``: 3x224x224 uint8 images stored compressed, decoded and normalised to float32
  in ``__getitem__``, batch 32. Goal >= 1.2x.
- ``first``: time to the first batch with 8 workers, in a fresh process: "cold" right
  after the imports (the fork server was made by ``import shmpipe.torch``, moments
  before: a fork of the trainer, and for "shmpipe-spawned" a fresh interpreter that imports
  torch), "warm" for a second loader in the same process. Goal: <= torch's.
- ``pss``: a dataset held as a Python list of 1M arrays of 16 float32, 4 workers, one
  shuffled epoch with persistent workers: summed PSS of anonymous and shared memory
  (``Pss_Anon + Pss_Shmem``) of every process of the loader (the trainer, its workers, and
  for shmpipe the fork server) at the end of the epoch, minus the same loader's with a
  1-item list, over the dataset's own size (the trainer's growth when it built the list).
  File-backed pages (torch's libraries) are left out: their PSS moves with every unrelated
  process on the machine that maps the same files. Goal <= 1.2x. Also printed: the time
  from the iterator's creation to the first batch (shmpipe: the list shared, workers started).
- ``smallshm``: 1 MB samples, batch 64 (64 MB batches), in a private mount namespace with a
  64 MB ``/dev/shm`` (``unshare -m``, needs root): runs to the end or not.

Every figure is printed with the UTC time and the load average: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zlib

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # spinning BLAS threads, for both alike

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.utils.data as tud  # noqa: E402

import shmpipe.torch  # noqa: E402

HERE = os.path.abspath(__file__)


# -- datasets (top level: workers import them) ------------------------------------------------

class NumpyRows(tud.Dataset):
    def __init__(self, n, width=16):
        self.x = np.random.default_rng(0).random((n, width), dtype=np.float32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


class TorchRows(tud.Dataset):
    def __init__(self, n, width=16):
        self.x = torch.from_numpy(np.random.default_rng(0).random((n, width), dtype=np.float32))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


class Images(tud.Dataset):
    """Compressed 3x224x224 uint8 images, decoded and normalised to float32 per sample."""

    MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
    STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)

    def __init__(self, n, distinct=64):
        rng = np.random.default_rng(0)
        # Smooth images (like photos, unlike noise) compress to ~1/3.
        y, x = np.mgrid[0:224, 0:224]
        self.blobs = []
        for i in range(distinct):
            img = np.stack([(x * (c + 1) + y * (i + 1) + rng.integers(0, 16, (224, 224)))
                            % 256 for c in range(3)]).astype(np.uint8)
            self.blobs.append(zlib.compress(img.tobytes(), 6))
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        raw = np.frombuffer(zlib.decompress(self.blobs[i % len(self.blobs)]), np.uint8)
        img = raw.reshape(3, 224, 224).astype(np.float32) * (1 / 255)
        return (img - self.MEAN) / self.STD, i % 1000


class ListOfArrays(tud.Dataset):
    def __init__(self, n, width=16):
        rng = np.random.default_rng(0)
        self.items = [rng.random(width, dtype=np.float32) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class Big(tud.Dataset):
    def __init__(self, n, nbytes):
        self.n, self.numel = n, nbytes // 4

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((self.numel,), float(i))


LOADERS = {"torch": tud.DataLoader, "shmpipe": shmpipe.torch.DataLoader}


# -- helpers --------------------------------------------------------------------------------

def stamp() -> str:
    load = os.getloadavg()
    return (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            + f", load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def consume(batch) -> int:
    """Reads every element of every tensor in the batch; returns the number of samples."""
    if isinstance(batch, torch.Tensor):
        float(batch.sum())
        return len(batch)
    return max(consume(b) for b in batch)


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(kind, ds, seconds, **kw) -> tuple[float, float]:
    """(samples/s, CPU microseconds per sample summed over the trainer and its workers)."""
    dl = LOADERS[kind](ds, num_workers=2, persistent_workers=True, **kw)
    for i, b in enumerate(dl):          # warm-up: workers up, pools warm
        consume(b)
        if i == 20:
            break
    pids = [os.getpid()] + [w.pid for w in dl._iterator._workers]
    cpu0 = sum(cpu_seconds(p) for p in pids)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for b in dl:
            n += consume(b)
            if time.perf_counter() - t0 >= seconds:
                break
    rate = n / (time.perf_counter() - t0)
    cpu = (sum(cpu_seconds(p) for p in pids) - cpu0) / n * 1e6
    if dl._iterator is not None:
        dl._iterator._shutdown_workers()
    return rate, cpu


def compare(name, ds, goal, rounds, seconds, **kw):
    print(f"\n{name}  [{stamp()}]")
    ratios, cpus = [], []
    for r in range(rounds):
        (a, ca), (b, cb) = throughput("torch", ds, seconds, **kw), \
            throughput("shmpipe", ds, seconds, **kw)
        ratios.append(b / a)
        cpus.append(ca / cb)
        print(f"  round {r}: torch {a:,.0f} samples/s ({ca:.2f} us CPU/sample), shmpipe "
              f"{b:,.0f} samples/s ({cb:.2f} us CPU/sample), ratio {b / a:.2f}x, CPU per "
              f"sample {ca / cb:.2f}x less  [{stamp()}]")
    med = sorted(ratios)[len(ratios) // 2]
    medc = sorted(cpus)[len(cpus) // 2]
    print(f"  median ratio {med:.2f}x (goal >= {goal}x: {'met' if med >= goal else 'NOT met'}); "
          f"median CPU per sample {medc:.2f}x less than torch")
    return med


def bench_small(args):
    n = 200_000
    out = {}
    out["numpy rows"] = compare("small: 16 float32 numpy rows (custom Dataset), batch 256",
                                NumpyRows(n), 2.0, args.rounds, args.seconds, batch_size=256)
    out["torch rows"] = compare("small: 16 float32 torch rows (custom Dataset), batch 256",
                                TorchRows(n), 2.0, args.rounds, args.seconds, batch_size=256)
    x = TorchRows(n).x
    out["TensorDataset"] = compare("small: TensorDataset of 16 float32, batch 256",
                                   tud.TensorDataset(x), 2.0, args.rounds, args.seconds,
                                   batch_size=256)
    return out


def bench_image(args):
    return compare("image: 3x224x224 uint8 decoded (zlib) + normalised to float32, batch 32",
                   Images(2048), 1.2, args.rounds, args.seconds, batch_size=32)


# -- time to first batch (fresh processes) ---------------------------------------------------

# "shmpipe-spawned": shmpipe with the fork server spawned as a fresh interpreter (what
# happens when the trainer is not single-threaded at `import shmpipe.torch`, and what every
# run did before the forked server).
FIRST_KINDS = ("torch", "shmpipe", "shmpipe-spawned")


def child_first(kind: str) -> None:
    ds = NumpyRows(100_000)
    t0 = time.perf_counter()
    dl = LOADERS[kind.split("-")[0]](ds, batch_size=256, num_workers=8)
    it = iter(dl)
    consume(next(it))
    cold = time.perf_counter() - t0
    del it, dl
    t0 = time.perf_counter()
    it = iter(LOADERS[kind.split("-")[0]](ds, batch_size=256, num_workers=8))
    consume(next(it))
    warm = time.perf_counter() - t0
    print(json.dumps({"cold": cold, "warm": warm}))


def child_env(kind: str) -> dict:
    """The environment of a fresh process measuring ``kind``: torch's runs do not start
    shmpipe's fork server (this file imports shmpipe.torch), which would compete with them."""
    env = dict(os.environ)
    if kind == "torch":
        env["SHMPIPE_TORCH_EAGER"] = "0"
    if kind == "shmpipe-spawned":
        env["SHMPIPE_TORCH_FORK"] = "0"
    return env


def run_child(argv, kind) -> dict:
    r = subprocess.run([sys.executable, HERE, *argv], capture_output=True, text=True,
                       env=child_env(kind), timeout=1800)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_first(args):
    print(f"\nfirst: time to the first batch, 8 workers, fresh process  [{stamp()}]")
    res = {}
    for r in range(args.rounds):
        for kind in FIRST_KINDS:
            res.setdefault(kind, []).append(run_child(["--child-first", kind], kind))
        print(f"  round {r}: " + " | ".join(
            f"{k} cold {res[k][-1]['cold']:.3f} s warm {res[k][-1]['warm']:.3f} s"
            for k in FIRST_KINDS) + f"  [{stamp()}]")
    med = {k: {c: sorted(x[c] for x in v)[len(v) // 2] for c in ("cold", "warm")}
           for k, v in res.items()}
    for c in ("cold", "warm"):
        ok = med["shmpipe"][c] <= med["torch"][c]
        print(f"  median {c}: torch {med['torch'][c]:.3f} s, shmpipe {med['shmpipe'][c]:.3f} s "
              f"(goal <= torch's: {'met' if ok else 'NOT met'}), shmpipe with a spawned "
              f"server {med['shmpipe-spawned'][c]:.3f} s")
    return med


# -- memory (fresh processes) ----------------------------------------------------------------

def memory(pid: int) -> dict[str, int]:
    """Pss, Pss_Anon and Pss_Shmem of a process, in bytes (0 if it is gone)."""
    out = {"Pss": 0, "Pss_Anon": 0, "Pss_Shmem": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in out:
                    out[key] = int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def data_pss(pid: int) -> int:
    """PSS of anonymous and shared memory: what holds data. Without the file-backed pages
    (libraries), whose PSS depends on how many unrelated processes on this machine map them."""
    m = memory(pid)
    return m["Pss_Anon"] + m["Pss_Shmem"]


def descendants(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def child_pss(kind: str, n: int) -> None:
    me = os.getpid()
    base = data_pss(me)
    ds = ListOfArrays(n)
    dataset = data_pss(me) - base
    dl = LOADERS[kind](ds, batch_size=256, num_workers=4, shuffle=True,
                       persistent_workers=True)
    t0 = time.perf_counter()
    it = iter(dl)
    consume(next(it))
    first = time.perf_counter() - t0        # shmpipe: the dataset shared, workers started
    for b in it:
        consume(b)
    epoch = time.perf_counter() - t0
    procs = descendants(me)
    workers = {w.pid for w in dl._iterator._workers}
    fs = None
    if kind == "shmpipe":
        from shmpipe.torch import _procs   # shmpipe's own fork server, not multiprocessing's
        fs = _procs._fork_server()._forkserver_pid
        procs += [p for p in descendants(fs) if p not in procs] if fs else []
    roles = {"trainer": data_pss(me), "workers": sum(data_pss(p) for p in workers),
             "others": sum(data_pss(p) for p in procs if p != me and p not in workers)}
    print(json.dumps({"dataset": dataset, "data": sum(data_pss(p) for p in procs),
                      "total": sum(memory(p)["Pss"] for p in procs), "procs": len(procs),
                      "epoch_s": epoch, "first_s": first, "roles": roles}))
    dl._iterator._shutdown_workers()


def bench_pss(args):
    n = args.pss_items
    print(f"\npss: list of {n:,} arrays of 16 float32, 4 workers, one shuffled epoch  "
          f"[{stamp()}]")
    print("  PSS of anonymous + shared memory (data; file-backed library pages left out), "
          "summed over every process of the loader")
    out = {}
    for kind in ("torch", "shmpipe"):
        full = run_child(["--child-pss", kind, str(n)], kind)
        empty = run_child(["--child-pss", kind, "1"], kind)
        if "error" in full or "error" in empty:
            print(f"  {kind}: failed: {full.get('error') or empty.get('error')}")
            continue
        extra = (full["data"] - empty["data"]) / full["dataset"]
        out[kind] = extra
        mib = 2 ** 20
        print(f"  {kind}: dataset {full['dataset'] / mib:.0f} MiB; {full['procs']} processes: "
              f"{full['data'] / mib:.0f} MiB ({empty['data'] / mib:.0f} MiB with a 1-item "
              f"list; all PSS {full['total'] / mib:.0f} / {empty['total'] / mib:.0f} MiB); "
              f"(PSS - fixed) / dataset = {extra:.2f}x; first batch {full['first_s']:.2f} s, "
              f"epoch {full['epoch_s']:.1f} s  "
              f"[{stamp()}]")
        grew = {k: (full["roles"][k] - empty["roles"][k]) / mib for k in full["roles"]}
        print("    growth by role (MiB): " + ", ".join(f"{k} {v:+.0f}" for k, v in grew.items())
              + " (others: shmpipe's fork server, multiprocessing's resource tracker)")
    if "shmpipe" in out:
        print(f"  goal (PSS - fixed) / dataset <= 1.2x: "
              f"{'met' if out['shmpipe'] <= 1.2 else 'NOT met'}")
    return out


# -- small /dev/shm ----------------------------------------------------------------------------

def child_smallshm(kind: str) -> None:
    n = 0
    t0 = time.perf_counter()
    for b in LOADERS[kind](Big(256, 1 << 20), batch_size=64, num_workers=2):
        n += consume(b)
    print(json.dumps({"samples": n, "seconds": time.perf_counter() - t0}))


def bench_smallshm(args):
    print(f"\nsmallshm: 1 MB samples, batch 64, 2 workers, 64 MB /dev/shm  [{stamp()}]")
    out = {}
    for kind in ("torch", "shmpipe"):
        argv = ["unshare", "-m", "sh", "-c",
                'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"', "sh",
                sys.executable, HERE, "--child-smallshm", kind]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=1800,
                           env=child_env(kind))
        if r.returncode == 0:
            res = json.loads(r.stdout.strip().splitlines()[-1])
            msg = f"ran to the end: {res['samples']} samples in {res['seconds']:.1f} s"
        else:
            lines = r.stderr.strip().splitlines() or [f"exit status {r.returncode}"]
            res = {"error": lines[-1]}
            msg = f"failed (exit status {r.returncode}): {lines[-1]}"
        out[kind] = res
        print(f"  {kind}: {msg}  [{stamp()}]")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", nargs="*", default=["small", "image", "first", "pss",
                                                     "smallshm"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--pss-items", type=int, default=1_000_000)
    ap.add_argument("--child-first")
    ap.add_argument("--child-pss", nargs=2)
    ap.add_argument("--child-smallshm")
    args = ap.parse_args()
    if args.child_first:
        return child_first(args.child_first)
    if args.child_pss:
        return child_pss(args.child_pss[0], int(args.child_pss[1]))
    if args.child_smallshm:
        return child_smallshm(args.child_smallshm)
    print(f"bench_torch: torch {torch.__version__}, {os.cpu_count()} CPUs  [{stamp()}]")
    fns = {"small": bench_small, "image": bench_image, "first": bench_first, "pss": bench_pss,
           "smallshm": bench_smallshm}
    for s in args.scenarios:
        fns[s](args)


if __name__ == "__main__":
    main()
