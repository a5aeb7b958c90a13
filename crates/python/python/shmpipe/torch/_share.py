"""The dataset, written once into a sealed memfd that every worker maps.

torch hands each worker its own copy of the dataset: pickled per worker (spawn, forkserver)
or inherited by fork, where reading Python objects writes their reference counts and copies
the pages one by one (pytorch#13246: memory that grows with every worker). Here the parent
pickles the dataset (with ``worker_init_fn`` and ``collate_fn``, so bound methods keep
sharing their object) once, with the bytes of numpy arrays and CPU tensors *out of band*:

- every array and tensor is an extent of memory (from its first to its last byte, whatever
  its strides); overlapping extents (views of one array or storage, a tensor made by
  ``torch.from_numpy`` and its array, references to one object) merge into one region,
  written once, and each array or tensor is rebuilt in the worker as a view of its region
  with the same offset, shape, strides and dtype (tensors of one region share one storage);
  a view that spans more than twice its own bytes (``a[::1000]``) is written compact;
- arrays of a ``np.memmap`` opened ``"r"``, ``"r+"`` or ``"w+"`` (and views of one) are not
  copied: their region is the file's, which the worker maps again, read-only (``"r"``) or
  copy-on-write (the others), checking that the file is still the same (device and inode);
- ndarray subclasses that keep numpy's own pickling (``np.memmap``, ``np.matrix``, ...) are
  rebuilt as views of their class; ones with their own ``__reduce__`` (``np.ma``) and arrays
  of Python objects are pickled in band by numpy, as before;
- a list or tuple of at least ``PACK_MIN`` arrays (or tensors) of one plain numeric dtype
  (bool, integers, floats, complex) and rank, each contiguous, arrives as a
  :class:`SharedArrayList`: no per-element Python object in the worker, yet a list (or
  tuple) to the code that uses it. Its arrays that own their bytes are copied into a region
  of the list (by position: no address per array); when they all do, have one shape, appear
  once and were not pickled before, they lie end to end and nothing is stored per element
  (one ``np.concatenate``; see ``_packing``), else the list keeps one offset per element. A
  view of one pickled later is a span of that region, but one pickled before the list, or a
  ``torch.from_numpy`` tensor of one, keeps a copy of its own.

The memfd is sealed against writes, shrinking and growing before any worker sees it; workers
map it copy-on-write (``MAP_PRIVATE``): what they read is shared, what they write stays in
the worker, like a copy. Nothing goes to ``/dev/shm``. Between epochs (workers that do not
persist) a loader reuses its last memfd when the dataset is unchanged: it pickles to the same
bytes and every region's bytes still equal the memfd's (compared in place, never copied).
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import io
import mmap
import os
import pickle
import struct
import weakref

import numpy as np
import torch

from ._packing import _Packing, _extent
from ._shared_list import SharedArrayList

__all__ = ["SharedArrayList", "share", "load", "CorruptDataset", "PACK_MIN"]

MAGIC = b"SHMPTDS4"
_HEAD = struct.Struct("<8sQQQ")         # magic, pickle length, meta offset, meta length
PACK_MIN = 4096
_SPARSE = 2                             # a view spanning more than 2x its bytes goes compact
_ALIGN = 16                             # a region keeps its address's remainder mod 16
_LIBC = ctypes.CDLL(None)
_LIBC.memcmp.restype = ctypes.c_int
_LIBC.memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_TRIM = getattr(_LIBC, "malloc_trim", None)     # glibc's
if _TRIM is not None:
    _TRIM.argtypes, _TRIM.restype = (ctypes.c_size_t,), ctypes.c_int


def _plain_pickling(cls) -> bool:
    """Whether an ndarray subclass pickles as numpy pickles it (nothing of its own)."""
    return all(getattr(cls, m) is getattr(np.ndarray, m)
               for m in ("__reduce__", "__reduce_ex__", "__setstate__")) \
        and getattr(cls, "__getstate__", None) is getattr(np.ndarray, "__getstate__", None)


class _Pickler(_Packing, pickle.Pickler):
    def __init__(self, file):
        super().__init__(file, protocol=5)
        self.spans: list[tuple[int, int, int, int]] = []    # lo, hi, first, file (0: none)
        self.files: list[tuple] = [()]                      # file keys, [0] unused
        self._file_ids: dict = {}
        # packed lists: (element spans, shapes or None), or ("even", owned index, step)
        self.packs: list[tuple] = []
        # arrays that own their bytes, copied one after the other into a region of their own
        # (no address needed, the slowest part of a long list): arrays, dtype, shape, their
        # offsets and first span (None, None: an even list's, no span per array), bytes
        self.owned: list[tuple] = []
        self.even: list = []            # the evenly packed lists (_packing._Even)
        self.even_spans: list[tuple[int, int, int]] = []    # span, owned index, offset
        self.span_k: list[int] = []     # the span number of each entry of spans
        self.nk = 0                     # spans numbered (in spans, or owned by a list)
        self.derived: list[tuple[int, int, int]] = []   # a view's span, its owner's, offset
        self._pids: dict[int, object] = {}
        self._np_spans: dict[int, tuple[int, tuple]] = {}
        self.keep: list = []            # every object whose id or memory is recorded

    def _span(self, lo: int, hi: int, first: int, file: int) -> int:
        self.spans.append((lo, hi, first, file))
        self.span_k.append(self.nk)
        self.nk += 1
        return self.nk - 1

    # -- numpy ---------------------------------------------------------------------------

    def _file_of(self, a: np.ndarray) -> tuple[int, object]:
        """(file id, the memmap) of a memmap-backed array's memory, or (0, None)."""
        b = a
        while isinstance(b, np.ndarray):
            if isinstance(b, np.memmap) and getattr(b, "_mmap", None) is not None:
                break
            b = b.base
        else:
            return 0, None
        mm = b._mmap
        key = self._file_ids.get(id(mm))
        if key is None:
            key = 0
            if b.mode in ("r", "r+", "w+") and b.filename:
                try:
                    addr = np.frombuffer(mm, np.uint8).ctypes.data
                    st = os.stat(b.filename)
                except (OSError, ValueError, TypeError):
                    pass
                else:
                    start = b.offset - b.offset % mmap.ALLOCATIONGRANULARITY
                    if start + len(mm) <= st.st_size:
                        self.files.append((os.fspath(b.filename), addr, start, st.st_dev,
                                           st.st_ino, b.mode))
                        key = len(self.files) - 1
            self._file_ids[id(mm)] = key
            self.keep.append(mm)
        return key, b

    def _np_span(self, a: np.ndarray) -> tuple[int, tuple]:
        """The span of ``a``'s memory and the strides the worker uses (memoized by id)."""
        got = self._np_spans.get(id(a))
        if got is None:
            orig = a
            self.keep.append(a)
            got = self._in_owned(a)
            if got is not None:
                self._np_spans[id(a)] = got
                return got
            file, _ = self._file_of(a)
            first = a.__array_interface__["data"][0]
            lo, hi = _extent(first, a.shape, a.strides, a.itemsize)
            strides = a.strides
            if not file and hi - lo > _SPARSE * a.nbytes + (64 << 10):
                a = np.ascontiguousarray(a)
                self.keep.append(a)
                first, strides = a.__array_interface__["data"][0], a.strides
                lo, hi = first, first + a.nbytes
            got = self._span(lo, hi, first, file), strides
            self._np_spans[id(orig)] = got
        return got

    def _array(self, a: np.ndarray):
        dt, cls = a.dtype, type(a)
        if dt.hasobject or dt.itemsize == 0 or not (cls is np.ndarray or _plain_pickling(cls)):
            return None
        mm = None
        if isinstance(a, np.memmap):
            mm = (a.filename, a.offset, a.mode)
        if a.size == 0:
            k, strides = -1, None
        else:
            k, strides = self._np_span(a)
            strides = a.strides if strides is None else strides
        return ("A", k, dt, a.shape, strides, None if cls is np.ndarray else cls,
                bool(a.flags.writeable), mm)

    # -- torch ---------------------------------------------------------------------------

    def _tensor(self, t: torch.Tensor):
        if t.layout is not torch.strided or t.device.type != "cpu" or t.is_quantized \
                or t.is_nested or t.grad_fn is not None:
            return None
        self.keep.append(t)
        if t.numel() == 0:
            return ("T", -1, t.dtype, tuple(t.shape), None, t.requires_grad)
        src, es = t.detach(), t.element_size()
        lo, hi = _extent(src.data_ptr(), src.shape, [s * es for s in src.stride()], es)
        if src.is_conj() or src.is_neg() or src.data_ptr() % es or _ALIGN % es \
                or hi - lo > _SPARSE * src.numel() * es + (64 << 10):
            src = src.resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format)
            self.keep.append(src)
            lo, hi = src.data_ptr(), src.data_ptr() + src.numel() * es
        k = self._span(lo, hi, src.data_ptr(), 0)
        return ("T", k, t.dtype, tuple(src.shape), tuple(src.stride()), t.requires_grad)

    def persistent_id(self, obj):
        t = type(obj)
        if t is list or t is tuple:
            if len(obj) < PACK_MIN:
                return None
        elif t is not torch.Tensor and not isinstance(obj, np.ndarray):
            return None
        pid = self._pids.get(id(obj), False)
        if pid is False:
            pid = self._tensor(obj) if t is torch.Tensor else self._pack(obj) \
                if t is list or t is tuple else self._array(obj)
            self._pids[id(obj)] = pid
            self.keep.append(obj)
        return pid


