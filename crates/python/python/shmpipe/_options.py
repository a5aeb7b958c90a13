"""Checks of the arguments users pass (``Pipeline``, the loaders): each refuses a bad value when
the object is made, with an error naming the parameter and saying what it takes."""

from __future__ import annotations

import operator
import os
from typing import Any

#: Largest address space of a channel's large pool (shm-ring's ``MAX_LARGE_POOL``).
MAX_LARGE_POOL = 1 << 40
#: Largest pool block (body lengths travel as u32).
MAX_BLOCK = (1 << 32) - 64
CHANNEL = "channel=(slots, blocks, block_size[, large_pool])"


#: The ranges of the numbers users pass (the Rust side takes them as u64 / usize, and some
#: size what is made from them): ``(least, most)``.
U64 = (0, 2**64 - 1)
SEED = U64
#: ``workers=`` / ``emitters=``: processes per stage (the pipeline's ``MAX_FDS``).
MAX_PROCS = 128
#: ``shuffle_buffer=``: items (the pipeline's ``MAX_SHUFFLE_BUFFER``).
MAX_SHUFFLE_BUFFER = 2**32
#: ``prefetch=``: chunks of outputs read ahead (the pump's queue).
MAX_PREFETCH = 2**16
#: ``batch_bytes=``: a batch larger than a pool block can be is no batch.
MAX_BATCH_BYTES = 2**32
#: ``batch_size=`` of the loaders: rows of a batch (a worker stacks them in memory).
MAX_BATCH_SIZE = 2**24


def _num(n: int) -> str:
    """``n`` as a user reads a limit: ``2**64 - 1`` rather than 18446744073709551615."""
    if n >= 2**20 and (n + 1) & n == 0:
        return f"2**{(n + 1).bit_length() - 1} - 1"
    if n >= 2**20 and n & (n - 1) == 0:
        return f"2**{n.bit_length() - 1}"
    return str(n)


def whole(name: str, value: Any, *, least: int = 0, most: int | None = None,
          none_ok: bool = False) -> int | None:
    """``value`` as an int in ``least..=most`` (``None`` passes with ``none_ok``);
    ``TypeError`` / ``ValueError`` naming ``name=`` and the range otherwise. bool is refused
    (``True`` is not a count)."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name}={value!r}: a whole number, not a bool")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r}: a whole number (int), not "
                        f"{type(value).__name__}") from None
    if most is not None and not least <= n <= most:
        raise ValueError(f"{name}={n}: out of range; pass a whole number from {_num(least)} "
                         f"to {_num(most)}")
    if n < least:
        raise ValueError(f"{name}={n}: at least {least}")
    return n


def channel(geometry: Any) -> list[int] | None:
    """``channel=`` of a pipeline: ``None`` (defaults) or ``(slots, blocks, block_size)`` with
    an optional 4th value ``large_pool``, checked as the channels will check them."""
    if geometry is None:
        return None
    if isinstance(geometry, (str, bytes)) or not hasattr(geometry, "__len__") \
            or len(geometry) not in (3, 4):
        raise TypeError(f"channel={geometry!r}: pass {CHANNEL} (slots 0: sized from "
                        f"batch_bytes; large_pool 0: every array must fit a block)")
    try:
        vals = [whole("", v) for v in geometry]
    except (TypeError, ValueError):
        raise TypeError(f"channel={tuple(geometry)!r}: {CHANNEL} are whole numbers >= 0") from None
    slots, blocks, block_size = vals[:3]
    bad = None
    if slots != 0 and (slots & (slots - 1) or not 2 <= slots <= 1 << 20):
        bad = f"slots={slots}: 0 (sized from batch_bytes) or a power of two from 2 to 2**20"
    elif not 1 <= blocks <= 1 << 20:
        bad = f"blocks={blocks}: from 1 to 2**20"
    elif not 64 <= block_size <= MAX_BLOCK:
        bad = f"block_size={block_size}: from 64 bytes to 4 GiB - 64"
    elif len(vals) == 4 and (vals[3] % 4096 or vals[3] > MAX_LARGE_POOL):
        bad = (f"large_pool={vals[3]}: 0 (none) or a multiple of 4096 up to 2**40 "
               f"(leave it out for the default, any item the machine holds)")
    if bad:
        raise ValueError(f"channel={tuple(vals)!r}: {bad}; {CHANNEL}")
    return vals


def existing_file(name: str, path: Any) -> str:
    """``path`` as a str naming a readable file; ``FileNotFoundError`` naming ``name=``."""
    p = os.fspath(path)
    if not os.path.isfile(p):
        what = "is a directory" if os.path.isdir(p) else "does not exist"
        raise FileNotFoundError(2, f"{name}={p!r}: the file {what}", p)
    return p
