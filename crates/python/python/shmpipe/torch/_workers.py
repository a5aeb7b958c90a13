"""The worker processes of one loader iterator and the trainer's ends of their connections.

Worker 0 is started before the constructor returns (so that an argument that cannot be
pickled fails there, as with torch); the others are started by a background thread while
the trainer already waits for worker 0's first batch: a fork-server start is a round trip
of tens of milliseconds, and the first batch needs only its own worker. Every worker's
initial tasks are queued on its socket before it starts. ``procs`` (torch's ``_workers``)
waits for the starter, so it is always complete when read.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from typing import Any

from .. import _native
from . import _procs, _worker

_now = time.monotonic


class WorkerChannel:
    """The trainer's ends of one worker: process, control socket, batch channel."""

    def __init__(self, index: int, sock):
        self.index, self.sock = index, sock
        self.proc: Any = None          # a multiprocessing Process, once started
        self.start_error: BaseException | None = None
        self.started = threading.Event()
        self.rx: _native.Receiver | None = None

    def wait_started(self, deadline: float | None) -> None:
        left = None if deadline is None else max(0.0, deadline - _now())
        if not self.started.wait(left):
            raise TimeoutError
        if self.start_error is not None:
            raise RuntimeError(f"DataLoader worker {self.index} could not be started: "
                               f"{self.start_error}") from self.start_error

    def take_channel(self, deadline: float | None, died) -> None:
        """Waits for the worker's next channel descriptor (after its first batch or a
        :class:`_worker.Switch`)."""
        self.wait_started(deadline)
        while True:
            left = None if deadline is None else max(0.0, deadline - _now())
            ready = _procs.readable([self.sock, self.proc.sentinel], left)
            if self.sock in ready:
                try:
                    (kind, arg), fds = _procs.recv_obj(self.sock)
                except (_procs.Closed, ConnectionResetError):
                    raise died() from None
                if kind == "e" and not fds:
                    # The fork server could not import the main script (`_procs.main_failed`).
                    raise RuntimeError(f"DataLoader worker (pid {self.proc.pid}) could not "
                                       f"start: {arg}")
                if kind != "c" or len(fds) != 1:
                    for fd in fds:
                        os.close(fd)
                    raise RuntimeError(f"DataLoader worker (pid {self.proc.pid}) sent an "
                                       f"unexpected control message {kind!r}")
                if self.rx is not None:
                    self.rx.close()
                try:
                    self.rx = _native.Receiver.from_fd(fds[0])
                finally:
                    os.close(fds[0])  # from_fd works on its own duplicate
                return
            if self.proc.sentinel in ready:
                raise died()
            if deadline is not None and _now() >= deadline:
                raise TimeoutError

    def close(self) -> None:
        if self.rx is not None:
            self.rx.close()
            self.rx = None
        self.sock.close()


