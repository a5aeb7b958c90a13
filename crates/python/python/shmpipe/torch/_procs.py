"""Starting worker processes and talking to them: the start method, descriptors handed to a
child, and the control socket (tasks one way, channel descriptors the other).

Workers are started by a *fork server* that has torch imported and forks one child per
worker: a worker is then ready in ~20 ms instead of the seconds a fresh ``import torch``
takes, and no worker is ever a fork of the (multithreaded) training process. The server
is made when :mod:`shmpipe.torch` is imported: a fork of the trainer at that moment if it
is single-threaded then (:mod:`._forked`, ready at once), else a fresh interpreter that
imports torch in the background (usually ready by the time the first loader iterates).
"""

from __future__ import annotations

import array
import json
import multiprocessing
import os
import pickle
import socket
import sys
from multiprocessing import connection, reduction

# Set in the environment of the fork server (and so of every worker): a process started by
# us does not start a fork server of its own.
CHILD_ENV = "SHMPIPE_TORCH_CHILD"
# `SHMPIPE_TORCH_EAGER=0` in the environment: start the fork server at the first loader
# with workers instead of at import.
EAGER_ENV = "SHMPIPE_TORCH_EAGER"

# `SHMPIPE_TORCH_FORK=0` in the environment: never make the fork server by forking this
# process at import (see _forked.py); spawn it as a fresh interpreter.
FORK_ENV = "SHMPIPE_TORCH_FORK"

# The path of the trainer's main script, for the fork server to import it (see _preload.py).
MAIN_ENV = "SHMPIPE_TORCH_MAIN"
# The trainer's sys.argv (JSON), set in the fork server before it imports the main script: a
# module-level argparse there parses the trainer's arguments, as under spawn.
ARGV_ENV = "SHMPIPE_TORCH_ARGV"

PRELOAD = ["shmpipe.torch._preload"]

# Set in the fork server (and so in every worker forked from it) when importing the trainer's
# main script raised what is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``):
# what each worker tells the trainer instead of running (see :func:`main_failed`).
main_error: str | None = None

_warmed = False


def in_worker() -> bool:
    """Whether this process is a worker (or the fork server), of ours or of multiprocessing."""
    return (os.environ.get(CHILD_ENV) == "1" or multiprocessing.parent_process() is not None
            or getattr(multiprocessing.current_process(), "_inheriting", False))


def _fork_server():
    """The fork server (multiprocessing's ``ForkServer`` object) the workers come from:
    shmpipe's own (:mod:`._context`), never the program's process-wide one."""
    from ._context import SERVER
    return SERVER


