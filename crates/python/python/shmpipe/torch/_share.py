"""The dataset, written once into a sealed memfd that every worker maps.

torch hands each worker its own copy of the dataset: pickled per worker (spawn, forkserver)
or inherited by fork, where reading Python objects writes their reference counts and copies
the pages one by one (pytorch#13246: memory that grows with every worker). Here the parent
pickles the dataset (with ``worker_init_fn`` and ``collate_fn``, so bound methods keep
sharing their object) once, with pickle protocol 5: the bytes of numpy arrays and CPU
tensors go *out of band*, into the memfd beside the pickle, and each worker's arrays are
views of its mapping instead of copies. Large lists and tuples of numpy arrays (at least
``PACK_MIN`` arrays of one dtype and rank) are packed into one buffer and arrive as a
read-only-shared :class:`SharedArrayList` (a ``Sequence``: indexing, ``len``, iteration,
slicing; not a ``list``), so the workers hold no per-element Python object either.

The memfd is sealed against writes, shrinking and growing before any worker sees it; workers
map it copy-on-write (``MAP_PRIVATE``): what they read is shared, what they write stays in
the worker, like a copy. Nothing goes to ``/dev/shm``.
"""

from __future__ import annotations

import fcntl
import io
import mmap
import os
import pickle
import struct
from collections.abc import Sequence

import numpy as np
import torch

MAGIC = b"SHMPTDS2"
_HEAD = struct.Struct("<8sQQQ")         # magic, pickle length, out-of-band buffers, regions
_BUF = struct.Struct("<QQ")             # offset, length of one region
ALIGN = 64
PACK_MIN = 4096


