"""The fork server as a fork of the trainer itself, made while ``shmpipe.torch`` is imported.

A spawned fork server is a fresh interpreter that must ``import torch`` before it can fork
the first worker: seconds (2.5-8 s on a loaded 2-core machine), all of it on the path to the
first batch of a program that iterates right after its imports. The trainer has torch
already; so at ``import shmpipe.torch`` the trainer forks itself once and the child becomes
multiprocessing's fork server (``multiprocessing.forkserver.main``, the same protocol and
code the spawned server runs), ready in milliseconds. Workers are then forks of that child,
never of the training process as it is later (with its threads, dataset and model).

This is done only when forking is safe at that moment (:func:`unsafe_reason` is None):

- one thread: no Python thread but the main one, and no native thread besides OpenBLAS's
  pool (which OpenBLAS itself shuts down around a fork with ``pthread_atfork``): no lock
  can be held by a thread that does not exist in the child;
- no shared memory mapped (``/memfd:`` or ``/dev/shm`` mappings): the child holds no
  shmpipe channel or other peer's ring, so it can never act on one;
- the trainer is still small: at most :data:`MAX_ANON_MIB` MiB of anonymous memory resident
  (the interpreter with torch takes ~300 MiB, with Lightning and GluonTS ~470 MiB). The
  server keeps every page the trainer held at the fork for the whole run (a dataset loaded
  before the import would stay resident there after the trainer frees or rewrites it), so a
  larger trainer gets the spawned server. ``SHMPIPE_TORCH_FORK_MAX_MB`` sets the limit.

Otherwise (and when ``shmpipe.torch`` is imported later, from a loader) the spawned server
is used as before. In the child, before it serves:

- every inherited descriptor but stdio is pointed at ``/dev/null`` (``dup2``: the numbers
  stay taken, so an inherited Python file object closing "its" descriptor closes nothing
  of ours), so the server keeps no pipe, socket or file of the trainer open;
- Python-level signal handlers go back to their defaults (SIGINT: ``KeyboardInterrupt``,
  as in a fresh interpreter);
- the trainer's ``__main__`` (run up to its ``import shmpipe.torch``) is kept alive but
  replaced, and the main script or module is imported as ``__mp_main__`` as the spawned
  server does (:mod:`._preload`), so that workers find the classes defined after the import;
  any other module whose import was under way (one that imports ``shmpipe.torch`` at its
  top) is dropped from ``sys.modules`` so that workers import it whole;
- every object inherited is frozen out of the garbage collector (``gc.freeze``): neither
  the server nor its workers write to those pages to scan them;
- the child ends with ``os._exit``: the trainer's ``atexit`` handlers never run there. It
  exits when the trainer is gone (EOF on the alive pipe, multiprocessing's own rule).
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import socket
import sys
import threading
import traceback

_OPENBLAS_SYMBOLS = ("openblas_get_num_threads", "openblas_get_num_threads64_",
                     "scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads")

# The trainer's own __main__ module, kept referenced in the server (see the module doc).
_kept: list = []

# Above this much anonymous memory resident (MiB) the trainer does not fork its fork server.
MAX_ANON_MIB = 512
MAX_ANON_ENV = "SHMPIPE_TORCH_FORK_MAX_MB"


def _anon_mib() -> int:
    """The anonymous memory resident in this process (``RssAnon``), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) >> 10
    raise OSError("no RssAnon in /proc/self/status")


def _max_anon_mib() -> int:
    try:
        return int(os.environ.get(MAX_ANON_ENV, MAX_ANON_MIB))
    except ValueError:
        return MAX_ANON_MIB


def _maps() -> list[str]:
    with open("/proc/self/maps") as f:
        return f.read().splitlines()


def _openblas_threads(maps: list[str]) -> int:
    """Threads of the OpenBLAS pools loaded in this process (their size minus the caller)."""
    paths = {line.split(None, 5)[5] for line in maps
             if len(line.split(None, 5)) == 6 and "openblas" in line.rsplit("/", 1)[-1]}
    extra = 0
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _OPENBLAS_SYMBOLS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                extra += max(0, int(fn()) - 1)
                break
    return extra


