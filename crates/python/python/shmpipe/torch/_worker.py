"""One worker process: its setup (seeds, ``get_worker_info``, ``worker_init_fn``, exactly as
torch's worker does it) and its loop (tasks in over the control socket, batches out through
its own shmpipe channel).

The channel is created after the first batch, sized for it (one batch per pool block), and
handed to the trainer over the control socket (``SCM_RIGHTS``); a later batch that does not
fit makes a larger channel the same way, after a :class:`Switch` marker on the old one.
"""

from __future__ import annotations

import collections
import os
import random
import select
import signal
import socket
import sys
import threading

import numpy as np
import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import worker as _tw

from .. import _native
from . import _collate, _procs, _share, _wire

BLOCK_MIN = 64 * 1024
BLOCK_ROUND = 64 * 1024


class Switch:
    """Marker: the next messages come on a new channel, whose descriptor follows on the socket."""


def run(cfg: dict, sock_arg: _procs.FdArg, payload, pidfd_arg: _procs.FdArg) -> None:
    """Entry point of a worker process (the target of ``Process``)."""
    _watch_parent(pidfd_arg.take())
    adopt(cfg)
    # Ctrl-C goes to the whole process group: the trainer decides what happens.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=sock_arg.take())
    if _procs.main_error is not None:
        _tell_main_error(sock)
        return
    w = _Worker(cfg, sock)
    try:
        w.setup(payload)
        w.loop()
    except (_native.PeerDied, _native.Disconnected, _procs.Closed, BrokenPipeError,
            ConnectionResetError):
        pass    # the trainer closed our channel or socket (shutdown) or is gone: just exit
    finally:
        _tw._worker_info = None
        w.close()


def adopt(cfg: dict) -> None:
    """Takes the trainer's ``os.environ`` as of the iterator's start and its ``sys.argv``, as
    torch's workers (all started by its iterator's constructor) have them, before the dataset
    is unpickled and ``worker_init_fn`` runs: the fork server's own (as of ``import
    shmpipe.torch``) would lose what the trainer set or deleted since, and workers 1.. start
    in the background, after the iterator is returned. Only our marker that this is a worker
    stays."""
    marker = os.environ.get(_procs.CHILD_ENV)
    os.environ.clear()
    os.environ.update(cfg["environ"])
    if marker is not None:
        os.environ[_procs.CHILD_ENV] = marker
    sys.argv = list(cfg["argv"])


def _tell_main_error(sock: socket.socket) -> None:
    """Sends the fork server's failure to import the trainer's main script (the trainer raises
    it), then waits for the trainer to close the socket or say quit: a worker that exited at
    once could be reported as dead by a task sent meanwhile, without the reason."""
    try:
        _procs.send_obj(sock, ("e", _procs.main_error))
        while _procs.recv_obj(sock)[0][0] != "q":
            pass
    except (_procs.Closed, OSError):
        pass
    finally:
        sock.close()


def _watch_parent(pidfd: int) -> None:
    """Exits this process as soon as the trainer is gone (a pidfd turns readable then)."""
    def watch():
        try:
            select.select([pidfd], [], [])
        finally:
            os._exit(0)
    threading.Thread(target=watch, name="shmpipe-parent-watch", daemon=True).start()


