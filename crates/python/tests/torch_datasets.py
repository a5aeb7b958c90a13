"""Datasets, collate functions and worker_init_fns for the shmpipe.torch tests.

They live in an importable module (not in the test files' functions) because workers are
fresh processes that import what they run, as under torch's spawn start method.
"""

from __future__ import annotations

import collections
import ctypes
import os
import random
import time

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import shmpipe.torch


class Counting(Dataset):
    """Sample i is i (an int)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class Rows(Dataset):
    """Sample i: (row i of a float32 matrix as numpy, i)."""

    def __init__(self, n: int, width: int = 16):
        self.x = np.arange(n * width, dtype=np.float32).reshape(n, width)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i


Pair = collections.namedtuple("Pair", ["left", "right"])


class Mixed(Dataset):
    """Samples with nested structure and many dtypes."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return {
            "f32": torch.full((2, 3), float(i)),
            "i64": torch.tensor(i),
            "bool": torch.tensor([i % 2 == 0, True]),
            "bf16": torch.full((4,), i, dtype=torch.bfloat16),
            "c64": torch.full((2,), complex(i, -i), dtype=torch.complex64),
            "u8": np.full((3,), i, dtype=np.uint8),
            "name": f"item-{i}",
            "meta": {"id": i, "tags": [i, i + 1]},
            "pair": Pair(left=i, right=float(i) / 2),
        }


def keep_structure(batch):
    """A collate_fn that returns samples as they are, plus a numpy array and a 0-d tensor."""
    return {"samples": batch, "np": np.arange(len(batch), dtype=np.int16),
            "scalar": torch.tensor(len(batch)), "none": None}


class WorkerInfoDataset(Dataset):
    """Sample i: what get_worker_info (torch's and shmpipe.torch's) says in the worker."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        same = shmpipe.torch.get_worker_info() is info
        return torch.tensor([i, info.id, info.num_workers, info.seed, int(same),
                             int(info.dataset is self), os.getpid(), self.marker])

    marker = 0


def mark_dataset(worker_id: int) -> None:
    """worker_init_fn: marks this worker's copy of the dataset."""
    info = get_worker_info()
    assert info.id == worker_id
    info.dataset.marker = 100 + worker_id


class Seeds(Dataset):
    """Sample i: the RNG states a worker was seeded with (torch, numpy, random)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([torch.initial_seed() % (2**62), int(np.random.randint(1 << 30)),
                             random.randrange(1 << 30), int(torch.randint(1 << 30, ()))])


class QueueDataset(Dataset):
    """torch's own example of a bound-method worker_init_fn sharing state with the dataset."""

    def __init__(self, n):
        self.data = list(range(n))
        self.worker_id = None

    def init(self, worker_id):
        self.worker_id = worker_id

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.worker_id, self.data[i]


class Sharded(IterableDataset):
    """range(n), each worker taking every num_workers-th item from its id."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))

    def __len__(self):
        return self.n


class Unsharded(IterableDataset):
    """range(n) in every worker (torch duplicates it; so must we)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


class PerWorkerSizes(IterableDataset):
    """Worker w yields range(sizes[w])."""

    def __init__(self, sizes):
        self.sizes = sizes

    def __iter__(self):
        return iter(range(self.sizes[get_worker_info().id]))


class Fails(Dataset):
    """Raises a given exception for one index."""

    def __init__(self, n, bad, exc):
        self.n, self.bad, self.exc = n, bad, exc

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            deep_failure(self.exc, i)
        return i


class DatasetError(Exception):
    """A user-defined exception type (must arrive as itself)."""


def deep_failure(exc, i):
    raise exc(f"sample {i} is broken")


class FailsInIter(IterableDataset):
    def __iter__(self):
        raise RuntimeError("Error in __iter__")


def failing_init(worker_id):
    raise RuntimeError("Error in worker_init_fn")


class Slow(Dataset):
    """Sleeps ``delay`` seconds in worker ``slow_worker`` (every item) or in every worker."""

    def __init__(self, n, delay, slow_worker=None):
        self.n, self.delay, self.slow_worker = n, delay, slow_worker

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        if self.slow_worker is None or (info is not None and info.id == self.slow_worker):
            time.sleep(self.delay)
        return i


class Dies(Dataset):
    """Worker processes die at index ``bad``: by SIGKILL, a segfault, or os._exit(3)."""

    def __init__(self, n, bad, how):
        self.n, self.bad, self.how = n, bad, how

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            if self.how == "kill":
                os.kill(os.getpid(), 9)
            elif self.how == "segfault":
                ctypes.string_at(0)
            else:
                os._exit(3)
        return i


class Big(Dataset):
    """Samples of ``nbytes`` bytes (float32), filled with the index."""

    def __init__(self, n, nbytes):
        self.n, self.numel = n, nbytes // 4

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((self.numel,), float(i))


