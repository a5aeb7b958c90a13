"""``shmpipe.Pipeline``: a multi-process data pipeline with Python or built-in Rust steps."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable, Union

from ._native import PipelineRun, builtin_steps
from ._steps import fuse, step_spec

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

    Iterating the pipeline starts the processes and yields the outputs. Each iteration is a
    new run over ``epochs`` passes.

    ``source``: a path to a JSON-lines file (one item per line, read by ``emitters``
    processes), a :class:`NamedSource`, or an in-memory source that this process feeds to the
    workers item by item (nothing is pickled or copied up front, so start-up does not grow
    with the data): a sequence (a list, a numpy array: one item per row, any object with
    ``len`` and indexing such as a map-style dataset) or any iterable (a generator is pulled
    only as fast as the workers take its items, never materialised; an iterator is read once,
    so ``epochs=1``; with ``shard`` an iterable's item ``i`` goes to rank ``i % world_size``
    and with ``shuffle`` it is shuffled by the shuffle buffer alone).

    Items are dicts of numpy arrays (any shape and every numeric dtype and bool; large arrays
    cross processes without a copy) and int, float and str values; bool, None, numpy scalars,
    bytes, nested dicts, lists and tuples of those, and items that are not dicts (a row of a
    numpy array, a number) travel too, described in a small metadata field, and come back
    with their types and shapes. Anything else is refused with a ``TypeError`` naming the key.

    ``steps``: each is a Python callable ``f(item)`` returning the output (usually the dict
    it was given), ``None`` (no output) or a list, tuple or generator of outputs (0..n
    outputs: flat-map); a class (one instance per worker; an optional ``finish()`` method
    returns the outputs still held at the end of the stream); or the name of a built-in Rust
    step (``"name"`` or ``("name", args)``). Consecutive Python steps run as one in each
    worker: an item passes from one to the next as the Python object it is.
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
        self._steps = fuse([self._step(s) for s in steps])
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
        if isinstance(src, dict):
            raise TypeError("source: a dict is not a sequence of items; pass a list of "
                            "items (e.g. list(d.values()))")
        if not (hasattr(src, "__len__") and hasattr(src, "__getitem__")
                or isinstance(src, Iterable)):
            raise TypeError(f"source: a path, a sequence or an iterable, not {src!r}")
        # Fed by this process: see PipelineRun.
        return {"kind": "memory"}

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
        source = self._source_spec()
        spec = dict(self._spec, source=source)
        run = PipelineRun.start(json.dumps(spec), sys.executable, self._child_args(),
                                self._prefetch,
                                self._source if source["kind"] == "memory" else None)
        self._run = run
        try:
            yield from run
        finally:
            run.close()

    @property
    def pids(self) -> list[int]:
        """Pids of the running pipeline's processes (empty before iteration)."""
        return self._run.pids if self._run else []

    def close(self) -> None:
        """Stops every process and frees the shared memory of the current run."""
        if self._run is not None:
            self._run.close()
            self._run = None

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
