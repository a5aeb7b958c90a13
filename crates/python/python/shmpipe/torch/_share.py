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

MAGIC = b"SHMPTDS1"
_HEAD = struct.Struct("<8sQQ")          # magic, pickle length, number of buffers
_BUF = struct.Struct("<QQ")             # offset, length of one out-of-band buffer
ALIGN = 64
PACK_MIN = 4096


class SharedArrayList(Sequence):
    """A list of numpy arrays (or tensors) packed in shared memory; items are views.

    What a worker sees in place of a large list or tuple of arrays of one dtype and rank.
    Items are writable; a write stays in the process that makes it (copy-on-write).
    """

    def __init__(self, data: np.ndarray, offsets: np.ndarray, shapes: np.ndarray,
                 tensors: bool):
        self._data, self._off, self._shapes, self._tensors = data, offsets, shapes, tensors

    def __len__(self) -> int:
        return len(self._off) - 1

    def _item(self, i: int):
        a = self._data[self._off[i]:self._off[i + 1]].reshape(tuple(self._shapes[i]))
        return torch.from_numpy(a) if self._tensors else a

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._item(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("list index out of range")
        return self._item(i)

    def __iter__(self):
        for i in range(len(self)):
            yield self._item(i)

    def __repr__(self) -> str:
        kind = "tensors" if self._tensors else "arrays"
        return f"SharedArrayList({len(self)} {kind} of {self._data.dtype})"


def _packable(seq) -> tuple[np.dtype, int, bool] | None:
    if len(seq) < PACK_MIN:
        return None
    first = seq[0]
    if type(first) is np.ndarray:
        tensors = False
        dt = first.dtype
    elif type(first) is torch.Tensor and first.layout is torch.strided \
            and first.device.type == "cpu" and not first.requires_grad:
        tensors = True
        try:
            dt = first.numpy().dtype
        except (TypeError, RuntimeError):
            return None
    else:
        return None
    if dt.hasobject or not dt.isnative:
        return None
    nd = first.ndim
    kind = type(first)
    for x in seq:
        if type(x) is not kind or x.ndim != nd:
            return None
        if tensors:
            if x.layout is not torch.strided or x.device.type != "cpu" or x.requires_grad \
                    or str(x.dtype) != str(first.dtype):
                return None
        elif x.dtype != dt:
            return None
    return dt, nd, tensors


def _pack(seq, dt: np.dtype, nd: int, tensors: bool):
    arrays = [x.numpy() for x in seq] if tensors else seq
    shapes = np.array([a.shape for a in arrays], dtype=np.int64).reshape(len(arrays), nd)
    sizes = shapes.prod(axis=1) if nd else np.ones(len(arrays), np.int64)
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if bool((shapes == shapes[:1]).all()):
        data = np.stack(arrays).reshape(-1)
    else:
        data = np.concatenate([np.ravel(a) for a in arrays]) if arrays else np.empty(0, dt)
    return data, offsets, shapes


def _rebuild_list(data, offsets, shapes, tensors):
    return SharedArrayList(data, offsets, shapes, tensors)


def _rebuild_tensor(raw, dtype, shape, requires_grad):
    t = torch.from_numpy(raw).view(dtype).view(shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


class _Pickler(pickle.Pickler):
    def __init__(self, file, buffers: list):
        super().__init__(file, protocol=5, buffer_callback=buffers.append)

    def reducer_override(self, obj):
        if type(obj) is torch.Tensor and obj.layout is torch.strided \
                and obj.device.type == "cpu" and not obj.is_quantized and not obj.is_nested \
                and (obj.grad_fn is None):
            t = obj.detach().contiguous()
            raw = t.view(torch.uint8).reshape(-1).numpy() if t.numel() else \
                np.empty(0, np.uint8)
            return _rebuild_tensor, (raw, t.dtype, tuple(t.shape), obj.requires_grad)
        return NotImplemented

    def persistent_id(self, obj):
        if type(obj) in (list, tuple):
            packed = _packable(obj)
            if packed is not None:
                return ("L", *_pack(obj, *packed), packed[2])
        return None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        if pid[0] == "L":
            return _rebuild_list(*pid[1:])
        raise pickle.UnpicklingError(f"unknown persistent id {pid[0]!r}")


def _round(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def share(obj) -> int:
    """Writes ``obj`` into a new sealed memfd and returns its descriptor (the caller closes it).

    Raises whatever pickling raises (e.g. for objects that can only travel while a process
    starts, such as ``multiprocessing`` locks: the caller then falls back to per-worker
    pickling).
    """
    buffers: list[pickle.PickleBuffer] = []
    f = io.BytesIO()
    _Pickler(f, buffers).dump(obj)
    body = f.getbuffer()
    raws = [b.raw() for b in buffers]
    table = _HEAD.size + _BUF.size * len(raws)
    pos = _round(table + len(body))
    places = []
    for r in raws:
        places.append((pos, r.nbytes))
        pos = _round(pos + r.nbytes)
    fd = os.memfd_create("shmpipe-torch-dataset", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, max(pos, 1))
        with mmap.mmap(fd, max(pos, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            _HEAD.pack_into(m, 0, MAGIC, len(body), len(raws))
            for i, (off, n) in enumerate(places):
                _BUF.pack_into(m, _HEAD.size + i * _BUF.size, off, n)
            m[table:table + len(body)] = body
            for (off, n), r in zip(places, raws):
                m[off:off + n] = r.cast("B")
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    finally:
        for r in raws:
            r.release()
    return fd


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
    magic, body_len, nbufs = _HEAD.unpack_from(m, 0)
    table = _HEAD.size + _BUF.size * nbufs
    if magic != MAGIC or table + body_len > size:
        raise CorruptDataset("the shared dataset has a bad header")
    view = memoryview(m)
    bufs = []
    for i in range(nbufs):
        off, n = _BUF.unpack_from(m, _HEAD.size + i * _BUF.size)
        if off < table + body_len or off + n > size:
            raise CorruptDataset(f"buffer {i} ({off}+{n}) lies outside the shared dataset")
        bufs.append(view[off:off + n])
    return _Unpickler(io.BytesIO(view[table:table + body_len]), buffers=bufs).load()
