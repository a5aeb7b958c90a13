"""Collation straight into the worker's pool block.

Inside a torch worker, ``default_collate`` stacks tensors into a fresh torch shared-memory
segment (a file in ``/dev/shm``, the source of "Bus error" under Docker's 64 MB default).
In a shmpipe worker the tensor and numpy entries of ``default_collate_fn_map`` are replaced
(in the worker process only) by functions that stack into the arena of the batch being
built: the one copy a batch needs, into memory the trainer then reads in place. Any
``collate_fn`` that calls ``default_collate`` (or ``collate`` with the default map) gets
this. Where the fast path does not apply (no arena yet, mixed dtypes or shapes, nested or
sparse tensors) torch's own functions run, with their own results and errors, except that
their output is ordinary memory rather than a ``/dev/shm`` segment.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data._utils import collate as _tc

from . import _wire

_arena: _wire.Arena | None = None
_installed = False

_NP_TO_TORCH = {np.dtype(k): v for k, v in {
    np.float32: torch.float32, np.float64: torch.float64, np.float16: torch.float16,
    np.complex64: torch.complex64, np.complex128: torch.complex128, np.int8: torch.int8,
    np.int16: torch.int16, np.int32: torch.int32, np.int64: torch.int64,
    np.uint8: torch.uint8, np.bool_: torch.bool,
}.items()}


def set_arena(arena: _wire.Arena | None) -> None:
    global _arena
    _arena = arena


def _orig_tensor_fn(batch, *, collate_fn_map=None):
    # torch's function without its worker branch (which allocates in /dev/shm).
    from torch.utils.data._utils import worker as _w
    saved, _w._worker_info = _w._worker_info, None
    try:
        return _ORIG_TENSOR(batch, collate_fn_map=collate_fn_map)
    finally:
        _w._worker_info = saved


def collate_tensor(batch, *, collate_fn_map=None):
    elem = batch[0]
    arena = _arena
    if arena is not None and type(elem) is torch.Tensor and elem.layout is torch.strided \
            and not elem.is_nested and elem.device.type == "cpu" \
            and elem.dtype in _wire.TRAVELS:
        # What torch's worker branch does (an output of elem's dtype and shape, stacked
        # into), with the arena instead of a /dev/shm segment: same results, same errors.
        out = arena.tensor((len(batch), *elem.shape), elem.dtype)
        if out is not None:
            return torch.stack(batch, 0, out=out)
    return _orig_tensor_fn(batch, collate_fn_map=collate_fn_map)


def collate_numpy_array(batch, *, collate_fn_map=None):
    elem = batch[0]
    arena = _arena
    if arena is not None and type(elem) is np.ndarray:
        tdt = _NP_TO_TORCH.get(elem.dtype)
        if tdt is not None and _like_arrays(batch):
            shape = elem.shape
            out = arena.tensor((len(batch), *shape), tdt)
            if out is not None:
                rows = out.numpy()
                try:
                    # One C call: equal shapes laid end to end are the stacked array (and
                    # 3x cheaper than np.stack's view per element). casting="no": an
                    # element of another dtype raises, and torch's function decides.
                    if shape:
                        np.concatenate(batch, 0, casting="no",
                                       out=rows.reshape(len(batch) * shape[0], *shape[1:]))
                    else:
                        np.stack(batch, 0, out=rows, casting="no")
                    return out
                except TypeError:
                    pass        # (the arena space stays unused: the block is per batch)
    return _ORIG_NUMPY(batch, collate_fn_map=collate_fn_map)


def _like_arrays(batch) -> bool:
    """Every element a plain ndarray, all of one shape (dtypes are checked by the copy)."""
    nd = np.ndarray
    for a in batch:
        if type(a) is not nd:
            return False
    return len({a.shape for a in batch}) == 1


_ORIG_TENSOR = _tc.collate_tensor_fn
_ORIG_NUMPY = _tc.collate_numpy_array_fn


class TensorDatasetFetcher:
    """A whole batch of a ``TensorDataset`` in one ``index_select`` per tensor, into the arena.

    ``default_collate([ds[i] for i in idx])`` is, for a ``TensorDataset`` (exactly that class:
    a subclass may override ``__getitem__``), the list ``[t[idx] for t in ds.tensors]``; this
    computes it without a Python call per sample. Anything unusual (keys that are not
    non-negative ints, an index out of range, no room in the arena) goes to torch's fetcher,
    which gives torch's results and errors.
    """

    def __init__(self, dataset, fallback):
        self.tensors = dataset.tensors
        self.fallback = fallback

    @staticmethod
    def applies(dataset, kind, auto_collation, collate_fn) -> bool:
        from torch.utils.data import TensorDataset
        from torch.utils.data.dataloader import _DatasetKind
        return (type(dataset) is TensorDataset and kind == _DatasetKind.Map and auto_collation
                and collate_fn is _tc.default_collate
                and all(type(t) is torch.Tensor and t.layout is torch.strided
                        and t.device.type == "cpu" and t.dtype in _wire.TRAVELS
                        for t in dataset.tensors))

    def fetch(self, index):
        out = self._batched(index, _arena)
        return out if out is not None else self.fallback.fetch(index)

    def _batched(self, index, arena):
        if not all(type(i) is int for i in index):
            return None
        try:
            idx = torch.as_tensor(index, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError):
            return None
        if idx.ndim != 1 or len(idx) == 0:
            return None
        n = min(len(t) for t in self.tensors)
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= n:
            return None
        outs = []
        for t in self.tensors:
            if arena is None:       # the first batch, before the channel exists
                outs.append(torch.index_select(t, 0, idx))
                continue
            out = arena.tensor((len(idx), *t.shape[1:]), t.dtype)
            if out is None:
                return None
            outs.append(torch.index_select(t, 0, idx, out=out))
        return outs


def install() -> None:
    """Puts the arena-aware functions into ``default_collate_fn_map`` (worker process only)."""
    global _installed
    if _installed:
        return
    _installed = True
    m = _tc.default_collate_fn_map
    if m.get(torch.Tensor) is _ORIG_TENSOR:
        m[torch.Tensor] = collate_tensor
    if m.get(np.ndarray) is _ORIG_NUMPY:
        m[np.ndarray] = collate_numpy_array
