"""How ``_share``'s pickler packs a long list or tuple of arrays (a mixin of ``_Pickler``).

Two layouts, both a :class:`SharedArrayList` in the worker:

- *even*: the arrays own their bytes (``base is None``), share one dtype and shape, are
  C-contiguous, each appears once and none was pickled before the list. They are copied end
  to end into a region of the list's own (one ``np.concatenate``), element ``i`` at
  ``i * nbytes``: no entry per element anywhere, in the memfd or in the worker. An array of
  the list (or a view of one) pickled after it is found by its id (a sorted array of the
  list's ids) and becomes a span of that region.
- *table*: anything else (mixed shapes, views, duplicates, arrays pickled before, tensors):
  one span per element, and one offset per element in the memfd.
"""

from __future__ import annotations

import numpy as np
import torch

_KINDS = "biufc"                        # the dtype kinds a packed list may hold


class _Even:
    """An evenly packed list: its arrays, their ids sorted, and where it goes."""

    __slots__ = ("arrays", "ids", "order", "owned", "step")

    def __init__(self, arrays, ids, order, owned: int, step: int):
        self.arrays, self.ids, self.order = arrays, ids, order
        self.owned, self.step = owned, step       # index in the pickler's owned; nbytes


def _extent(first: int, shape, strides, itemsize: int) -> tuple[int, int]:
    """The first and one past the last byte of an array's memory."""
    lo = hi = first
    for n, s in zip(shape, strides):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + itemsize


def _ids(seq) -> np.ndarray:
    return np.fromiter(map(id, seq), np.int64, len(seq))


