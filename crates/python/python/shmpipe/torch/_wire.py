"""One batch in one pool block: how a worker writes it and how the trainer reads it.

A worker loans one block of its channel (the *arena*) before it fetches a batch; the
collate hooks (:mod:`._collate`) stack samples straight into it. The batch object is then
pickled with every tensor and numpy array replaced by a reference to its bytes in the arena
(tensors made elsewhere are copied in first), and the pickle itself goes at the end of the
arena. The trainer receives the block, unpickles, and builds each tensor as a view of the
block: zero-copy, and the block goes back to the worker when the last tensor made from it is
garbage (each view holds the numpy array over the block, whose base holds the message).

Anything else in the batch (strings, ints, nested lists, dicts, namedtuples, custom classes)
travels inside the pickle as usual.
"""

from __future__ import annotations

import io
import pickle
import struct

import numpy as np
import torch

ALIGN = 64

# Element types numbered for the references (code = position); any other strided dtype
# (float8, complex32, bits, int4, ...) travels too, as its bytes and its name (code _BY_NAME).
_TORCH_TYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
    torch.bool, *(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)),
)
_TORCH_CODE = {d: i for i, d in enumerate(_TORCH_TYPES)}
TRAVELS = frozenset(_TORCH_TYPES)       # the dtypes collate stacks straight into the arena
_BY_NAME = 255                       # dtype code of a reference that ends with the dtype's name
_HEAD_T = struct.Struct("<BB?q")     # dtype code, ndim, requires_grad, storage offset
_HEAD_N = struct.Struct("<Bq")       # ndim, byte offset (then shape, then dtype.str)


_SIZES = {d: torch.empty((), dtype=d).element_size() for d in _TORCH_TYPES}


def _itemsize(dtype: torch.dtype) -> int:
    return _SIZES[dtype] if dtype in _SIZES else torch.empty((), dtype=dtype).element_size()


_NAMED: dict = {}     # name (bytes) -> dtype, and dtype -> name, for dtypes without a code


def _dtype_named(name: bytes) -> torch.dtype:
    dt = _NAMED.get(name)
    if dt is None:
        dt = getattr(torch, name.decode("ascii"), None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"unknown dtype {name!r}")
        _NAMED[name] = dt
    return dt


def _name_of(dtype: torch.dtype) -> bytes:
    name = _NAMED.get(dtype)
    if name is None:
        name = _NAMED[dtype] = str(dtype).removeprefix("torch.").encode("ascii")
    return name


# Integer dtypes by size: copies of any dtype's elements as bits (torch has no copy kernel
# for some of them, e.g. bits8 or int4).
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Overflow(Exception):
    """The batch does not fit in the arena (or there is no arena yet)."""


