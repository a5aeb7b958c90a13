"""Items that are not flat dicts: their structure as a small JSON description.

A pipeline item is a set of named numpy arrays plus int/float/str metadata. A flat dict of
those converts directly (in Rust). Everything else is *flattened* here: the arrays it holds
(and bytes and long strings, as uint8 arrays) become fields named by their path, the plain
values stay in the description, and :func:`unflatten` rebuilds the same object on the other
side. Arrays still travel zero-copy when they are large; only the description is copied.

The description (JSON, in the metadata field ``__shmpipe_py__``) is ``{"d": {key: node}}``
for a dict (its keys that are not plain fields) or ``{"v": node}`` for any other value, where
a node is a JSON literal (None, bool, int of any size, float including nan/inf, str) or one of
``{"a": field}`` (array), ``{"s": field}`` (numpy scalar, a 0-d array field), ``{"u": field}``
(long str, utf-8 bytes), ``{"y": field}`` (bytes), ``{"d": {...}}`` (dict), ``{"l": [...]}``
(list), ``{"t": [...]}`` (tuple). A description too long for a metadata string travels as a
uint8 array field and the metadata holds ``"@" + field``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

META = "__shmpipe_py__"
_MAX_NAME = 255  # bytes of a field name
_MAX_STR = 60_000  # bytes of a metadata string
_I64 = (-(1 << 63), (1 << 63) - 1)
# dtype (kind, itemsize) pairs a pipeline carries.
_CARRIED = {("b", 1), ("i", 1), ("i", 2), ("i", 4), ("i", 8), ("u", 1), ("u", 2), ("u", 4),
            ("u", 8), ("f", 2), ("f", 4), ("f", 8)}
_FIX = ("items hold numpy arrays (bool, int8..64, uint8..64, float16/32/64), int, float, "
        "bool, str, bytes and None, and dicts (str keys), lists and tuples of them")


def _where(path: tuple) -> str:
    return "item" + "".join(f"[{p!r}]" for p in path)


def _check_array(a: np.ndarray, path: tuple) -> None:
    dt = a.dtype
    if dt.fields is None and dt.subdtype is None and (dt.kind, dt.itemsize) in _CARRIED:
        if not dt.isnative:
            raise TypeError(f"{_where(path)}: array of non-native byte order {dt}: convert it "
                            f"with a.astype(a.dtype.newbyteorder('='))")
        if a.ndim > 16:
            raise TypeError(f"{_where(path)}: array of {a.ndim} dimensions (at most 16)")
        return
    hint = {"U": "keep strings as str values (a list of str)", "S": "keep bytes as bytes values",
            "O": "convert the objects to a numeric array, or keep them as a list",
            "c": "split it into real and imaginary arrays (a.real, a.imag)",
            "M": "convert it to int64 (a.astype('int64')) or to str",
            "m": "convert it to int64 (a.astype('int64'))"}.get(dt.kind, "convert it to one of those")
    raise TypeError(f"{_where(path)}: an array of dtype {dt} cannot cross processes: {hint} "
                    f"({_FIX})")


def _plain(k: Any, v: Any) -> bool:
    """Whether the flat path stores ``k: v`` as it is (the rules of the Rust fast path)."""
    if type(k) is not str or k == META or len(k.encode()) > _MAX_NAME:
        return False
    t = type(v)
    if t is float:
        return True
    if t is int:
        return _I64[0] <= v <= _I64[1]
    if t is str:
        return len(v.encode()) <= _MAX_STR
    if isinstance(v, np.ndarray):
        _check_array(v, (k,))
        return True
    return False


class _Flattener:
    def __init__(self, taken: set):
        self.flat: dict = {}
        self.taken = taken
        self.n = 0

    def field(self, path: tuple, value: Any) -> str:
        name = "/".join(str(p) for p in path)
        if name in self.taken or name in self.flat or len(name.encode()) > _MAX_NAME:
            while True:
                name = f"#{self.n}"
                self.n += 1
                if name not in self.taken and name not in self.flat:
                    break
        self.flat[name] = value
        return name

    def node(self, v: Any, path: tuple) -> Any:
        if v is None or v is True or v is False:
            return v
        t = type(v)
        if isinstance(v, int) and not isinstance(v, np.generic):
            return int(v)
        if isinstance(v, float) and not isinstance(v, np.generic):
            return float(v)
        if isinstance(v, str):
            s = str(v)
            if len(s.encode()) <= _MAX_STR:
                return s
            return {"u": self.field(path, np.frombuffer(s.encode(), np.uint8))}
        if isinstance(v, (bytes, bytearray, memoryview)):
            return {"y": self.field(path, np.frombuffer(bytes(v), np.uint8))}
        if isinstance(v, np.ndarray):
            _check_array(v, path)
            return {"a": self.field(path, v)}
        if isinstance(v, np.generic):
            a = np.asarray(v)
            _check_array(a, path)
            return {"s": self.field(path, a)}
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                if not isinstance(k, str):
                    raise TypeError(f"{_where(path)}: key {k!r} is a {type(k).__name__}: keys "
                                    f"of items and of the dicts inside them are str")
                out[k] = self.node(x, path + (k,))
            return {"d": out}
        if t is list or t is tuple or isinstance(v, (list, tuple)):
            items = [self.node(x, path + (i,)) for i, x in enumerate(v)]
            return {"t": items} if isinstance(v, tuple) else {"l": items}
        raise TypeError(f"{_where(path)}: a {t.__module__}.{t.__qualname__} cannot cross "
                        f"processes: {_FIX}; convert it to one of those (e.g. a numpy array)")


def flatten(obj: Any) -> tuple[dict, str]:
    """``(fields, description)``: the flat fields that carry ``obj`` and its description."""
    if isinstance(obj, dict):
        for k in obj:
            if not isinstance(k, str):
                raise TypeError(f"item key {k!r} is a {type(k).__name__}: item keys are str")
        f = _Flattener(set(obj))
        nodes = {}
        for k, v in obj.items():
            if _plain(k, v):
                f.flat[k] = v
            else:
                nodes[k] = f.node(v, (k,))
        desc = {"d": nodes}
    else:
        f = _Flattener(set())
        desc = {"v": f.node(obj, ())}
    text = json.dumps(desc, separators=(",", ":"))
    if len(text.encode()) > _MAX_STR:
        text = "@" + f.field(("#desc",), np.frombuffer(text.encode(), np.uint8))
    return f.flat, text


class _Builder:
    def __init__(self, fields: dict):
        self.fields = fields
        self.used: list = []

    def take(self, name: str) -> Any:
        try:
            v = self.fields[name]
        except KeyError:
            raise ValueError(f"the item's field {name!r} is missing: a built-in step removed or "
                             f"renamed it, and the Python value it belonged to cannot be "
                             f"rebuilt") from None
        self.used.append(name)
        return v

    def build(self, n: Any) -> Any:
        if not isinstance(n, dict):
            return n
        (kind, x), = n.items()
        if kind == "a":
            return self.take(x)
        if kind == "s":
            return self.take(x)[()]
        if kind == "u":
            return self.take(x).tobytes().decode()
        if kind == "y":
            return self.take(x).tobytes()
        if kind == "d":
            return {k: self.build(v) for k, v in x.items()}
        if kind == "l":
            return [self.build(v) for v in x]
        if kind == "t":
            return tuple(self.build(v) for v in x)
        raise ValueError(f"unknown node {kind!r} in an item description")


def unflatten(fields: dict, text: str) -> Any:
    """The object that :func:`flatten` turned into ``fields`` and ``text`` (``fields`` is
    reused for a dict)."""
    b = _Builder(fields)
    if text.startswith("@"):
        text = b.take(text[1:]).tobytes().decode()
    desc = json.loads(text)
    if "v" in desc:
        return b.build(desc["v"])
    nodes = {k: b.build(v) for k, v in desc["d"].items()}
    for name in b.used:
        fields.pop(name, None)
    fields.update(nodes)
    return fields
