"""``SharedArrayList``: what a worker sees in place of a long list or tuple of arrays."""

from __future__ import annotations

import operator
from collections.abc import MutableSequence

import numpy as np
import torch


class SharedArrayList(MutableSequence):
    """A list (or tuple) of numpy arrays or tensors whose bytes lie in the shared dataset.

    What a worker sees in place of a list or tuple of at least ``PACK_MIN`` arrays (or CPU
    tensors) of one plain numeric dtype and rank: the elements' places in the shared mapping
    (a ``range`` when they lie end to end, else one offset per element in the mapping), so
    the worker holds no per-element Python object while it only reads. It
    behaves as the list it replaces: ``isinstance(x, list)`` (or ``tuple``) holds, indexing,
    slicing (a real list or tuple), iteration, ``len``, ``==``, ``+``, ``*`` and every list
    method work. The first write to a list (item assignment, ``append``, ``sort``,
    ``random.shuffle``...) turns it into a private real list of the same items (views of the
    shared bytes), as a worker's copy of the list would be. Items are writable views; a write
    into one stays in the worker (copy-on-write), and reading item ``i`` twice gives two
    views of the same bytes (not the same object) until the list is materialised.
    ``type(x)`` is ``SharedArrayList``; pickling gives a real list or tuple. C functions
    that take only a real list or tuple (``torch.stack(x)``, ``torch.cat(x)``) need
    ``list(x)`` or a slice (``x[a:b]`` is a real list); numpy's take any sequence.
    """

    __slots__ = ("_mem", "_offs", "_shape", "_shapes", "_dt", "_tensors", "_kind", "_list")

    def __init__(self, mem: np.ndarray, offs: np.ndarray, shape, shapes, dt: np.dtype,
                 tensors: bool, kind: type):
        self._mem, self._offs, self._shape, self._shapes = mem, offs, shape, shapes
        self._dt, self._tensors, self._kind = dt, tensors, kind
        self._list: list | None = None

    # isinstance(x, list) looks at __class__ when type(x) is not a list (as mock's spec does);
    # C code that reads a list's storage directly checks type(x) and takes the sequence path.
    @property
    def __class__(self):
        return self._kind

    def _item(self, i: int):
        shape = self._shape if self._shapes is None else tuple(self._shapes[i].tolist())
        a = np.ndarray(shape, self._dt, buffer=self._mem, offset=int(self._offs[i]))
        return torch.from_numpy(a) if self._tensors else a

    def _items(self) -> list:
        if self._list is None:
            return [self._item(i) for i in range(len(self._offs))]
        return self._list

    def _mutable(self) -> list:
        if self._kind is not list:
            raise TypeError("'tuple' object does not support item assignment")
        if self._list is None:
            self._list = self._items()
        return self._list

    def __len__(self) -> int:
        return len(self._offs) if self._list is None else len(self._list)

    def __getitem__(self, i):
        if self._list is not None:
            return self._list[i]
        n = len(self._offs)
        if isinstance(i, slice):
            return self._kind(self._item(j) for j in range(*i.indices(n)))
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{self._kind.__name__} index out of range")
        return self._item(i)

    def __iter__(self):
        if self._list is not None:
            return iter(self._list)
        return (self._item(i) for i in range(len(self._offs)))

    def __reversed__(self):
        return reversed(self._items())

    def __contains__(self, x) -> bool:
        return any(y is x or y == x for y in self)

    def __setitem__(self, i, v) -> None:
        self._mutable()[i] = v

    def __delitem__(self, i) -> None:
        del self._mutable()[i]

    def insert(self, i, v) -> None:
        self._mutable().insert(i, v)

    def append(self, v) -> None:
        self._mutable().append(v)

    def extend(self, vs) -> None:
        self._mutable().extend(vs)

    def pop(self, i=-1):
        return self._mutable().pop(i)

    def remove(self, v) -> None:
        self._mutable().remove(v)

    def clear(self) -> None:
        self._mutable().clear()

    def reverse(self) -> None:
        self._mutable().reverse()

    def sort(self, *, key=None, reverse=False) -> None:
        self._mutable().sort(key=key, reverse=reverse)

    def copy(self) -> list:
        return list(self._items())

    def index(self, v, *args) -> int:
        return self._kind(self._items()).index(v, *args)

    def count(self, v) -> int:
        return self._kind(self._items()).count(v)

    def __iadd__(self, vs):
        self._mutable().extend(vs)
        return self

    def __imul__(self, n):
        self._mutable()[:] = self._mutable() * n
        return self

    def _plain(self, other):
        return self._kind(other) if isinstance(other, SharedArrayList) else other

    def __add__(self, other):
        return self._kind(self._items()) + self._plain(other)

    def __radd__(self, other):
        return other + self._kind(self._items())

    def __mul__(self, n):
        return self._kind(self._items()) * n

    __rmul__ = __mul__

    def __eq__(self, other):
        if other is self:
            return True
        if not isinstance(other, self._kind):
            return NotImplemented
        return self._kind(self._items()) == self._plain(other)

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]

    def __reduce_ex__(self, protocol):
        return self._kind, (self._kind(self._items()),)

    def __reduce__(self):
        return self.__reduce_ex__(2)

    def __copy__(self):
        return self._kind(self._items())

    def __repr__(self) -> str:
        if self._list is not None:
            return repr(self._list)
        kind = "tensors" if self._tensors else "arrays"
        return f"SharedArrayList({len(self)} {kind} of {self._dt}, as a {self._kind.__name__})"