def unsafe_reason() -> str | None:
    """Why forking this process now would not be safe, or None if it is."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads run"
    try:
        maps = _maps()
        tasks = len(os.listdir("/proc/self/task"))
        anon = _anon_mib()
    except OSError as e:
        return f"/proc is not readable ({e})"
    if anon > _max_anon_mib():
        return f"{anon} MiB of anonymous memory is resident (over {_max_anon_mib()} MiB)"
    if tasks > 1 and tasks > 1 + _openblas_threads(maps):
        return f"{tasks} threads run (not only OpenBLAS's pool)"
    for line in maps:
        if "/memfd:" in line or "/dev/shm/" in line:
            return "shared memory is mapped"
    return None


def start(child_env: dict[str, str]) -> bool:
    """Forks the fork server off this process, if safe; True if it did. ``child_env`` is set
    in the server's environment (and so its workers')."""
    from multiprocessing import connection, resource_tracker, util

    from . import _procs

    fs = _procs._fork_server()      # shmpipe's own, not the process-wide one
    with fs._lock:
        if fs._forkserver_pid is not None or unsafe_reason() is not None:
            return False
        resource_tracker.ensure_running()       # as ForkServer.ensure_running does
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()
            try:
                pid = os.fork()
            except BaseException:
                os.close(alive_r)
                os.close(alive_w)
                raise
            if pid == 0:
                _server(listener.fileno(), alive_r, alive_w, child_env)     # never returns
            os.close(alive_r)
        fs._forkserver_address = address
        fs._forkserver_alive_fd = alive_w
        fs._forkserver_pid = pid
    return True


def _server(listener_fd: int, alive_r: int, alive_w: int, child_env: dict[str, str]) -> None:
    code = 1
    try:
        from multiprocessing import forkserver
        # The fork was made under this lock, which stays taken in the child: a worker that
        # starts a fork-server process of its own must not wait on it for ever.
        forkserver._forkserver._lock = threading.Lock()
        from . import _procs
        _procs._fork_server()._lock = threading.Lock()
        os.close(alive_w)
        os.environ.update(child_env)
        _detach_fds({listener_fd, alive_r})
        _default_signals()
        _drop_half_imported()
        _finish_own_import()
        _import_main()
        from . import _preload  # noqa: F401 - the server's warm-ups (seeds), as when spawned
        gc.freeze()
        forkserver.main(listener_fd, alive_r, [])
        code = 0
    except SystemExit as e:     # forkserver.main's way out when the trainer is gone
        code = e.code if isinstance(e.code, int) else 0
    except BaseException:  # noqa: BLE001 - report, then leave without the trainer's atexit
        traceback.print_exc()
    finally:
        os._exit(code)


def _detach_fds(keep: set[int]) -> None:
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2 or fd in keep or fd == devnull:
            continue
        try:
            os.fstat(fd)
        except OSError:
            continue        # the listing's own descriptor, closed by now
        os.dup2(devnull, fd, inheritable=False)
    os.close(devnull)


def _default_signals() -> None:
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
        if callable(handler) and sig != signal.SIGINT:
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)


def _drop_half_imported() -> None:
    """Forgets the modules whose import was under way when the trainer forked (those whose
    code led to ``import shmpipe.torch``, but this package): in the server they hold only
    what was defined before that line, so they are imported afresh where they are needed
    (the main script at once, others by the workers that unpickle a reference to them)."""
    for name, mod in list(sys.modules.items()):
        spec = getattr(mod, "__spec__", None)
        if name not in ("__main__", __package__) and getattr(spec, "_initializing", False):
            _kept.append(sys.modules.pop(name))


def _finish_own_import() -> None:
    """What the import system does when ``import shmpipe.torch`` returns, done in the server
    (where it never returns): the fork is the package's last statement, so it is whole."""
    mod = sys.modules[__package__]
    mod.__spec__._initializing = False
    parent, _, child = __package__.rpartition(".")
    setattr(sys.modules[parent], child, mod)


def _import_main() -> None:
    """Replaces the trainer's half-run ``__main__`` by the main script or module imported as
    ``__mp_main__`` (what a spawned server and ``spawn`` workers see)."""
    import types
    from multiprocessing import process, spawn

    data = spawn.get_preparation_data("shmpipe-fork-server")
    main = {k: v for k, v in data.items() if k in ("init_main_from_path",
                                                   "init_main_from_name")}
    if not os.path.isfile(main.get("init_main_from_path", "/")):
        main.pop("init_main_from_path", None)   # `python -`: '<stdin>' is no file to import
    _kept.append(sys.modules["__main__"])
    sys.modules["__main__"] = types.ModuleType("__mp_main__")
    if not main:
        return
    process.current_process()._inheriting = True
    try:
        spawn.prepare(main)
    except Exception as e:  # noqa: BLE001 - the workers will say what is wrong
        where = main.get("init_main_from_path") or main.get("init_main_from_name")
        print(f"shmpipe.torch: the fork server could not import the main script {where} "
              f"({type(e).__name__}: {e}); each worker will import it itself. Keep the "
              f"script's work under `if __name__ == \"__main__\":`.", file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - sys.exit(), KeyboardInterrupt: see main_failed
        from . import _procs
        _procs.main_failed(e, main.get("init_main_from_path"), main.get("init_main_from_name"))
    finally:
        del process.current_process()._inheriting