class Growing(Dataset):
    """Sample i has 1000 * 4**(i // 4) floats: batches outgrow the first channel's blocks."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((1000 * 4 ** (i // 4),), float(i))


class Holds(Dataset):
    """Keeps large arrays and a list of small arrays; samples say where they live."""

    def __init__(self, n_list=5000, vary=False, scale=None):
        self.big = np.arange(1 << 20, dtype=np.float64)
        self.scale = scale
        self.tensor = torch.arange(1 << 18, dtype=torch.int32)
        rng = np.random.default_rng(0)
        self.items = [rng.random(3 + (i % 5 if vary else 0)).astype(np.float32)
                      for i in range(n_list)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"item": torch.as_tensor(np.array(self.items[i], copy=True)), "i": i,
                "kind": type(self.items).__name__,
                "big_shared": int(_in_memfd(self.big)),
                "tensor_shared": int(_in_memfd(self.tensor.numpy())),
                "item_shared": int(_in_memfd(self.items[i])),
                "big_sum": float(self.big[:10].sum()), "tensor_last": int(self.tensor[-1]),
                "scale": None if self.scale is None else float(self.scale)}


def _in_memfd(a: np.ndarray) -> bool:
    """Whether the array's memory lies in a mapping of the shared dataset's memfd."""
    addr = a.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return "shmpipe:torch-dataset" in line
    return False


class Writes(Dataset):
    """Writes into its own array in the worker (the write must stay in that worker)."""

    def __init__(self):
        self.x = np.zeros(8, dtype=np.int64)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        self.x[i] += 1
        return int(self.x.sum())


class WithLock(Dataset):
    """Holds a multiprocessing Value (can only travel while a process starts)."""

    def __init__(self, ctx):
        self.count = ctx.Value("i", 0)

    def __len__(self):
        return 6

    def __getitem__(self, i):
        with self.count.get_lock():
            self.count.value += 1
        return i


class Images(Dataset):
    """3x224x224 uint8 images stored compressed; decoded and normalised in __getitem__."""

    def __init__(self, n):
        import zlib
        rng = np.random.default_rng(0)
        base = rng.integers(0, 255, (3, 224, 224), dtype=np.uint8)
        self.blobs = [zlib.compress(np.roll(base, i).tobytes(), 1) for i in range(min(n, 64))]
        self.n = n
        self.mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
        self.std = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import zlib
        raw = np.frombuffer(zlib.decompress(self.blobs[i % len(self.blobs)]), np.uint8)
        img = raw.reshape(3, 224, 224).astype(np.float32) / 255.0
        return (img - self.mean) / self.std, i % 10


def private_dev_shm(argv: list[str], size: str = "64m") -> list[str] | None:
    """``argv`` run in a private mount namespace whose ``/dev/shm`` is a fresh ``size`` tmpfs
    (``unshare -m``, needs root), or None where that is not possible here."""
    import shutil
    import subprocess
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
                           capture_output=True)
    if probe.returncode != 0:
        return None
    return ["unshare", "-m", "sh", "-c",
            f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"', "sh", *argv]


def forbid_tensor_dataset_getitem(worker_id: int) -> None:
    """worker_init_fn: TensorDataset.__getitem__ raises in this worker from now on."""
    from torch.utils.data import TensorDataset

    def refuse(self, i):
        raise AssertionError("TensorDataset.__getitem__ was called")
    TensorDataset.__getitem__ = refuse


class Unloadable(Dataset):
    """Pickles fine, fails to unpickle in a worker."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i

    def __reduce__(self):
        return (_refuse_to_load, ())


def _refuse_to_load():
    raise OSError("cannot open the dataset's files here")


def lightning_module():
    """A linear regression LightningModule (lightning imported only where it is used)."""
    import lightning as L
    from torch import nn

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 1)

        def training_step(self, batch, i):
            x, y = batch
            loss = nn.functional.mse_loss(self.lin(x).squeeze(1), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Regression()


class Logged(Dataset):
    """Appends each index it fetches to a file, then sleeps ``delay`` seconds."""

    def __init__(self, n, delay, path):
        self.n, self.delay, self.path = n, delay, path

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with open(self.path, "a") as f:
            f.write(f"{i}\n")
        time.sleep(self.delay)
        return i


def clone_collate(batch):
    """torch's own test collate_fn for nested tensors."""
    return [x.clone() for x in batch]


def nested_tensors(n):
    g = torch.Generator().manual_seed(0)
    return [torch.nested.nested_tensor([torch.randn(5, generator=g),
                                        torch.randn(i % 3 + 1, generator=g)]) for i in range(n)]


class WhereAmI(Dataset):
    """Sample i: (i, the pid fetching it, 1 if get_worker_info() is None there)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i, os.getpid(), int(get_worker_info() is None)])


def must_not_run(worker_id: int) -> None:
    """worker_init_fn that torch never calls with num_workers=0."""
    raise AssertionError("worker_init_fn ran without workers")


def start_a_forkserver_child() -> None:
    """Run in a process forked by shmpipe's fork server: starts a fork-server process of its
    own (which must not wait for ever on a lock the fork left taken) and waits for it."""
    import multiprocessing
    p = multiprocessing.get_context("forkserver").Process(target=os.getpid)
    p.start()
    p.join(120)
    raise SystemExit(0 if p.exitcode == 0 else 3)


def collate_with_expanded_mask(samples):
    """Samples, and one attention mask broadcast over the batch (``expand``: stride 0)."""
    n = len(samples)
    return torch.tensor(samples), torch.tril(torch.ones(256, 256)).expand(n, 256, 256)


class OfDtype(Dataset):
    """Four samples of 3 values (i) of ``torch.<name>`` (float8, complex32, ...)."""

    def __init__(self, name: str):
        self.name = name

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((3,), float(i)).to(getattr(torch, self.name))


class Transposed(Dataset):
    """Two samples, each a transposed (non-contiguous) 4x3 tensor."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return torch.arange(12.0).view(3, 4).T + i
