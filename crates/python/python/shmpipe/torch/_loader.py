"""``shmpipe.torch.DataLoader``: torch's ``DataLoader`` with shmpipe workers underneath."""

from __future__ import annotations

import inspect

import torch.utils.data
from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

from .. import _options
from . import _iter, _procs


#: The most tasks in flight over all workers (``prefetch_factor * num_workers``): a block of
#: a worker's channel each, and a channel has at most 2**20 blocks.
MAX_TASKS = 2**16

_HAS_IN_ORDER = "in_order" in inspect.signature(torch.utils.data.DataLoader.__init__).parameters


class DataLoader(torch.utils.data.DataLoader):
    """A drop-in for :class:`torch.utils.data.DataLoader` (same constructor, same behaviour).

    With ``num_workers=0`` it is torch's loader. With workers:

    - workers are fresh processes forked from a fork server that has imported torch (never a
      fork of the training process; ``multiprocessing_context`` or a start method set with
      ``multiprocessing.set_start_method`` is honoured when given). The dataset,
      ``collate_fn`` and ``worker_init_fn`` must therefore be picklable, as with torch under
      spawn: top-level functions and classes, scripts guarded by ``if __name__ == "__main__":``
      (not defined in a ``__main__`` without a file, a notebook's: a ``TypeError`` says so).
      As under spawn, workers get the trainer's ``os.environ`` (as of the iterator's start)
      and ``sys.argv``, not what ``main()`` changed in the process (``set_default_dtype``,
      module globals): ``multiprocessing_context="fork"`` gives fork's behaviour;
    - the dataset (with ``collate_fn`` and ``worker_init_fn``) is pickled once into a sealed
      memfd shared by every worker; numpy arrays and tensors in it are mapped, not copied
      (each buffer once, views kept as views, memmaps reopened from their file), large lists
      of arrays become a shared :class:`~shmpipe.torch.SharedArrayList` (a list to its
      users), and an unchanged dataset is not shared again for the next epoch;
    - each worker collates its batch straight into a block of its own shmpipe channel
      (``default_collate`` and any ``collate_fn`` that calls it), and the batch reaches the
      trainer as tensors over that block: zero-copy, the block returning to the worker when
      the last tensor viewing it is garbage. Nothing is written to ``/dev/shm``, so a small
      ``/dev/shm`` (Docker's 64 MB) is no limit. A program that keeps many batches alive
      gets copies beyond the first few (the block goes back at once), never a stall;
    - ``get_worker_info()`` (torch's or this module's), per-worker seeds, ``prefetch_factor``,
      ``persistent_workers``, ``in_order``, ``timeout``, iterable datasets (each worker
      iterates its own copy) and errors (re-raised with the worker's traceback, and
      "DataLoader worker (pid ...) ..." for a dead worker) behave as torch documents them.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 in_order=True):
        extra = {"in_order": in_order} if _HAS_IN_ORDER else {}
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                         batch_sampler=batch_sampler, num_workers=num_workers,
                         collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
                         timeout=timeout, worker_init_fn=worker_init_fn,
                         multiprocessing_context=multiprocessing_context, generator=generator,
                         prefetch_factor=prefetch_factor,
                         persistent_workers=persistent_workers,
                         pin_memory_device=pin_memory_device, **extra)
        if not _HAS_IN_ORDER:       # torch before 2.6: the option is ours alone
            self.in_order = in_order
        if self.num_workers > 0:
            # Each worker's channel has a block per task in flight; torch checks no upper
            # bound, and 2**62 made the first iteration queue 2**63 tasks (review 18, hole 5).
            _options.whole("prefetch_factor", self.prefetch_factor, least=1,
                           most=max(1, MAX_TASKS // self.num_workers))
        if num_workers > 0 and multiprocessing_context is None:
            _procs.warm_up()

    def _get_iterator(self):
        if self.num_workers == 0:
            return _SingleProcessDataLoaderIter(self)
        self.check_worker_number_rationality()
        return _iter.MultiProcessIter(self)
