"""The trainer's side of multi-process loading: workers, task dispatch, order, errors.

The bookkeeping (task indices, round-robin dispatch bounded by ``prefetch_factor``, the
reorder rule, iterable-dataset ends, persistent-worker resets) follows torch's
``_MultiProcessingDataLoaderIter`` step by step, so that batch order, seeds and errors are
the same. The transport differs: each worker has a control socket (tasks in) and its own
shmpipe channel (batches out, one pool block per batch), so the trainer always knows which
worker holds the next batch and waits on that one channel.
"""

from __future__ import annotations

import functools
import itertools
import time
from typing import Any

from torch._utils import ExceptionWrapper
from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data import _utils as _tu
from torch.utils.data._utils import worker as _tw
from torch.utils.data.dataloader import (
    _BaseDataLoaderIter,
    _DatasetKind,
    _sharding_worker_init_fn,
)

from .. import _native
from . import _procs, _share, _wire, _worker, _workers

# Batches a worker's channel lets the trainer keep alive zero-copy (beyond those in flight);
# a batch received while more are alive is copied out of shared memory and its block given
# back, so that a program that keeps every batch (``list(loader)``) never starves a worker.
HOLD = 4
_now = time.monotonic
# With in_order=False: how long a wait on one busy worker lasts before the others are polled.
POLL = 0.002


