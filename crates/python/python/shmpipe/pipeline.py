"""``shmpipe.Pipeline``: a multi-process data pipeline with Python or built-in Rust steps."""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable, Union

from ._native import PipelineRun, builtin_steps
from ._steps import step_spec

Step = Union[Callable[[dict], Any], str, tuple]


class NamedSource:
    """A source registered in Rust (e.g. the time-series loader's), with its arguments."""

    def __init__(self, name: str, args: dict | None = None):
        self.name, self.args = name, args or {}


def _shard(shard) -> tuple[int, int]:
    if shard is None:
        return 0, 1
    if shard == "env":
        try:
            return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        except KeyError as e:
            raise ValueError(f"shard='env' needs the environment variables RANK and WORLD_SIZE "
                             f"(as set by torchrun); {e.args[0]} is not set") from None
    rank, world = shard
    if not 0 <= rank < world:
        raise ValueError(f"shard: rank {rank} is not in 0..{world}")
    return int(rank), int(world)


class Pipeline:
    """Runs ``steps`` over the items of ``source`` in ``workers`` worker processes.

    Iterating the pipeline starts the processes and yields the outputs: flat dicts of numpy
    arrays and int/float/str metadata. Each iteration is a new run over ``epochs`` passes.

    ``source``: a path to a JSON-lines file (one item per line, read by ``emitters``
    processes), a sequence of dicts or any object with ``len`` and indexing (a map-style
    dataset; pickled to the emitter processes, like multiprocessing's spawn), an iterable
    (materialised with ``list`` first), or a :class:`NamedSource`.

    ``steps``: each is a Python callable ``f(item: dict)`` returning a dict (one output),
    ``None`` (no output) or an iterable of dicts (0..n outputs: flat-map); a class (one
    instance per worker; an optional ``finish()`` method returns the outputs still held at the
    end of the stream); or the name of a built-in Rust step (``"name"`` or ``("name", args)``).
    Python steps travel to the worker processes like multiprocessing's spawn targets: by
    module and qualified name. A lambda, a nested function, or a function defined in a notebook
    is refused here with ``ValueError`` (workers could not import it); functions of the main
    script are found by running the script as ``__mp_main__`` in the workers (guard its
    top-level code with ``if __name__ == "__main__":``).

    ``ordered``: outputs in input order (default: as they come). ``shuffle`` with ``seed``: a
    per-epoch permutation plus a shuffle buffer of ``shuffle_buffer`` items. ``epochs``: passes
    over the data (``None``: endless). ``shard``: ``(rank, world_size)`` or ``"env"`` to read
    ``RANK``/``WORLD_SIZE``: this job reads its part of the data only.

    A step's exception is re-raised here as :class:`shmpipe.StepError` (attributes ``step``,
    ``worker``, ``input``, ``message`` with the worker's traceback); a dead worker raises
    :class:`shmpipe.WorkerDied`; Ctrl-C raises ``KeyboardInterrupt``. Every process stops and
    its shared memory is freed when the iteration ends, fails, or :meth:`close` is called; if
    this process is killed, the children exit at once. Channels are anonymous memfds, so
    nothing is ever left in ``/dev/shm``.
    """

    def __init__(self, source: Any, steps: Sequence[Step] = (), workers: int = 2, *,
                 emitters: int = 1, ordered: bool = False, shuffle: bool = False,
                 seed: int = 0, shuffle_buffer: int = 256, epochs: int | None = 1,
                 shard=None, prefetch: int = 8, batch_bytes: int | None = None,
                 skip_bad_records: bool = False, channel: tuple | None = None):
        self._steps = [self._step(s) for s in steps]
        rank, world = _shard(shard)
        self._spec = {
            "workers": workers, "emitters": emitters, "ordered": ordered, "shuffle": shuffle,
            "seed": seed, "shuffle_buffer": shuffle_buffer, "epochs": epochs,
            "rank": rank, "world_size": world, "batch_bytes": batch_bytes,
            "skip_bad_records": skip_bad_records, "channel": list(channel) if channel else None,
            "steps": self._steps,
        }
        self._source = source
        self._prefetch = prefetch
        self._run: PipelineRun | None = None
        self._fd: int | None = None

    @staticmethod
    def _step(s: Step) -> dict:
        if isinstance(s, str):
            s = (s, None)
        if isinstance(s, tuple):
            name, args = s
            if name not in builtin_steps():
                raise ValueError(f"no built-in step {name!r}; built-in steps: {builtin_steps()}")
            return {"name": name, "args": args}
        spec = step_spec(s)
        return {"name": "python", "args": spec}

    def _source_spec(self) -> dict:
        src = self._source
        if isinstance(src, (str, os.PathLike)):
            return {"kind": "jsonl", "path": os.fspath(src)}
        if isinstance(src, NamedSource):
            return {"kind": "named", "name": src.name, "args": src.args}
        if not (hasattr(src, "__len__") and hasattr(src, "__getitem__")):
            if not isinstance(src, Iterable):
                raise TypeError(f"source: a path, a sequence or an iterable, not {src!r}")
            src = list(src)
        main = sys.modules.get("__main__")
        main_path = getattr(main, "__file__", None)
        try:
            blob = pickle.dumps(src)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"the source cannot be sent to the emitter process ({e})") from e
        if b"__main__" not in blob:  # the emitter need not run the main script's imports
            main_path = None
        # A sealed memfd handed to the emitters only (through their control sockets, read-only):
        # nothing on disk or in /dev/shm that a killed parent could leave, and close-on-exec,
        # so no other program this process starts inherits it.
        fd = os.memfd_create("shmpipe-source", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        with os.fdopen(os.dup(fd), "wb") as f:
            pickle.dump((os.path.abspath(main_path) if main_path else None, blob), f)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK
                    | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        self._fd = fd
        return {"kind": "sequence", "fd": fd}

    def _child_args(self) -> list[str]:
        paths = [p for p in sys.path if p]
        # Line-buffered output: a worker ends with a process exit that flushes no Python
        # buffer, so prints of a step must not wait in one.
        # repr, not json.dumps: JSON escapes a character outside the BMP as a surrogate pair,
        # which a Python literal reads as two lone surrogates (issue 16, hole 11).
        code = (f"import sys; sys.path[:0] = {paths!r}; "
                "sys.stdout.reconfigure(line_buffering=True); "
                "sys.stderr.reconfigure(line_buffering=True); "
                "from shmpipe._native import worker_main; worker_main()")
        return ["-c", code]

    def __iter__(self) -> Iterator[dict]:
        self.close()
        spec = dict(self._spec, source=self._source_spec())
        run = PipelineRun.start(json.dumps(spec), sys.executable, self._child_args(),
                                self._prefetch)
        self._run = run
        try:
            yield from run
        finally:
            run.close()
            self._close_fd()

    @property
    def pids(self) -> list[int]:
        """Pids of the running pipeline's processes (empty before iteration)."""
        return self._run.pids if self._run else []

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Stops every process and frees the shared memory of the current run."""
        if self._run is not None:
            self._run.close()
            self._run = None
        self._close_fd()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