class _Packing:
    """The list-packing half of ``_share._Pickler`` (which holds the tables it fills)."""

    # -- arrays a list owns, found again -----------------------------------------------

    def _even_hits(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(owned region or -1, offset in it) of each id among the evenly packed arrays.

        Ids are those of live objects (the packs keep their arrays): an equal id is the
        same array."""
        reg = np.full(len(ids), -1, np.int64)
        off = np.zeros(len(ids), np.int64)
        for e in self.even:
            at = np.minimum(np.searchsorted(e.ids, ids), len(e.ids) - 1)
            hit = e.ids[at] == ids
            reg[hit] = e.owned
            off[hit] = e.order[at[hit]] * e.step
        return reg, off

    def _even_span(self, owned: int, off: int) -> int:
        """A new span: ``off`` bytes into the region of owned arrays ``owned``."""
        self.even_spans.append((self.nk, owned, off))
        self.nk += 1
        return self.nk - 1

    def _in_owned(self, a: np.ndarray):
        """The span of an array a packed list owns, or of a view of one (a span of the
        list's region), with the strides the worker uses (None: the array's); else None."""
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        got = self._np_spans.get(id(root)) if root is not a else None
        if got is None and self.even and root.base is None:
            reg, off = self._even_hits(np.array([id(root)], np.int64))
            if reg[0] >= 0:
                got = self._even_span(int(reg[0]), int(off[0])), None
                self._np_spans[id(root)] = got
        if got is None or got[1] is not None:
            return None
        if root is a:
            return got
        kr = got[0]
        rfirst = root.__array_interface__["data"][0]
        first = a.__array_interface__["data"][0]
        lo, hi = _extent(first, a.shape, a.strides, a.itemsize)
        if not rfirst <= lo <= hi <= rfirst + root.nbytes:
            return None
        self.derived.append((self.nk, kr, first - rfirst))
        self.nk += 1
        return self.nk - 1, a.strides

    # -- lists of arrays -----------------------------------------------------------------

    def _pack(self, seq):
        first = seq[0]
        kind = type(first)
        if kind is np.ndarray:
            dt, tdt = first.dtype, None
        elif kind is torch.Tensor:
            if first.layout is not torch.strided or first.device.type != "cpu":
                return None
            try:
                dt, tdt = first.detach().numpy().dtype, first.dtype
            except (TypeError, RuntimeError):
                return None
        else:
            return None
        if dt.names is not None or dt.subdtype is not None or dt.kind not in _KINDS \
                or not dt.isnative:
            return None
        nd, shape = first.ndim, tuple(first.shape)
        ks: list[int] = []
        if tdt is None:
            if self._pack_even(seq, dt, shape):
                return ("L", len(self.packs) - 1, len(seq), dt, shape, nd, False,
                        type(seq) is tuple)
            ks = self._pack_arrays(seq, nd, dt, shape)
            if ks is None:
                return None
            ks, shape = ks
        else:
            for x in seq:
                if type(x) is not kind or x.ndim != nd or x.dtype is not tdt \
                        or x.layout is not torch.strided or x.device.type != "cpu" \
                        or x.requires_grad or not x.is_contiguous() or x.is_conj() \
                        or x.is_neg() or x.data_ptr() % x.element_size():
                    return None
                if shape is not None and tuple(x.shape) != shape:
                    shape = None
            for x in seq:
                if x.numel():
                    self.keep.append(x)
                    p = x.data_ptr()
                    ks.append(self._span(p, p + x.numel() * x.element_size(), p, 0))
                else:
                    ks.append(-1)
        shapes = None if shape is not None else [tuple(x.shape) for x in seq]
        self.packs.append((ks, shapes))
        return ("L", len(self.packs) - 1, len(seq), dt, shape, nd, tdt is not None,
                type(seq) is tuple)

    def _pack_even(self, seq, dt: np.dtype, shape) -> bool:
        """Packs ``seq`` evenly if it can be (see the module's docstring)."""
        step = seq[0].nbytes
        if not step:
            return False
        nda = np.ndarray
        for x in seq:
            if type(x) is not nda or x.base is not None or x.shape != shape \
                    or x.dtype is not dt and x.dtype != dt or not x.flags.carray:
                return False
        ids = _ids(seq)
        order = np.argsort(ids)
        ids = ids[order]
        if len(ids) > 1 and bool((ids[1:] == ids[:-1]).any()):
            return False                        # duplicates: they share their bytes
        if self._np_spans:                      # pickled before: they keep their span
            known = np.fromiter(self._np_spans.keys(), np.int64, len(self._np_spans))
            if bool(np.isin(known, ids).any()):
                return False
        if self.even and bool((self._even_hits(ids)[0] >= 0).any()):
            return False
        arrays = list(seq)                      # (keeps them alive: their ids stay theirs)
        self.owned.append((arrays, dt, shape, None, None, len(arrays) * step))
        self.even.append(_Even(arrays, ids, order, len(self.owned) - 1, step))
        self.packs.append(("even", len(self.owned) - 1, step))
        return True

    def _pack_arrays(self, seq, nd: int, dt: np.dtype, shape):
        """(span of each array, the common shape or None), or None if ``seq`` does not pack.

        One pass with few attribute reads (lists of millions of arrays): an array that owns
        its bytes (and is not known yet) goes into the list's own region, found by its
        position, not its address; a view is a span of the memory it views; an array of an
        evenly packed list is a span of that list's region."""
        memo, k0 = self._np_spans, self.nk
        ks: list = []
        owned: list[np.ndarray] = []        # (keeps them alive: their ids stay theirs)
        views = False
        for x in seq:
            if type(x) is not np.ndarray or x.ndim != nd or x.dtype is not dt \
                    and x.dtype != dt or not x.flags.carray \
                    or x.base is not None and self._file_of(x)[0]:
                for y in owned:
                    del memo[id(y)]
                return None
            if shape is not None and x.shape != shape:
                shape = None
            if not x.size:
                ks.append(-1)
                continue
            got = memo.get(id(x))
            if got is not None:
                ks.append(got[0])
            elif x.base is None:
                k = k0 + len(owned)
                memo[id(x)] = (k, None)     # strides None: owned by a list
                owned.append(x)
                ks.append(k)
            else:
                ks.append(None)
                views = True
        extra = 0
        if self.even and owned:             # arrays of an evenly packed list: its spans
            reg, off = self._even_hits(_ids(owned))
            hit = reg >= 0
            extra = int(hit.sum())
            if extra:
                mine = len(owned) - extra
                remap = np.empty(len(owned), np.int64)
                remap[~hit] = k0 + np.arange(mine)
                remap[hit] = k0 + mine + np.arange(extra)
                self.even_spans.extend(zip(remap[hit].tolist(), reg[hit].tolist(),
                                           off[hit].tolist()))
                rl = remap.tolist()
                for x, k in zip(owned, rl):
                    memo[id(x)] = (k, None)
                ks = [rl[k - k0] if k is not None and k >= k0 else k for k in ks]
                owned = [x for x, h in zip(owned, hit.tolist()) if not h]
        n = owned[0].nbytes if owned else 0
        offs = np.arange(len(owned), dtype=np.int64) * n if shape is not None else \
            np.cumsum([0] + [x.nbytes for x in owned], dtype=np.int64)[:-1]
        pos = len(owned) * n if shape is not None else int(sum(x.nbytes for x in owned))
        self.nk += len(owned) + extra
        if owned:
            self.owned.append((owned, dt, shape, offs, k0, pos))
        if views:
            ks = [self._np_span(x)[0] if k is None else k for k, x in zip(ks, seq)]
        return ks, shape