class _Out:
    """The worker's end of its batch channel: created at the first batch, grown on demand."""

    def __init__(self, sock: socket.socket, blocks: int):
        self.sock, self.blocks = sock, blocks
        self.tx: _native.Sender | None = None
        self.block = 0

    def arena(self) -> _wire.Arena | None:
        if self.tx is None:
            return None
        return _wire.Arena(self.tx.loan((self.block,), np.uint8))

    def send(self, obj, arena: _wire.Arena | None) -> None:
        if arena is not None:
            try:
                self._send(obj, arena)
                return
            except _wire.Overflow:
                pass
        self._grow(_wire.measure(obj))
        self._send(obj, self.arena())

    def _send(self, obj, arena: _wire.Arena) -> None:
        off, n = _wire.encode(obj, arena)
        self.tx.send({"a": arena.buf}, meta={"o": off, "n": n})

    def _grow(self, need: int) -> None:
        block = max(BLOCK_MIN, -(-(need + need // 4) // BLOCK_ROUND) * BLOCK_ROUND)
        slots = 1 << max(6, (4 * self.blocks - 1).bit_length())    # a power of two
        tx = _native.Sender.anonymous(slots=slots, blocks=self.blocks, block_size=block)
        old, self.tx, self.block = self.tx, tx, block
        if old is not None:
            self._marker(old)
        _procs.send_obj(self.sock, ("c", block), fds=(tx.fileno(),))

    @staticmethod
    def _marker(old: _native.Sender) -> None:
        """Ends the old channel with a :class:`Switch` marker."""
        arena = _wire.Arena(old.loan((_wire.measure(Switch()),), np.uint8))
        off, n = _wire.encode(Switch(), arena)
        old.send({"a": arena.buf}, meta={"o": off, "n": n})
        old.close()

    def close(self) -> None:
        if self.tx is not None:
            self.tx.close()
            self.tx = None


class _Worker:
    def __init__(self, cfg: dict, sock: socket.socket):
        self.cfg = cfg
        self.id = cfg["worker_id"]
        self.sock = sock
        self.out = _Out(sock, cfg["blocks"])
        self.pending: collections.deque = collections.deque()
        self.iteration_end = False
        self.init_exception: ExceptionWrapper | None = None
        self.load_error: ExceptionWrapper | None = None
        self.fetcher = None
        self.dataset = None

    def _where(self) -> str:
        return f"in DataLoader worker process {self.id}"

    def setup(self, payload) -> None:
        cfg = self.cfg
        name_thread = getattr(torch.multiprocessing, "_set_thread_name", None)
        if name_thread is not None:
            name_thread("pt_data_worker")
        torch.set_num_threads(1)
        seed = cfg["base_seed"] + self.id
        random.seed(seed)
        torch.manual_seed(seed)
        np.random.seed(_tw._generate_state(cfg["base_seed"], self.id))
        _collate.install()
        try:
            if isinstance(payload, _procs.FdArg):
                payload = _share.load(payload.take())
            (dataset, self.kind, self.auto_collation, self.collate_fn, self.drop_last,
             self.init_fn) = payload
        except Exception:  # noqa: BLE001 - the answer to every task, like any worker error
            self.load_error = ExceptionWrapper(where=f"{self._where()} (loading the dataset)")
            return
        from torch.utils.data import IterDataPipe
        from torch.utils.data.graph_settings import apply_random_seed
        self.shared_rng = torch.Generator()
        if isinstance(dataset, IterDataPipe):
            self.shared_rng.manual_seed(cfg["shared_seed"])
            dataset = apply_random_seed(dataset, self.shared_rng)
        self.dataset = dataset
        _tw._worker_info = _tw.WorkerInfo(id=self.id, num_workers=cfg["num_workers"],
                                          seed=seed, dataset=dataset)
        try:
            if self.init_fn is not None:
                self.init_fn(self.id)
            self.fetcher = self._fetcher()
        except Exception:  # noqa: BLE001
            self.init_exception = ExceptionWrapper(where=self._where())

    def _fetcher(self):
        from torch.utils.data.dataloader import _DatasetKind
        fetcher = _DatasetKind.create_fetcher(self.kind, self.dataset, self.auto_collation,
                                              self.collate_fn, self.drop_last)
        if _collate.TensorDatasetFetcher.applies(self.dataset, self.kind, self.auto_collation,
                                                 self.collate_fn):
            return _collate.TensorDatasetFetcher(self.dataset, fetcher)
        return fetcher

    def _next(self):
        """The next control message; tasks queued before a resume or quit are dropped (their
        results would be thrown away by the trainer)."""
        try:
            while True:
                self.pending.append(_procs.recv_obj(self.sock, wait=False)[0])
        except (BlockingIOError, InterruptedError):
            pass
        if not self.pending:
            self.pending.append(_procs.recv_obj(self.sock)[0])
        if any(m[0] != "t" for m in self.pending):
            while self.pending[0][0] == "t":
                self.pending.popleft()
        return self.pending.popleft()

    def loop(self) -> None:
        while True:
            try:
                msg = self._next()
            except _procs.Closed:
                return
            kind = msg[0]
            if kind == "q":
                return
            if kind == "r":
                self._resume(msg[1])
            elif kind == "t" and not self.iteration_end:
                self._task(msg[1], msg[2])

    def _resume(self, shared_seed) -> None:
        self.iteration_end = False
        if self.dataset is not None:
            from torch.utils.data import IterDataPipe
            from torch.utils.data.graph_settings import apply_random_seed
            if isinstance(self.dataset, IterDataPipe):
                self.shared_rng.manual_seed(shared_seed)
                self.dataset = apply_random_seed(self.dataset, self.shared_rng)
            try:
                self.fetcher = self._fetcher()
            except Exception:  # noqa: BLE001
                self.init_exception = ExceptionWrapper(where=self._where())
        self._emit((_tw._ResumeIteration(shared_seed), None))

    def _task(self, idx: int, index) -> None:
        arena = self.out.arena()
        _collate.set_arena(arena)
        try:
            data = self._fetch(index)
        finally:
            _collate.set_arena(None)
        self._emit((idx, data), arena)

    def _fetch(self, index):
        if self.load_error is not None:
            return self.load_error
        if self.init_exception is not None:
            data, self.init_exception = self.init_exception, None
            return data
        from torch.utils.data.dataloader import _DatasetKind
        try:
            return self.fetcher.fetch(index)
        except Exception as e:  # noqa: BLE001
            if isinstance(e, StopIteration) and self.kind == _DatasetKind.Iterable:
                self.iteration_end = True
                return _tw._IterableDatasetStopIteration(self.id)
            return ExceptionWrapper(where=self._where())

    def _emit(self, obj, arena: _wire.Arena | None = None) -> None:
        try:
            self.out.send(obj, arena)
        except (_native.PeerDied, _native.Disconnected):
            raise
        except Exception:  # noqa: BLE001 - e.g. a batch that cannot be pickled
            err = ExceptionWrapper(where=f"{self._where()} (sending the batch)")
            self.out.send((obj[0], err), None)

    def close(self) -> None:
        self.out.close()
        self.sock.close()