def warm_up(fork: bool = False) -> None:
    """Starts the fork server now (in the background) so that workers start in ~20 ms.

    Called when :mod:`shmpipe.torch` is imported (``fork=True``: the server is then a fork
    of this process if that is safe, see :mod:`._forked`) and again by every loader with
    workers; cheap after the first call. The server is shmpipe's own (:mod:`._context`),
    never the program's process-wide one.
    """
    global _warmed
    if _warmed or in_worker():
        return
    _warmed = True
    fs = _fork_server()

    if fork and os.environ.get(FORK_ENV, "1") != "0":
        from . import _forked
        if _forked.start({CHILD_ENV: "1"}):
            return

    fs.set_forkserver_preload(PRELOAD)
    env = {CHILD_ENV: "1", MAIN_ENV: _main_path(), ARGV_ENV: json.dumps(sys.argv)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        fs.ensure_running()
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def main_failed(e: BaseException, path: str | None = None, name: str | None = None) -> None:
    """In the fork server: importing the trainer's main script (``path``, or module ``name``)
    raised ``e``, which is no ``Exception`` (``sys.exit()`` or ``raise KeyboardInterrupt`` at
    its top level, outside the main guard). Before, the server died of it and the trainer got
    a bare ``EOFError`` (review 18, hole 2). The server lives on: the error is kept in
    :data:`main_error` for every worker to send to the trainer, which raises it; ``__main__``
    becomes an empty module standing for the script, so that workers do not run it again."""
    global main_error
    import importlib.machinery
    import types

    what = type(e).__name__
    if e.args:
        what += "(" + ", ".join(repr(a) for a in e.args) + ")"
    main_error = (f"importing __main__ ({path or name}) in the worker process raised {what}: "
                  f"guard the training code with `if __name__ == '__main__':` (the workers "
                  f"import the script, as under the spawn start method)")
    stand_in = types.ModuleType("__mp_main__")
    if path:
        stand_in.__file__ = path
    if name:
        stand_in.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = stand_in


def _main_path() -> str:
    """The main script's path if it was run as a file (``python train.py``), else ""."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is not None or not path or not os.path.isfile(path):
        return ""
    return os.path.abspath(path)


def context(user_ctx):
    """The multiprocessing context workers start with: the loader's ``multiprocessing_context``
    if given (a context object, as ``DataLoader`` stores it), else the fork server. A
    "forkserver" context means ours too (torch preloaded), never the program's own server.

    The global start method is not consulted: torch's own loaders fix it to ``fork`` as a
    side effect, so it does not tell what the program asked for."""
    if user_ctx is not None and user_ctx.get_start_method() != "forkserver":
        return user_ctx
    from ._context import CONTEXT
    warm_up()
    return CONTEXT


class FdArg:
    """A descriptor handed to a worker in ``Process(args=...)``.

    Under spawn and forkserver the argument is pickled while the process starts and the
    descriptor travels with it (``reduction.DupFd``, as multiprocessing does for its own
    pipes); under fork it is not pickled and the child inherits the same number.
    """

    def __init__(self, fd: int):
        self._fd = fd

    def take(self) -> int:
        return self._fd

    def __reduce__(self):
        return (_rebuild_fd, (reduction.DupFd(self._fd),))


def _rebuild_fd(dup) -> FdArg:
    return FdArg(dup.detach())


# Control messages: one datagram each on a SOCK_SEQPACKET socket pair, a pickle behind a
# one-byte flag (1: more fragments follow). Tasks are tiny; a huge index list (a batch
# sampler yielding millions of keys) is cut into fragments instead of failing.
_FRAG = 64 * 1024
_MORE, _LAST = b"\x01", b"\x00"


def socket_pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send_obj(sock: socket.socket, obj, fds: tuple[int, ...] = ()) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    views = [data[i:i + _FRAG] for i in range(0, len(data), _FRAG)] or [b""]
    for i, part in enumerate(views):
        flag = _MORE if i + 1 < len(views) else _LAST
        if i == 0 and fds:
            socket.send_fds(sock, [flag + part], list(fds))
        else:
            sock.sendall(flag + part)


class Closed(EOFError):
    """The other end of the control socket is gone."""


def recv_obj(sock: socket.socket, wait: bool = True):
    """The next message and the descriptors that came with it; raises :class:`Closed` at EOF
    (and ``BlockingIOError`` if ``wait`` is False and there is none)."""
    parts, fds = [], []
    flags = 0 if wait else socket.MSG_DONTWAIT
    while True:
        data, got = _recv_fds(sock, flags)
        flags = 0       # the fragments of a message follow it at once
        fds.extend(got)
        if not data:
            for fd in fds:
                os.close(fd)
            raise Closed("control socket closed")
        parts.append(data[1:])
        if data[:1] == _LAST:
            return pickle.loads(b"".join(parts)), fds


_FD_SPACE = socket.CMSG_SPACE(4 * array.array("i").itemsize)


def _recv_fds(sock: socket.socket, flags: int) -> tuple[bytes, list[int]]:
    """One datagram and the descriptors passed with it. (``socket.recv_fds`` ignores its
    ``flags`` argument in Python 3.11, so ``MSG_DONTWAIT`` would block there.)"""
    data, ancdata, _flags, _addr = sock.recvmsg(_FRAG + 1, _FD_SPACE, flags)
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def readable(objs, timeout):
    """The subset of sockets / sentinels ready within ``timeout`` seconds (None: forever)."""
    return connection.wait(objs, timeout)


