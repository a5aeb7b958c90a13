"""torch's shuffling, without its list of every index.

``RandomSampler.__iter__`` (without replacement) draws ``torch.randperm(n)`` and turns it
into a Python list at once: for a dataset of 1M samples, 1M ``int`` objects and the list
holding them (~40 MB) live in the trainer for the whole epoch. When the loader's index
sampler is torch's own ``BatchSampler`` over torch's own ``RandomSampler`` (the loader's
``shuffle=True``, or those classes given by the user), :func:`lean_batches` yields the same
batches from the permutation tensor (8 bytes a sample), converting one batch at a time.

"The same" exactly: the generator is drawn by the same calls at the same moments (the seed
from the global generator when the sampler has none, each ``randperm`` when the first index
of its round is needed, the last, possibly empty, round included), so the batches, the
generator's state between batches and every error are torch's. Subclasses, samplers with
replacement and any other sampler are iterated by their own code.
"""

from __future__ import annotations

import mmap

import torch
from torch.utils.data import BatchSampler, RandomSampler

# The methods whose behaviour lean_batches reproduces: a program that replaced either
# keeps its own.
_BATCH_ITER = BatchSampler.__iter__
_RANDOM_ITER = RandomSampler.__iter__

#: From this many samples on, a permutation lives in a mapping of its own (see _randperm).
OWN_MAPPING = 1 << 16


def applies(index_sampler) -> bool:
    """Whether ``index_sampler`` is torch's ``BatchSampler`` over torch's ``RandomSampler``
    without replacement, both with their own ``__iter__``."""
    if type(index_sampler) is not BatchSampler or BatchSampler.__iter__ is not _BATCH_ITER:
        return False
    s = index_sampler.sampler
    return type(s) is RandomSampler and RandomSampler.__iter__ is _RANDOM_ITER \
        and s.replacement is False


def _rounds(s: RandomSampler):
    """The permutations ``RandomSampler.__iter__`` would turn into lists, in its order and
    drawn at the same points (see the module doc)."""
    n = len(s.data_source)
    if s.generator is None:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(seed)
    else:
        generator = s.generator
    for _ in range(s.num_samples // n):
        yield _randperm(n, generator)
    yield _randperm(n, generator)[: s.num_samples % n]


def _randperm(n: int, generator: torch.Generator) -> torch.Tensor:
    """``torch.randperm(n, generator=generator)``; a large one in an anonymous mapping of its
    own, unmapped when the last batch taken from it is gone. (From malloc, the 8 bytes a
    sample stayed in the trainer's heap after the epoch: glibc had raised its mmap threshold
    and kept the freed block, +7.7 MiB for 1M samples.)"""
    if n < OWN_MAPPING:
        return torch.randperm(n, generator=generator)
    out = torch.frombuffer(mmap.mmap(-1, 8 * n), dtype=torch.int64, count=n)
    return torch.randperm(n, generator=generator, out=out)


def lean_batches(index_sampler: BatchSampler):
    """What ``iter(index_sampler)`` yields (lists of ints), for a sampler :func:`applies` to."""
    size, drop_last = index_sampler.batch_size, index_sampler.drop_last
    carry: list[int] = []
    for perm in _rounds(index_sampler.sampler):
        pos, m = 0, len(perm)
        if carry:       # a batch that spans two rounds (num_samples > len(dataset))
            pos = min(m, size - len(carry))
            carry += perm[:pos].tolist()
            if len(carry) < size:
                continue
            yield carry
        while m - pos >= size:
            yield perm[pos:pos + size].tolist()
            pos += size
        carry = perm[pos:].tolist()
    if carry and not drop_last:
        yield carry