class MultiProcessIter(_BaseDataLoaderIter):
    """Iterates once over the loader's dataset with ``num_workers`` shmpipe workers."""

    def __init__(self, loader) -> None:
        super().__init__(loader)
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        if self._num_workers <= 0 or self._prefetch_factor <= 0:
            raise AssertionError("num_workers and prefetch_factor must be > 0 here")
        self._shutdown = False
        self._set: Any = None           # the WorkerSet, once made
        self._worker_init_fn = loader.worker_init_fn
        if isinstance(self._dataset, (IterDataPipe, MapDataPipe)):
            self._worker_init_fn = functools.partial(
                _sharding_worker_init_fn, self._worker_init_fn, self._world_size, self._rank)
        ctx = _procs.context(loader.multiprocessing_context)
        _workers.refuse_fileless_main(ctx, (self._dataset, self._collate_fn,
                                            self._worker_init_fn))
        payload, shared_fd = self._payload(ctx)
        cfg = {"num_workers": self._num_workers, "base_seed": self._base_seed,
               "shared_seed": self._shared_seed,
               "blocks": self._prefetch_factor * self._num_workers + 2 + HOLD}
        self._set = _workers.WorkerSet(ctx, self._num_workers, cfg, payload, shared_fd)
        self._chans = self._set.chans
        self._reset(loader, first_iter=True)

    @property
    def _workers(self) -> list:
        """The worker processes (torch's attribute of the same name)."""
        return self._set.procs if self._set is not None else []

    # -- workers -------------------------------------------------------------------------

    def _payload(self, ctx):
        payload = (self._dataset, self._dataset_kind, self._auto_collation, self._collate_fn,
                   self._drop_last, self._worker_init_fn)
        if ctx.get_start_method() == "fork":
            return payload, None            # inherited as it is, like torch
        try:
            fd = _share.share(payload)
        except Exception:  # noqa: BLE001
            # Objects that may only travel while a process starts (multiprocessing locks,
            # values, events): pickled for each worker, as torch does.
            return payload, None
        return _procs.FdArg(fd), fd

    def _died(self, w: int) -> RuntimeError:
        self._workers_status[w] = False
        return self._set.died(w)

    # -- epochs and tasks (torch's rules) ------------------------------------------------

    def _reset(self, loader, first_iter=False) -> None:
        super()._reset(loader, first_iter)
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info: dict = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._workers_num_tasks = [0] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:
            for w in range(self._num_workers):
                self._send(w, ("r", self._shared_seed))
            for w in range(self._num_workers):
                while True:
                    obj = self._recv_from(w, self._deadline())
                    if isinstance(obj[0], _tw._ResumeIteration):
                        break
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _send(self, w: int, msg) -> None:
        try:
            self._set.send(w, msg)
        except RuntimeError:
            self._workers_status[w] = False
            raise

    def _try_put_index(self) -> None:
        max_tasks = self._prefetch_factor * self._num_workers
        if self._tasks_outstanding >= max_tasks:
            raise AssertionError("Number of outstanding tasks exceeded maximum allowed tasks")
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):
            w = next(self._worker_queue_idx_cycle)
            if self._workers_status[w]:
                if self._in_order:
                    break
                if self._workers_num_tasks[w] < max_tasks // sum(self._workers_status):
                    break
        else:
            return
        self._send(w, ("t", self._send_idx, index))
        self._task_info[self._send_idx] = (w,)
        self._workers_num_tasks[w] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _next_data(self):
        while True:
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx, None)
                if info:
                    worker_id = info[0]
                    if len(info) == 2 or self._workers_status[worker_id]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration
            if len(self._task_info[self._rcvd_idx]) == 2:
                worker_id, data = self._task_info.pop(self._rcvd_idx)
                self._rcvd_idx += 1
                return self._process_data(data, worker_id)
            if self._shutdown or self._tasks_outstanding <= 0:
                raise AssertionError("Invalid iterator state: no outstanding tasks")
            idx, data = self._get_data()
            self._tasks_outstanding -= 1
            if self._dataset_kind == _DatasetKind.Iterable and \
                    isinstance(data, _tw._IterableDatasetStopIteration):
                self._workers_status[data.worker_id] = False
                self._try_put_index()
                continue
            if idx != self._rcvd_idx:
                if not self._in_order:
                    worker_id = self._task_info.pop(idx)[0]
                    return self._process_data(data, worker_id)
                self._task_info[idx] += (data,)
            else:
                worker_id = self._task_info.pop(idx)[0]
                self._rcvd_idx += 1
                return self._process_data(data, worker_id)

    def _process_data(self, data, worker_idx):
        self._workers_num_tasks[worker_idx] -= 1
        self._try_put_index()
        if isinstance(data, ExceptionWrapper):
            data.reraise()
        if self._pin_memory:
            data = _tu.pin_memory.pin_memory(data, self._pin_memory_device)
        return data

    # -- receiving -----------------------------------------------------------------------

    def _deadline(self) -> float | None:
        return _now() + self._timeout if self._timeout > 0 else None

    def _get_data(self):
        deadline = self._deadline()
        try:
            if self._in_order:
                return self._recv_from(self._task_info[self._rcvd_idx][0], deadline)
            return self._recv_any(deadline)
        except TimeoutError:
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None

    def _recv_from(self, w: int, deadline: float | None, wait: bool = True):
        """The next message of worker ``w`` (``(idx, data)``), or None if ``wait`` is False
        and there is none yet."""
        ch = self._chans[w]
        while True:
            if ch.rx is None:
                if not wait:
                    return None
                ch.take_channel(deadline, lambda: self._died(w))
            try:
                if wait:
                    left = None if deadline is None else max(0.0, deadline - _now())
                    msg = ch.rx.recv(timeout=left)
                else:
                    msg = ch.rx.try_recv()
                    if msg is None:
                        return None
            except (_native.PeerDied, _native.Disconnected) as e:
                raise self._died(w) from e
            if "a" not in msg:
                raise _wire.CorruptBatch(f"DataLoader worker {w} sent a message without a batch")
            block, meta = msg["a"], msg.meta
            hoard = ch.rx.held_blocks > HOLD
            obj = _wire.decode(block, meta.get("o"), meta.get("n"), copy=hoard)
            del msg, block
            if isinstance(obj, _worker.Switch):
                ch.take_channel(deadline, lambda: self._died(w))
                continue
            return obj

    def _recv_any(self, deadline: float | None):
        """The first message of any worker with work outstanding (``in_order=False``)."""
        busy = [w for w in range(self._num_workers) if self._workers_num_tasks[w] > 0
                and self._workers_status[w]]
        if not busy:
            busy = [w for w in range(self._num_workers) if self._workers_status[w]]
        while True:
            for w in busy:
                obj = self._recv_from(w, deadline, wait=False)
                if obj is not None:
                    return obj
            first = busy[0]
            slice_end = _now() + POLL
            if deadline is not None:
                if _now() >= deadline:
                    raise TimeoutError
                slice_end = min(slice_end, deadline)
            try:
                return self._recv_from(first, slice_end)
            except TimeoutError:
                busy = busy[1:] + busy[:1]

    # -- shutdown ------------------------------------------------------------------------

    def _shutdown_workers(self) -> None:
        if _tu is None or _tu.python_exit_status is True or _tu.python_exit_status is None:
            return
        if self._shutdown:
            return
        self._shutdown = True
        if self._set is not None:
            self._set.shutdown(_tu.MP_STATUS_CHECK_INTERVAL)

    def __del__(self) -> None:
        try:
            self._shutdown_workers()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