def _round(n: int, to: int = _ALIGN) -> int:
    return (n + to - 1) // to * to


class _Layout:
    """Where everything goes: regions merged from the spans, their places in the memfd."""

    def __init__(self, p: _Pickler, body_len: int):
        sp = np.array(p.spans, np.int64).reshape(-1, 4)
        real = np.array(p.span_k, np.int64)
        lo, hi, first, file = sp[:, 0], sp[:, 1], sp[:, 2], sp[:, 3]
        order = np.argsort(lo, kind="stable")
        lo_s, hi_s = lo[order], np.maximum.accumulate(hi[order])
        new = np.ones(len(order), bool)
        new[1:] = lo_s[1:] >= hi_s[:-1]
        starts = np.flatnonzero(new)
        region_of = np.empty(len(order), np.int64)
        region_of[order] = np.cumsum(new) - 1
        ends = np.append(starts[1:], len(order))[:len(starts)] - 1
        rlo, rhi = lo_s[starts], hi_s[ends]
        if len(starts):
            f_s = file[order]
            fmin, fmax = np.minimum.reduceat(f_s, starts), np.maximum.reduceat(f_s, starts)
            rfile = np.where(fmin == fmax, fmin, 0)
        else:
            rfile = np.zeros(0, np.int64)
        rlo = np.where(rfile == 0, rlo - rlo % _ALIGN, rlo)
        # the owned arrays' regions come after the others
        n_real = len(rlo)
        rlo = np.append(rlo, np.zeros(len(p.owned), np.int64))
        rhi = np.append(rhi, np.array([o[5] for o in p.owned], np.int64))
        rfile = np.append(rfile, np.zeros(len(p.owned), np.int64))
        # the interval table: region and offset of each span's first byte in its region
        self.tab = np.empty((p.nk, 2), np.int64)
        self.tab[real, 0] = region_of
        self.tab[real, 1] = first - rlo[region_of]
        for j, (arrays, _, _, offs, k0, _) in enumerate(p.owned):
            if k0 is not None:
                self.tab[k0:k0 + len(arrays), 0] = n_real + j
                self.tab[k0:k0 + len(arrays), 1] = offs
        if p.even_spans:
            k, j, off = np.array(p.even_spans, np.int64).T
            self.tab[k, 0] = n_real + j
            self.tab[k, 1] = off
        if p.derived:
            k, kr, delta = np.array(p.derived, np.int64).T
            self.tab[k, 0] = self.tab[kr, 0]
            self.tab[k, 1] = self.tab[kr, 1] + delta
        self.owned = [(n_real + j, o) for j, o in enumerate(p.owned)]
        self.rlo, self.rlen = rlo, rhi - rlo
        mem = rfile == 0
        self.mem_regions = np.flatnonzero(mem[:n_real])
        self.files = [p.files[f] for f in rfile[~mem].tolist()]
        # regtab: (place in the memfd, length) of a copied region; (-1 - file, length) of a
        # file's region, whose offset in the file is files[j][2] + (rlo - files[j][1])
        self.regtab = np.empty((len(rlo), 2), np.int64)
        self.regtab[:, 1] = self.rlen
        self.regtab[~mem, 0] = -1 - np.arange(int((~mem).sum()))
        fregs = []
        for j, r in enumerate(np.flatnonzero(~mem).tolist()):
            name, addr, start, dev, ino, mode = self.files[j]
            fregs.append((name, start + int(rlo[r]) - addr, int(self.rlen[r]), dev, ino, mode))
        # the memfd: header, pickle, tables, packs' offsets and shapes, regions, meta
        pos = _round(_HEAD.size + body_len)
        self.tab_at, pos = pos, _round(pos + self.tab.nbytes)
        self.regtab_at, pos = pos, _round(pos + self.regtab.nbytes)
        pos = _round(pos, mmap.PAGESIZE)
        sizes = self.rlen[mem]
        places = pos + np.concatenate(([0], np.cumsum((sizes + _ALIGN - 1) // _ALIGN
                                                      * _ALIGN)))
        self.regtab[mem, 0] = places[:-1]
        pos = int(places[-1])
        # packs: (place, step) of an even one's first element; else the place of its
        # offsets (one per element) and of its shapes (-1: one shape for all)
        self.pack_parts: list[tuple[int, np.ndarray]] = []
        self.pack_at: list[tuple] = []
        for pk in p.packs:
            if pk[0] == "even":
                self.pack_at.append(("step", int(self.regtab[n_real + pk[1], 0]), pk[2]))
                continue
            ks, shapes = np.array(pk[0], np.int64), pk[1]
            offs = np.zeros(len(ks), np.int64)
            live = ks >= 0
            offs[live] = self.regtab[self.tab[ks[live], 0], 0] + self.tab[ks[live], 1]
            at_offs, pos = pos, _round(pos + offs.nbytes)
            self.pack_parts.append((at_offs, offs))
            at_sh = -1
            if shapes is not None:
                sh = np.array(shapes, np.int64).reshape(len(ks), -1)
                at_sh, pos = pos, _round(pos + sh.nbytes)
                self.pack_parts.append((at_sh, sh))
            self.pack_at.append(("offs", at_offs, at_sh))
        meta = {"tab": (self.tab_at, len(self.tab)), "regtab": (self.regtab_at, len(rlo)),
                "files": fregs, "packs": self.pack_at}
        self.meta = pickle.dumps(meta, protocol=5)
        self.meta_at = pos
        self.size = pos + len(self.meta)

    def small_parts(self):
        """(offset, bytes) of everything but the regions' bytes."""
        parts = [(self.tab_at, self.tab), (self.regtab_at, self.regtab), *self.pack_parts]
        parts.append((self.meta_at, np.frombuffer(self.meta, np.uint8)))
        return parts

    def owned_bytes(self, mapping=None):
        """(place, length, the owned arrays' bytes: written into ``mapping`` if given, else
        a new array) of each region of owned arrays."""
        for r, (arrays, dt, shape, _, _, n) in self.owned:
            at = int(self.regtab[r, 0])
            dst = np.frombuffer(mapping, dt, count=n // dt.itemsize, offset=at) \
                if mapping is not None else np.empty(n // dt.itemsize, dt)
            if shape:
                np.concatenate(arrays, out=dst.reshape((len(arrays) * shape[0], *shape[1:])))
            elif shape is not None:
                np.stack(arrays, out=dst)
            else:
                np.concatenate([a.reshape(-1) for a in arrays], out=dst)
            yield at, n, dst

    def copies(self):
        """(place in the memfd, address, length) of each copied region."""
        m = self.mem_regions
        return zip(self.regtab[m, 0].tolist(), self.rlo[m].tolist(), self.rlen[m].tolist())


class _Shared:
    """A loader's last shared dataset: the sealed memfd, kept mapped for comparison."""

    def __init__(self, fd: int):
        self.fd = fd
        size = os.fstat(fd).st_size
        self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        self._closer = weakref.finalize(self, os.close, fd)

    # A copy or pickle of the loader (Lightning, deepcopy) starts without a cached share.
    def __reduce__(self):
        return _dropped, ()

    def __deepcopy__(self, memo):
        return None

    def same(self, body, lay: _Layout) -> bool:
        m = self.map
        if len(m) != lay.size or m[:_HEAD.size] != _header(body, lay) \
                or m[_HEAD.size:_HEAD.size + len(body)] != body:
            return False
        for at, arr in lay.small_parts():
            if m[at:at + arr.nbytes] != arr.tobytes():
                return False
        base = np.frombuffer(m, np.uint8).ctypes.data
        # SAFETY (of the raw addresses): every region lies in the memory of an object the
        # pickler keeps alive, and in this read-only mapping of lay.size bytes.
        if not all(_LIBC.memcmp(base + at, addr, n) == 0 for at, addr, n in lay.copies()):
            return False
        return all(_LIBC.memcmp(base + at, now.ctypes.data, n) == 0
                   for at, n, now in lay.owned_bytes())


def _dropped():
    return None


def _header(body, lay: _Layout) -> bytes:
    return _HEAD.pack(MAGIC, len(body), lay.meta_at, len(lay.meta))


def share(obj, cache=None) -> int:
    """Writes ``obj`` into a new sealed memfd and returns its descriptor (the caller closes it).

    With ``cache`` (the loader), the memfd of the last call for that loader is returned
    again (a new descriptor of it) when nothing changed: the pickle, the layout and every
    copied region's bytes are the same. Raises whatever pickling raises (e.g. for objects
    that can only travel while a process starts, such as ``multiprocessing`` locks: the
    caller then falls back to per-worker pickling).
    """
    try:
        return _share(obj, cache)
    finally:
        # The pickler's tables and a long list's id arrays are freed by now, but glibc keeps
        # such pages in its heap: the trainer would hold ~15 MiB for 1M arrays for good.
        if _TRIM is not None:
            _TRIM(0)


def _share(obj, cache) -> int:
    f = io.BytesIO()
    p = _Pickler(f)
    # The pickler's tables grow by an entry per array: with the cyclic collector on, each
    # few hundred entries would walk every object (a list of 200k arrays: ~3x the time).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        p.dump(obj)
    finally:
        if was_enabled:
            gc.enable()
    body = f.getbuffer()
    lay = _Layout(p, len(body))
    old = getattr(cache, "_shmpipe_shared", None) if cache is not None else None
    if old is not None and old.same(body, lay):
        return os.dup(old.fd)
    fd = _write(body, lay)
    if cache is not None:
        try:
            cache._shmpipe_shared = _Shared(os.dup(fd))
        except BaseException:
            os.close(fd)
            raise
    del p
    return fd


def _write(body, lay: _Layout) -> int:
    size = max(lay.size, 1)
    fd = os.memfd_create("shmpipe:torch-dataset", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            m[:_HEAD.size] = _header(body, lay)
            m[_HEAD.size:_HEAD.size + len(body)] = body
            for at, arr in lay.small_parts():
                m[at:at + arr.nbytes] = arr.tobytes()
            view = np.frombuffer(m, np.uint8)
            base = view.ctypes.data
            # SAFETY (of the raw addresses): each region lies in the memory of an object the
            # pickler keeps alive (its first byte floored to 16, in the same page), and its
            # place lies inside this mapping (the layout sized the memfd for it).
            for at, addr, n in lay.copies():
                ctypes.memmove(base + at, addr, n)
            for _at, _n, dst in lay.owned_bytes(m):
                del dst
            del view
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


class CorruptDataset(RuntimeError):
    """The shared dataset's memfd does not hold what the parent wrote."""


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, mem: np.ndarray, meta: dict):
        super().__init__(file)
        self.mem = mem
        self.tab = self._table(*meta["tab"])
        self.regtab = self._table(*meta["regtab"])
        self.files, self.packs = meta["files"], meta["packs"]
        self.loaded: dict = {}
        self.storages: dict = {}
        self.maps: dict = {}

    def _table(self, at: int, n: int) -> np.ndarray:
        if at < 0 or at + 16 * n > self.mem.size:
            raise CorruptDataset("a table lies outside the shared dataset")
        return self.mem[at:at + 16 * n].view(np.int64).reshape(n, 2)

    def _place(self, k: int) -> tuple[np.ndarray, int, int, int]:
        """(buffer of span k's region, the region's offset in it, span k's first byte's
        offset in the region, the region) of span k."""
        if not 0 <= k < len(self.tab):
            raise CorruptDataset(f"span {k} is not in the shared dataset")
        r, off = (int(x) for x in self.tab[k])
        if not 0 <= r < len(self.regtab):
            raise CorruptDataset(f"region {r} is not in the shared dataset")
        at, n = (int(x) for x in self.regtab[r])
        if not 0 <= off < n:
            raise CorruptDataset(f"span {k} lies outside its region")
        if at >= 0:
            if at + n > self.mem.size:
                raise CorruptDataset(f"region {r} lies outside the shared dataset")
            return self.mem, at, off, r
        buf = self.maps.get(r)
        if buf is None:
            if not 0 <= -1 - at < len(self.files):
                raise CorruptDataset(f"region {r} names no file")
            buf = self.maps[r] = self._map_file(self.files[-1 - at])
        return buf, 0, off, r

    @staticmethod
    def _map_file(f) -> np.memmap:
        name, start, n, dev, ino, mode = f
        with open(name, "rb") as fh:
            st = os.fstat(fh.fileno())
            if (st.st_dev, st.st_ino) != (dev, ino) or start + n > st.st_size:
                raise CorruptDataset(f"the dataset's memmap file {name} was replaced or "
                                     "truncated since the loader shared it")
            return np.memmap(fh, np.uint8, "r" if mode == "r" else "c", start, (n,))

    def persistent_load(self, pid):
        key = pid[:2]
        obj = self.loaded.get(key)
        if obj is None:
            kind = pid[0]
            if kind == "A":
                obj = self._array(*pid[1:])
            elif kind == "T":
                obj = self._tensor(*pid[1:])
            elif kind == "L":
                obj = self._list(*pid[1:])
            else:
                raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
            self.loaded[key] = obj
        return obj

    def _array(self, k, dt, shape, strides, cls, writeable, mm):
        buf = None
        if k < 0:
            a = np.empty(shape, dt)
        else:
            buf, at, off, _ = self._place(k)
            try:
                a = np.ndarray(shape, dt, buffer=buf, offset=at + off, strides=strides)
            except (ValueError, TypeError) as e:
                raise CorruptDataset(f"an array lies outside the shared dataset: {e}") from None
        if cls is not None:
            a = a.view(cls)
            if mm is not None:
                a._mmap = buf._mmap if isinstance(buf, np.memmap) else None
                a.filename, a.offset = mm[0], mm[1]
                a.mode = "r" if mm[2] == "r" else "c"
        if not writeable:
            a.flags.writeable = False
        return a

    def _tensor(self, k, dtype, shape, stride, requires_grad):
        if k < 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            buf, at, off, r = self._place(k)
            store = self.storages.get(r)
            if store is None:       # one storage per region: its tensors share it
                n = int(self.regtab[r][1])
                store = self.storages[r] = torch.from_numpy(buf[at:at + n]).untyped_storage()
            t = torch.empty(0, dtype=dtype)
            if off % t.element_size():
                raise CorruptDataset("a tensor is misaligned in the shared dataset")
            try:
                t.set_(store, off // t.element_size(), shape, stride)
            except RuntimeError as e:
                raise CorruptDataset(f"a tensor lies outside the shared dataset: {e}") from None
        if requires_grad:
            t.requires_grad_(True)
        return t

    def _list(self, p, n, dt, shape, nd, tensors, is_tuple):
        if not 0 <= p < len(self.packs):
            raise CorruptDataset(f"packed list {p} is not in the shared dataset")
        how, at_offs, at_sh = self.packs[p]
        if how == "step":           # element i at at_offs + i * at_sh: no offset per element
            step = at_sh
            if shape is None or step != int(np.prod(shape, dtype=np.int64)) * dt.itemsize \
                    or step <= 0 or at_offs < 0 or at_offs + n * step > self.mem.size:
                raise CorruptDataset("a packed list lies outside the shared dataset")
            return SharedArrayList(self.mem, range(at_offs, at_offs + n * step, step), shape,
                                   None, dt, tensors, tuple if is_tuple else list)
        if at_offs < 0 or at_offs + 8 * n > self.mem.size:
            raise CorruptDataset("a packed list lies outside the shared dataset")
        offs = self.mem[at_offs:at_offs + 8 * n].view(np.int64)
        shapes = None
        if shape is None:
            if at_sh < 0 or at_sh + 8 * n * nd > self.mem.size:
                raise CorruptDataset("a packed list lies outside the shared dataset")
            shapes = self.mem[at_sh:at_sh + 8 * n * nd].view(np.int64).reshape(n, nd)
            sizes = shapes.prod(axis=1) if nd else np.ones(n, np.int64)
            bad = bool((shapes < 0).any())
        else:
            sizes = np.full(n, int(np.prod(shape, dtype=np.int64)), np.int64)
            bad = False
        if bad or bool(((offs < 0) | (offs + sizes * dt.itemsize > self.mem.size)).any()):
            raise CorruptDataset("a packed list's offsets do not match the shared dataset")
        return SharedArrayList(self.mem, offs, shape, shapes, dt, tensors,
                               tuple if is_tuple else list)


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
    magic, body_len, meta_at, meta_len = _HEAD.unpack_from(m, 0)
    if magic != MAGIC or _HEAD.size + body_len > size or meta_at + meta_len > size:
        raise CorruptDataset("the shared dataset has a bad header")
    mem = np.frombuffer(m, np.uint8)
    meta = pickle.loads(m[meta_at:meta_at + meta_len])
    body = io.BytesIO(memoryview(m)[_HEAD.size:_HEAD.size + body_len])
    return _Unpickler(body, mem, meta).load()