def _round(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Arena:
    """A bump allocator over one loaned pool block (a writable uint8 numpy array).

    ``buf`` is None for a *measuring* arena: allocations always succeed and only count, so
    a first pass can learn how large a block a batch needs.
    """

    def __init__(self, buf: np.ndarray | None, size: int | None = None):
        self.buf = buf
        self.size = len(buf) if buf is not None else (size or 0)
        self.used = 0
        self._u8 = torch.from_numpy(buf) if buf is not None else None
        self._ptr = self._u8.data_ptr() if buf is not None else -1

    def alloc(self, nbytes: int) -> int | None:
        off = _round(self.used)
        if self.buf is not None and off + nbytes > self.size:
            return None
        self.used = off + nbytes
        return off

    def tensor(self, shape, dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialised contiguous tensor inside the arena, or None if it does not fit."""
        if self.buf is None:
            return None
        numel = 1
        for s in shape:
            numel *= int(s)
        nbytes = numel * _itemsize(dtype)
        off = self.alloc(nbytes)
        if off is None:
            return None
        return self._u8[off:off + nbytes].view(dtype).view(tuple(shape))

    def holds(self, t: torch.Tensor) -> bool:
        return self._ptr >= 0 and t.untyped_storage().data_ptr() == self._ptr


class _Pickler(pickle.Pickler):
    """Pickles a batch with tensors and arrays as references into the arena.

    A reference is one ``bytes`` object (``T`` or ``N``, then packed integers), so that the
    pickler does not visit its parts one by one.
    """

    def __init__(self, file, arena: Arena):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arena = arena
        # id -> (number, object) of each tensor and array sent: one sent again (a batch
        # holding (t, t)) is a reference to the first (``R`` and its number), which arrives
        # as the same object. The object is kept so that its id is not reused meanwhile.
        self._sent: dict = {}

    def persistent_id(self, obj):
        t = type(obj)
        if t is torch.Tensor:
            if obj.layout is torch.strided and obj.device.type == "cpu" \
                    and not obj.is_quantized \
                    and not obj.is_nested and not obj.is_conj() and not obj.is_neg():
                return self._once(obj, self._tensor)
        elif t is np.ndarray:
            if obj.dtype.kind in "biufc" and obj.dtype.isnative:
                return self._once(obj, self._array)
        return None

    def _once(self, obj, ref):
        seen = self._sent.get(id(obj))
        if seen is not None:
            return b"R" + struct.pack("<q", seen[0])
        pid = ref(obj)
        if pid is not None:
            self._sent[id(obj)] = (len(self._sent), obj)
        return pid

    def _tensor(self, t: torch.Tensor):
        grad = t.requires_grad
        if grad:
            if t.grad_fn is not None:
                return None     # torch refuses to send non-leaf tensors; let it say so
            t = t.detach()
        shape, stride = t.shape, t.stride()
        if self.arena.holds(t):
            offset = t.storage_offset()
        else:
            # The storage the view spans, with its strides (an expand()ed tensor travels
            # once, a transposed one stays transposed, as with torch's loader); a sparse view
            # (a column of a matrix) only its elements, contiguous.
            size = t.element_size()
            numel = t.numel()
            span = _span(shape, stride)
            dense = span <= 2 * numel
            if not dense:
                span, stride = numel, _contiguous_strides(shape)
            off = self.arena.alloc(span * size)
            if off is None:
                raise Overflow
            if self.arena.buf is not None:
                # As integers of the element's size: one kernel for every dtype, and as many
                # elements as the tensor has (torch splits a copy over threads by count).
                bits = _BITS.get(size, t.dtype)
                dst = self.arena._u8[off:off + span * size].view(bits)
                if dense:
                    dst.copy_(t.as_strided((span,), (1,), t.storage_offset()).view(bits))
                else:
                    dst.view(shape).copy_(t.view(bits))
            offset = off // size
        nd = len(shape)
        code = _TORCH_CODE.get(t.dtype, _BY_NAME)
        pid = b"T" + _HEAD_T.pack(code, nd, grad, offset) \
            + struct.pack(f"<{2 * nd}q", *shape, *stride)
        return pid if code != _BY_NAME else pid + _name_of(t.dtype)

    def _array(self, a: np.ndarray):
        nbytes = a.nbytes
        off = self.arena.alloc(nbytes)
        if off is None:
            raise Overflow
        if self.arena.buf is not None:
            np.copyto(self.arena.buf[off:off + nbytes].view(a.dtype).reshape(a.shape), a)
        nd = a.ndim
        return b"N" + _HEAD_N.pack(nd, off) + struct.pack(f"<{nd}q", *a.shape) \
            + a.dtype.str.encode()


def _span(shape, stride) -> int:
    """Elements of storage a view reaches from its offset (0 if it is empty)."""
    last = 0
    for s, st in zip(shape, stride):
        if s == 0:
            return 0
        last += (s - 1) * st
    return last + 1


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def encode(obj, arena: Arena) -> tuple[int, int]:
    """Writes ``obj`` into ``arena``; returns (offset, length) of its pickle in the arena.

    Raises :class:`Overflow` when it does not fit (``arena.used`` then tells a measuring
    arena how many bytes it needs, the pickle included).
    """
    f = io.BytesIO()
    _Pickler(f, arena).dump(obj)
    data = f.getbuffer()
    off = arena.alloc(len(data))
    if off is None:
        raise Overflow
    if arena.buf is not None:
        arena.buf[off:off + len(data)] = np.frombuffer(data, np.uint8)
    return off, len(data)


def measure(obj) -> int:
    """Bytes a block needs to hold ``obj`` (its tensors, arrays and pickle)."""
    arena = Arena(None)
    encode(obj, arena)
    return arena.used


class CorruptBatch(RuntimeError):
    """A worker's message does not describe a batch inside its own block."""


class _Unpickler(pickle.Unpickler):
    """Unpickles a batch with tensors and arrays as views of (or, ``copy``: copies out of)
    the block."""

    def __init__(self, file, block: np.ndarray, copy: bool):
        super().__init__(file)
        self.block = block
        self.copy = copy
        self.loaded: list = []      # tensors and arrays in the order sent (``R`` refers)

    def persistent_load(self, pid):
        try:
            kind = pid[:1]
            if kind == b"T":
                self.loaded.append(self._tensor(pid))
                return self.loaded[-1]
            if kind == b"N":
                self.loaded.append(self._array(pid))
                return self.loaded[-1]
            if kind == b"R":
                (i,) = struct.unpack_from("<q", pid, 1)
                if not 0 <= i < len(self.loaded):
                    raise IndexError(f"no tensor or array number {i} yet")
                return self.loaded[i]
        except (TypeError, ValueError, KeyError, IndexError, struct.error) as e:
            raise CorruptBatch(f"a worker sent a malformed reference {pid!r}: {e}") from e
        raise CorruptBatch(f"a worker sent an unknown reference {pid!r}")

    def _tensor(self, pid: bytes):
        code, nd, grad, offset = _HEAD_T.unpack_from(pid, 1)
        at = 1 + _HEAD_T.size
        dims = struct.unpack_from(f"<{2 * nd}q", pid, at)
        shape, stride = dims[:nd], dims[nd:]
        dt = _dtype_named(pid[at + 16 * nd:]) if code == _BY_NAME else _TORCH_TYPES[code]
        size = _itemsize(dt)
        end = _extent(shape, stride, offset, len(self.block) // size)
        # Its own storage, exactly the bytes it spans (not the whole block): code that looks
        # at a tensor's storage (nested tensors' buffers, storage sharing) sees what it sent.
        # A copy copies those bytes: strides (stride 0 of an expand()) stay as sent.
        own = self.block[offset * size:end * size]
        own = torch.from_numpy(own.copy() if self.copy else own).view(dt)
        t = own.as_strided(shape, stride, 0)
        if grad:
            t.requires_grad_(True)
        return t

    def _array(self, pid: bytes):
        nd, offset = _HEAD_N.unpack_from(pid, 1)
        at = 1 + _HEAD_N.size
        shape = struct.unpack_from(f"<{nd}q", pid, at)
        dt = np.dtype(pid[at + 8 * nd:].decode())
        if dt.hasobject:
            raise ValueError("object arrays never travel by reference")
        n = 1
        for s in shape:
            if s < 0:
                raise ValueError(f"negative dimension {s}")
            n *= s
        end = offset + n * dt.itemsize
        if offset < 0 or end > len(self.block):
            raise ValueError(f"bytes {offset}..{end} are outside the block of {len(self.block)}")
        a = self.block[offset:end].view(dt).reshape(shape)
        return a.copy() if self.copy else a


# The most elements a view may have: 2**36, or 65536 per element of its block if that is
# more. A view with stride 0 (an expand()ed mask) has more elements than bytes, but a buggy
# worker's (2**62,) is refused, as is a shape whose product overflows torch's int64.
MAX_NUMEL = 1 << 36
MAX_REPEAT = 1 << 16


def _extent(shape, stride, offset, numel) -> int:
    """One past the last element the view reaches (``offset`` if it is empty); every element
    must lie inside the block (a buggy worker gets an error, never a read outside it), and
    the view has at most ``max(MAX_NUMEL, MAX_REPEAT * numel)`` elements."""
    if offset < 0:
        raise ValueError(f"negative storage offset {offset}")
    last = offset
    count = 1
    for s, st in zip(shape, stride):
        if s < 0 or st < 0:
            raise ValueError(f"bad geometry size={shape} stride={stride}")
        count *= s
        last += (s - 1) * st
    if count == 0:
        if offset > numel:
            raise ValueError(f"offset {offset} is outside the block ({numel} elements)")
        return offset
    if count > max(MAX_NUMEL, MAX_REPEAT * numel):
        raise ValueError(f"a view of {count} elements over a block of {numel} elements")
    if last >= numel:
        raise ValueError(f"element {last} is outside the block ({numel} elements)")
    return last + 1


def decode(block: np.ndarray, off, length, copy: bool):
    """The batch written by :func:`encode` into ``block``: tensors view the block (or are
    copies of it with ``copy``, which lets the block go back at once). ``off`` and
    ``length`` come from the worker's message and are checked here."""
    if type(off) is not int or type(length) is not int:
        raise CorruptBatch(f"a worker sent a batch with a bad pickle place {off!r}+{length!r}")
    if off < 0 or length < 0 or off + length > len(block):
        raise CorruptBatch(f"the batch's pickle ({off}+{length}) is outside its block "
                           f"of {len(block)} bytes")
    data = bytes(block[off:off + length])
    return _Unpickler(io.BytesIO(data), block, copy).load()