class WorkerSet:
    """Starts ``n`` workers running :func:`_worker.run` with ``cfg`` (+ ``worker_id``)."""

    def __init__(self, ctx, n: int, cfg: dict, payload, shared_fd: int | None):
        self.chans: list[WorkerChannel] = []
        self._child_socks = []
        for i in range(n):
            psock, csock = _procs.socket_pair()
            self.chans.append(WorkerChannel(i, psock))
            self._child_socks.append(csock)
        # Every worker gets the trainer's environment as it is now (the iterator's start) and
        # its sys.argv, as torch's workers, all started before its iterator is returned, have
        # them (_worker.adopt): a fork server's are older, and workers 1.. start later.
        cfg = dict(cfg, environ=dict(os.environ), argv=list(sys.argv))
        self._ctx, self._cfg, self._payload = ctx, cfg, payload
        self._fds = [os.pidfd_open(os.getpid())] + ([shared_fd] if shared_fd is not None else [])
        self._starter: threading.Thread | None = None
        try:
            self._start_one(0)
        except BaseException:
            self._close_fds()
            raise
        if n > 1:
            self._starter = threading.Thread(target=self._start_rest,
                                             name="shmpipe-worker-starter", daemon=True)
            self._starter.start()
        else:
            self._close_fds()

    def _start_one(self, i: int) -> None:
        ch = self.chans[i]
        cfg = dict(self._cfg, worker_id=i)
        csock = self._child_socks[i]
        w = self._ctx.Process(target=_worker.run,
                              args=(cfg, _procs.FdArg(csock.fileno()), self._payload,
                                    _procs.FdArg(self._fds[0])),
                              daemon=True)
        try:
            w.start()
            ch.proc = w
        except (TypeError, AttributeError, pickle.PicklingError) as e:
            ch.start_error = _unpicklable(e)
            raise ch.start_error from e
        except BaseException as e:
            ch.start_error = e
            raise
        finally:
            csock.close()
            ch.started.set()

    def _start_rest(self) -> None:
        try:
            for i in range(1, len(self.chans)):
                try:
                    self._start_one(i)
                except BaseException:  # noqa: BLE001 - kept in start_error, raised on use
                    for ch in self.chans[i + 1:]:
                        ch.start_error = RuntimeError("an earlier worker failed to start")
                        ch.started.set()
                    return
        finally:
            self._close_fds()

    def _close_fds(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    @property
    def procs(self) -> list:
        """The processes (waits until every start was attempted)."""
        if self._starter is not None:
            self._starter.join()
        return [ch.proc for ch in self.chans if ch.proc is not None]

    def send(self, i: int, msg) -> None:
        try:
            _procs.send_obj(self.chans[i].sock, msg)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise self.died(i) from e

    def died(self, i: int) -> RuntimeError:
        """torch's error for a worker that is gone (with its exit code or signal)."""
        p = self.chans[i].proc
        if p is None:
            return RuntimeError(f"DataLoader worker {i} could not be started")
        p.join(timeout=1.0)
        code = p.exitcode
        if code is not None and code < 0:
            try:
                name = signal.strsignal(-code) or f"signal {-code}"
            except ValueError:
                name = f"signal {-code}"
            return RuntimeError(f"DataLoader worker (pid {p.pid}) is killed by signal: {name}. ")
        if code is not None and code > 0:
            return RuntimeError(
                f"DataLoader worker (pid {p.pid}) exited unexpectedly with exit code {code}. "
                "Details are lost due to multiprocessing. Rerunning with num_workers=0 may "
                "give better error trace.")
        return RuntimeError(f"DataLoader worker (pid(s) {p.pid}) exited unexpectedly")

    def shutdown(self, join_timeout: float) -> None:
        """Asks every worker to quit, closes their connections, joins (then terminates)."""
        if self._starter is not None:
            self._starter.join()
        for ch in self.chans:
            try:
                _procs.send_obj(ch.sock, ("q",))
            except OSError:
                pass
        for ch in self.chans:
            ch.close()
        procs: list[Any] = [ch.proc for ch in self.chans if ch.proc is not None]
        for w in procs:
            w.join(timeout=join_timeout)
        for w in procs:
            if w.is_alive():
                w.terminate()
                w.join(timeout=join_timeout)


def refuse_fileless_main(ctx, objs) -> None:
    """Raises a TypeError naming what ``objs`` (the dataset, ``collate_fn``,
    ``worker_init_fn``) refer to in a ``__main__`` that is no file (a notebook, ``python -c``,
    ``python -``), when the workers are not forks of this process: a fresh worker cannot
    import such a ``__main__``, and would fail to unpickle the dataset ("Can't get
    attribute ...") or die at its start (review: trial 19, finding 3)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if ctx.get_start_method() == "fork" or getattr(main, "__spec__", None) is not None or \
            (path and os.path.isfile(path)):
        return
    found: list[str] = []

    class Finder(pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__"):
                if getattr(obj, "__module__", None) == "__main__" and \
                        obj.__qualname__ not in found:
                    found.append(obj.__qualname__)
            return NotImplemented

    class Sink:
        def write(self, b):
            return len(b)

    try:     # buffers (arrays, tensors) are passed out of band: not copied
        Finder(Sink(), protocol=5, buffer_callback=lambda b: None).dump(objs)
    except Exception:  # noqa: BLE001 - what cannot be pickled fails later, as before
        pass
    if found:
        names = ", ".join(repr(n) for n in found)
        raise TypeError(
            f"shmpipe.torch.DataLoader: the dataset, collate_fn or worker_init_fn use {names}, "
            f"defined in __main__, which has no file here (a notebook, `python -c`, `python -`): "
            f"the workers start as fresh processes (a fork server, never a fork of this "
            f"process) and cannot import it. Pass multiprocessing_context=\"fork\" (what torch "
            f"does by default on Linux), or define them in a module file and import it.")


def _unpicklable(e: BaseException) -> TypeError:
    return TypeError(
        "shmpipe.torch.DataLoader starts its workers as fresh processes (a fork server, "
        "never a fork of this process), so the dataset, collate_fn and worker_init_fn must be "
        f"picklable: {e}. Define them at the top level of a module (not as a lambda, a nested "
        "function or a class inside a function), or pass multiprocessing_context='fork' to "
        "start workers as torch does by default on Linux.")
