"""Datasets for test_torch_share.py (importable by the workers)."""

import random

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from procs import mapping_of  # noqa: F401 (also read as sds.mapping_of)

N = 5000
REC = np.dtype([("price", "<f4"), ("qty", "<i4")])




def addr(a) -> int:
    return a.data_ptr() if isinstance(a, torch.Tensor) else a.__array_interface__["data"][0]


def in_dataset_memfd(a) -> bool:
    return "shmpipe:torch-dataset" in mapping_of(addr(a))


class Tagged(np.ndarray):
    """An ndarray subclass that keeps numpy's pickling."""


class Structured(Dataset):
    def __init__(self):
        self.rows = [np.array([(float(i), i)], dtype=REC) for i in range(N)]

    def __len__(self):
        return N

    def __getitem__(self, i):
        return float(self.rows[i]["price"][0])


class LazyCache(Dataset):
    def __init__(self):
        self.cache = [np.zeros(3, np.float32)] * N

    def __len__(self):
        return N

    def __getitem__(self, i):
        self.cache[i] = np.full(3, i, np.float32)
        return (self.cache[i], isinstance(self.cache, list))


def shuffle_init(worker_id):
    ds = torch.utils.data.get_worker_info().dataset
    random.Random(worker_id).shuffle(ds.items)


class Shuffled(IterableDataset):
    def __init__(self):
        self.items = [np.full(2, i, np.int64) for i in range(N)]

    def __iter__(self):
        assert isinstance(self.items, list), type(self.items)
        return iter(list(self.items)[:8])


class Inode(Dataset):
    """Says which file maps its array (the inode of the shared memfd) and a value of it."""

    def __init__(self):
        self.a = np.ones(1 << 20, np.float32)

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return (mapping_of(addr(self.a)).split()[4], float(self.a[i]))