class SharedArrayList(Sequence):
    """A list of numpy arrays (or tensors) packed in shared memory; items are views.

    What a worker sees in place of a large list or tuple of arrays of one dtype and rank.
    Items are writable; a write stays in the process that makes it (copy-on-write).
    """

    def __init__(self, data: np.ndarray, n: int, shape, offsets, shapes, tensors: bool):
        self._n, self._tensors = n, tensors
        self._offsets, self._shapes = offsets, shapes
        if shape is not None:               # one shape: an (n, *shape) array, indexed
            self._data = data.reshape((n, *shape))
            # (numpy indexing of a 1-d array gives a scalar, not the 0-d array it held)
            self._rows = torch.from_numpy(self._data) if tensors else \
                self._data if shape else self._data[:, None]
            self._squeeze = not tensors and not shape
        else:
            self._data, self._rows = data, None

    def __len__(self) -> int:
        return self._n

    def _item(self, i: int):
        if self._rows is not None:
            return self._rows[i].reshape(()) if self._squeeze else self._rows[i]
        a = self._data[self._offsets[i]:self._offsets[i + 1]].reshape(tuple(self._shapes[i]))
        return torch.from_numpy(a) if self._tensors else a

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._item(j) for j in range(*i.indices(self._n))]
        i = int(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("list index out of range")
        return self._item(i)

    def __iter__(self):
        for i in range(self._n):
            yield self._item(i)

    def __repr__(self) -> str:
        kind = "tensors" if self._tensors else "arrays"
        return f"SharedArrayList({self._n} {kind} of {self._data.dtype})"


class _Packed:
    """A list of arrays (or tensors) of one dtype and rank, to be packed into the memfd.

    Regions: the elements' bytes, one after the other; and, unless every element has the same
    shape, each element's start (``n + 1`` int64) and shape (``n x ndim`` int64). They are
    written straight into the memfd (no copy of the data in this process's heap).
    """

    def __init__(self, seq, dt: np.dtype, nd: int, tensors: bool, shape, total: int):
        self.seq, self.dt, self.nd, self.tensors, self.shape = seq, dt, nd, tensors, shape
        n = len(seq)
        self.sizes = [total * dt.itemsize]
        if shape is None:
            self.sizes += [(n + 1) * 8, n * nd * 8]

    @staticmethod
    def of(seq) -> "_Packed | None":
        """The packing of ``seq``, or None if it is not a long list of like arrays."""
        if len(seq) < PACK_MIN:
            return None
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
        if dt.hasobject or not dt.isnative:
            return None
        nd, shape, total = first.ndim, tuple(first.shape), 0
        for x in seq:
            if type(x) is not kind or x.ndim != nd:
                return None
            if tdt is None:
                if x.dtype != dt:
                    return None
            elif x.dtype is not tdt or x.layout is not torch.strided \
                    or x.device.type != "cpu" or x.requires_grad:
                return None
            if shape is not None and tuple(x.shape) != shape:
                shape = None
            total += x.numel() if tdt is not None else x.size
        return _Packed(seq, dt, nd, tdt is not None, shape, total)

    def fill(self, regions: list[np.ndarray]) -> None:
        n, seq = len(self.seq), self.seq
        data = regions[0].view(self.dt)
        if self.shape is not None:
            rows = data.reshape((n, *self.shape))
            if self.tensors:
                torch.stack(seq, 0, out=torch.from_numpy(rows))
            elif self.nd:
                np.concatenate(seq, axis=0, out=rows.reshape((n * self.shape[0],
                                                              *self.shape[1:])))
            else:
                for i, a in enumerate(seq):
                    rows[i] = a
            return
        offsets = regions[1].view(np.int64)
        shapes = regions[2].view(np.int64).reshape(n, self.nd)
        pos = 0
        offsets[0] = 0
        for i, x in enumerate(seq):
            a = x.detach().numpy() if self.tensors else x
            size = a.size
            data[pos:pos + size] = a.reshape(-1)
            shapes[i] = a.shape
            pos += size
            offsets[i + 1] = pos

    def pid(self, first_region: int):
        return ("L", first_region, len(self.seq), self.dt.str, self.shape, self.nd,
                self.tensors)


def _rebuild_tensor(raw, dtype, shape, requires_grad):
    # A whole tensor over the mapped bytes, as torch rebuilds one (``set_`` on the storage),
    # not a view of a byte tensor: torch's forked worker indexes the trainer's own tensor,
    # and a view through a dtype change made every ``x[i]`` record a replay function.
    # (``set_`` refuses a shape larger than the bytes.)
    t = torch.empty(0, dtype=dtype).set_(torch.from_numpy(raw).untyped_storage(), 0, shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


class _Pickler(pickle.Pickler):
    def __init__(self, file, buffers: list, packs: list):
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self.packs = packs
        self.regions = 0

    def reducer_override(self, obj):
        if type(obj) is torch.Tensor and obj.layout is torch.strided \
                and obj.device.type == "cpu" and not obj.is_quantized and not obj.is_nested \
                and (obj.grad_fn is None):
            t = obj.detach().contiguous()
            # (flattened first: a 0-d tensor cannot be viewed as bytes)
            raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else \
                np.empty(0, np.uint8)
            return _rebuild_tensor, (raw, t.dtype, tuple(t.shape), obj.requires_grad)
        return NotImplemented

    def persistent_id(self, obj):
        if type(obj) in (list, tuple):
            packed = _Packed.of(obj)
            if packed is not None:
                self.packs.append(packed)
                first, self.regions = self.regions, self.regions + len(packed.sizes)
                return packed.pid(first)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, buffers, regions):
        super().__init__(file, buffers=buffers)
        self.regions = regions

    def persistent_load(self, pid):
        if pid[0] != "L":
            raise pickle.UnpicklingError(f"unknown persistent id {pid[0]!r}")
        _, first, n, dt, shape, nd, tensors = pid
        dt = np.dtype(dt)
        data = np.frombuffer(self.regions[first], dt)
        if shape is not None:
            if data.size != n * int(np.prod(shape, dtype=np.int64)):
                raise CorruptDataset("a packed list's data does not match its shape")
            return SharedArrayList(data, n, shape, None, None, tensors)
        offsets = np.frombuffer(self.regions[first + 1], np.int64)
        shapes = np.frombuffer(self.regions[first + 2], np.int64).reshape(n, nd)
        if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != data.size \
                or bool((np.diff(offsets) != shapes.prod(axis=1)).any()):
            raise CorruptDataset("a packed list's offsets do not match its data")
        return SharedArrayList(data, n, None, offsets, shapes, tensors)


def _round(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def share(obj) -> int:
    """Writes ``obj`` into a new sealed memfd and returns its descriptor (the caller closes it).

    Raises whatever pickling raises (e.g. for objects that can only travel while a process
    starts, such as ``multiprocessing`` locks: the caller then falls back to per-worker
    pickling).
    """
    buffers: list[pickle.PickleBuffer] = []
    packs: list[_Packed] = []
    f = io.BytesIO()
    _Pickler(f, buffers, packs).dump(obj)
    body = f.getbuffer()
    raws = [b.raw() for b in buffers]
    sizes = [r.nbytes for r in raws] + [n for p in packs for n in p.sizes]
    table = _HEAD.size + _BUF.size * len(sizes)
    pos = _round(table + len(body))
    places = []
    for n in sizes:
        places.append((pos, n))
        pos = _round(pos + n)
    fd = os.memfd_create("shmpipe:torch-dataset", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, max(pos, 1))
        with mmap.mmap(fd, max(pos, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            _HEAD.pack_into(m, 0, MAGIC, len(body), len(raws), len(sizes))
            for i, (off, n) in enumerate(places):
                _BUF.pack_into(m, _HEAD.size + i * _BUF.size, off, n)
            m[table:table + len(body)] = body
            for (off, n), r in zip(places, raws):
                m[off:off + n] = r.cast("B")
            _fill(m, places[len(raws):], packs)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    finally:
        for r in raws:
            r.release()
    return fd


def _fill(m: mmap.mmap, places, packs: list[_Packed]) -> None:
    """Packs each list straight into its regions of the mapping (views released after)."""
    k = 0
    for p in packs:
        regions = [np.frombuffer(m, np.uint8, count=n, offset=off)
                   for off, n in places[k:k + len(p.sizes)]]
        p.fill(regions)
        del regions
        k += len(p.sizes)


class CorruptDataset(RuntimeError):
    """The shared dataset's memfd does not hold what the parent wrote."""


def load(fd: int):
    """The object :func:`share` wrote into ``fd`` (takes ownership of ``fd``)."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        if not seals & fcntl.F_SEAL_WRITE or not seals & fcntl.F_SEAL_SHRINK:
            raise CorruptDataset("the shared dataset is not sealed against writes")
        size = os.fstat(fd).st_size
        m = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    if size < _HEAD.size:
        raise CorruptDataset(f"the shared dataset is {size} bytes, shorter than its header")
    magic, body_len, n_oob, nbufs = _HEAD.unpack_from(m, 0)
    table = _HEAD.size + _BUF.size * nbufs
    if magic != MAGIC or n_oob > nbufs or table + body_len > size:
        raise CorruptDataset("the shared dataset has a bad header")
    view = memoryview(m)
    bufs = []
    for i in range(nbufs):
        off, n = _BUF.unpack_from(m, _HEAD.size + i * _BUF.size)
        if off < table + body_len or off + n > size:
            raise CorruptDataset(f"region {i} ({off}+{n}) lies outside the shared dataset")
        bufs.append(view[off:off + n])
    body = io.BytesIO(view[table:table + body_len])
    return _Unpickler(body, bufs[:n_oob], bufs[n_oob:]).load()
