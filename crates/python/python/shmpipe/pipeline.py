"""``shmpipe.Pipeline``: a multi-process data pipeline with Python or built-in Rust steps."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Callable, Union

from . import _options
from ._closing import Closing
from ._native import PipelineRun, builtin_steps
from ._native import item_seed as _item_seed
from ._steps import fuse, step_spec

if TYPE_CHECKING:
    import numpy as np

Step = Union[Callable[[dict], Any], str, tuple]


class NamedSource:
    """A source registered in Rust (e.g. the time-series loader's), with its arguments."""

    def __init__(self, name: str, args: dict | None = None):
        self.name, self.args = name, args or {}


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """A step as the Rust side builds it: a registry name and its arguments (JSON)."""

    name: str
    args: str


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """Where a run's items come from: ``"jsonl"`` (``path``), ``"named"`` (``name``, ``args``
    as JSON) or ``"object"`` (an in-memory source this process reads)."""

    kind: str
    path: str | None = None
    name: str | None = None
    args: str | None = None


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What ``PipelineRun.start`` reads (``src/run_spec.rs``, by attribute): the checked
    arguments of :class:`Pipeline`, whose signature holds every default."""

    workers: int
    emitters: int
    ordered: bool
    shuffle: bool
    seed: int
    shuffle_buffer: int
    epochs: int | None
    rank: int
    world_size: int
    batch_bytes: int | None
    skip_bad_records: bool
    channel: list[int] | None
    steps: list[StepSpec]
    max_in_flight: int
    warn_idle: float | None
    prefetch: int
    source: SourceSpec | None = None
    feed: SourceSpec | None = None


def _shard(shard) -> tuple[int, int]:
    if shard is None:
        return 0, 1
    if shard == "env":
        try:
            return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        except KeyError as e:
            raise ValueError(f"shard='env' needs the environment variables RANK and WORLD_SIZE "
                             f"(as set by torchrun); {e.args[0]} is not set") from None
    if isinstance(shard, str) or not hasattr(shard, "__len__") or len(shard) != 2:
        raise TypeError(f"shard={shard!r}: (rank, world_size) or 'env'")
    rank = _options.whole("shard", shard[0])
    world = _options.whole("shard", shard[1], least=1, most=_options.U64[1])
    if not 0 <= rank < world:
        raise ValueError(f"shard=({rank}, {world}): (rank, world_size), and the rank must be "
                         f"in 0..{world - 1}")
    return int(rank), int(world)


def workers_alias(workers: Any, num_workers: Any, *, default: int) -> Any:
    """``workers=``, or its alias ``num_workers=`` (the name of ``torch.utils.data.DataLoader``
    and ``shmpipe.torch``), or ``default`` when neither is given; a ``TypeError`` naming both
    when both are."""
    if workers is not None and num_workers is not None:
        raise TypeError(f"workers={workers!r} and num_workers={num_workers!r}: pass one of "
                        f"them (num_workers= is an alias of workers=)")
    if workers is None:
        workers = num_workers
    return default if workers is None else workers


def _is_step(s: Any) -> bool:
    if isinstance(s, str):
        return s in builtin_steps()
    if isinstance(s, tuple):
        return len(s) == 2 and isinstance(s[0], str) and s[0] in builtin_steps()
    return callable(s)


def _looks_like_steps(x: Any) -> bool:
    """``Pipeline(steps, workers=4)``: a non-empty list or tuple of steps, no data."""
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(_is_step(s) for s in x)


def _warn_idle(secs: float | None) -> float | None:
    """``warn_idle=`` in seconds, ``None`` for never (0 and infinity too); a ``ValueError``
    naming it for NaN or a negative number."""
    if secs is None or secs == float("inf") or secs == 0:
        return None
    secs = float(secs)
    if not secs >= 0:
        raise ValueError(f"warn_idle={secs}: seconds, a number >= 0 (0, None or "
                         f"float('inf'): never warn)")
    return secs


class Pipeline(Closing):
    """Runs ``steps`` in ``workers`` worker processes, over the items of ``source`` or over the
    items you :meth:`enqueue`. ``workers`` defaults to 2; ``num_workers=`` is an alias (the
    name ``shmpipe.torch`` and ``torch.utils.data.DataLoader`` use; not both).

    Two ways to use it:

    - **Iterate** ``Pipeline(source, steps, ...)``: the outputs of every item of the source,
      ``epochs`` times over. Each iteration starts the processes and stops them at its end,
      unless the workers are persistent (below).
    - **Enqueue and dequeue** with ``Pipeline(steps, ...)`` (no source)::

          p = shmpipe.Pipeline([add_1, add_1], workers=4)
          p.start()
          p.enqueue(3)
          assert p.dequeue() == 5
          p.close_input()          # no more input: the end comes after the last output
          assert p.dequeue() is None
          p.close()

      :meth:`dequeue` returns ``None`` at the end of stream (after :meth:`close_input`, once
      every output of everything enqueued was returned), and again on every later call; no
      output is ever ``None`` (a step that returns ``None`` has no output), so
      ``for out in iter(p.dequeue, None)`` reads to the end, and so does ``for out in p``.
      ``dequeue(timeout=s)`` raises ``TimeoutError`` after ``s`` seconds without an output;
      the pipeline runs on. A :meth:`dequeue` that has waited ``warn_idle`` seconds (default
      5; 0, ``None`` or ``float('inf')``: never) while nothing is enqueued and the input is open says once on stderr that
      :meth:`enqueue` or :meth:`close_input` may be missing; so does iterating it (``for out
      in p`` yields the outputs of :meth:`enqueue`, and waits while another thread may still
      enqueue).

      **Back-pressure**: at most ``max_in_flight`` inputs are in the pipeline at once
      (enqueued, with outputs not yet dequeued; default ``4 * prefetch * workers``). A full
      pipeline makes :meth:`enqueue` wait while another thread dequeues (and raise
      ``TimeoutError`` after ``timeout=`` seconds). If no other thread dequeues (the
      calling thread is the one that dequeues, or nobody has yet), waiting could never end:
      :meth:`enqueue` then takes outputs out of the pipeline itself and keeps them, in
      order, for the next :meth:`dequeue`. So a single thread may enqueue any number of
      items before dequeuing: it never deadlocks, and the worker processes never hold more
      than ``max_in_flight`` inputs; the outputs it has not dequeued wait in this process's
      memory.

    Items and outputs are dicts of numpy arrays (any shape, 0-d included, every numeric dtype
    and bool; large arrays cross processes without a copy) and int, float and str values;
    bool, None, numpy scalars, bytes, nested dicts, lists and tuples of those, and items that
    are not dicts (``p.enqueue(3)``, a row of a numpy array) travel too, described in a small
    metadata field, and come back with their types and shapes. Anything else is refused with
    a ``TypeError`` naming the key.

    ``source``: a path to a JSON-lines file (one item per line, read by ``emitters``
    processes), a :class:`NamedSource`, or an in-memory source that this process feeds to the
    workers item by item (nothing is pickled or copied up front, so start-up does not grow
    with the data): a sequence (a list, a numpy array: one item per row, any object with
    ``len`` and indexing such as a map-style dataset) or any iterable (a generator is pulled
    only as fast as the workers take its items, never materialised; an iterator is read once,
    so ``epochs=1``; with ``shard`` an iterable's item ``i`` goes to rank ``i % world_size``
    and with ``shuffle`` it is shuffled by the shuffle buffer alone).

    ``steps``: each is a Python callable ``f(item)`` returning ``None`` (no output), a dict or
    any other value (one output; a string, a number or a numpy array is one output), or a
    list, tuple, generator or other iterable (0..n outputs: flat-map; to output a list as
    one value, return ``[the_list]``); a class (one instance per worker; an optional
    ``finish()`` method returns the outputs still held at the end of the stream); or the
    name of a built-in Rust step (``"name"`` or ``("name", args)``). Consecutive Python steps
    run as one in each worker: an item passes from one to the next as the Python object it
    is (each still has its own item seed and is named in errors). Python steps travel to
    the worker processes like multiprocessing's spawn targets: by module and qualified name.
    A lambda, a nested function, or a function defined in a notebook is refused here with
    ``ValueError`` (workers could not import it); functions of the main script are found by
    running the script as ``__mp_main__`` in the workers (guard its top-level code with
    ``if __name__ == "__main__":``).

    ``workers=0`` runs the steps in this process, in the thread that dequeues (or iterates),
    one input at a time: a ``breakpoint()`` in a step stops there, ``pdb.pm()`` after a
    :class:`shmpipe.StepError` reaches the step's own exception (it is the error's
    ``__cause__``). Outputs are those of ``ordered=True`` with any number of workers; errors
    are the same types. The source is read by this process.

    **Persistent workers**: with ``persistent_workers=True``, or after :meth:`start`, a
    pipeline with a source keeps its worker processes between iterations (like torch's
    ``persistent_workers``): each iteration is ``epochs`` more passes (each epoch with its
    own permutation when shuffling), and :meth:`close` (or the ``with`` block's end) stops
    them. This process then reads the source and feeds the workers itself (``emitters`` is
    not used); the records and their order are those of one emitter. Leaving an iteration
    early drops the rest of its epoch when the next one starts.

    Items of any size travel (arrays larger than a pool block go zero-copy into memory taken
    for them and given back after); ``channel=(slots, blocks, block_size, large_pool)`` tunes
    the shared-memory channels (``large_pool=0`` limits every array to one block).

    ``ordered``: outputs in input order (default: as they come). ``shuffle`` with ``seed``: a
    per-epoch permutation plus a shuffle buffer of ``shuffle_buffer`` items. ``epochs``:
    passes over the data (``None``: endless, but an epoch whose source gives no item ends
    it, as GluonTS's ``Cyclic`` does: an empty source or a used-up generator; an epoch whose
    items a step holds, giving no output yet, does not). ``shard``:
    ``(rank, world_size)`` or ``"env"`` to read ``RANK``/``WORLD_SIZE``: this job reads its
    part of the data only.

    **Seeds**: randomness in a step should come from :func:`shmpipe.item_rng`, a numpy
    generator seeded from ``seed`` and the input being processed (its position in the
    stream, and the step's position in ``steps``), never from the worker: the same ``seed``
    then gives the same outputs for any number of workers (``workers=0`` included), as a
    multiset, and in the same order with ``ordered=True``. (Outputs of a class's
    ``finish()`` depend on what its worker saw, and so on the worker count.)

    A step's exception is re-raised here as :class:`shmpipe.StepError` (attributes ``step``,
    the callable's name; ``worker``, ``None`` with ``workers=0``; ``record``, the failing
    input's index among the items this process fed or enqueued, or in an emitter's part of a
    file; ``input``, that in words; ``message``, the worker's traceback), by the iteration or by
    :meth:`dequeue`, and by every later call; a dead worker raises
    :class:`shmpipe.WorkerDied` within about a second (also from a waiting :meth:`enqueue`);
    Ctrl-C raises ``KeyboardInterrupt`` and stops the processes. Every process stops and its
    shared memory is freed when the iteration ends or fails, or at :meth:`close` / the end of
    a ``with`` block; if this process is killed, the children exit at once. Channels are
    anonymous memfds, so nothing is ever left in ``/dev/shm``.
    """

    def __init__(self, source: Any = None, steps: Sequence[Step] = (),
                 workers: int | None = None, *,
                 emitters: int = 1, ordered: bool = False, shuffle: bool = False,
                 seed: int = 0, shuffle_buffer: int = 256, epochs: int | None = 1,
                 shard: tuple[int, int] | str | None = None, prefetch: int = 8,
                 batch_bytes: int | None = None, skip_bad_records: bool = False,
                 channel: tuple[int, ...] | None = None, persistent_workers: bool = False,
                 max_in_flight: int | None = None, warn_idle: float | None = 5.0,
                 num_workers: int | None = None):
        workers = workers_alias(workers, num_workers, default=2)
        if not steps and _looks_like_steps(source):
            source, steps = None, source
        workers = _options.whole("workers", workers, most=_options.MAX_PROCS)
        prefetch = _options.whole("prefetch", prefetch, least=1, most=_options.MAX_PREFETCH)
        if max_in_flight is None:
            max_in_flight = 4 * prefetch * max(workers, 1)
        rank, world = _shard(shard)
        if isinstance(source, (str, os.PathLike)):
            source = _options.existing_file("source", source)
        self._spec = RunSpec(
            workers=workers,
            emitters=_options.whole("emitters", emitters, least=1, most=_options.MAX_PROCS),
            ordered=bool(ordered), shuffle=bool(shuffle),
            seed=_options.whole("seed", seed, most=_options.SEED[1]),
            shuffle_buffer=_options.whole("shuffle_buffer", shuffle_buffer, least=1,
                                          most=_options.MAX_SHUFFLE_BUFFER),
            epochs=_options.whole("epochs", epochs, least=1, most=_options.U64[1],
                                  none_ok=True),
            rank=rank, world_size=world,
            batch_bytes=_options.whole("batch_bytes", batch_bytes, least=1,
                                       most=_options.MAX_BATCH_BYTES, none_ok=True),
            skip_bad_records=bool(skip_bad_records), channel=_options.channel(channel),
            steps=fuse([self._step(s) for s in steps]),
            max_in_flight=_options.whole("max_in_flight", max_in_flight, least=1,
                                         most=_options.U64[1]),
            warn_idle=_warn_idle(warn_idle), prefetch=prefetch)
        self._source = source
        self._persistent = persistent_workers
        self._run: PipelineRun | None = None
        self._epoch = 0  # the next epoch of a source this process reads
        self._closed = False
        # Several threads may enqueue and dequeue: one of them starts the processes.
        self._start_lock = threading.Lock()

    @staticmethod
    def _step(s: Step) -> StepSpec:
        if isinstance(s, str):
            s = (s, None)
        if isinstance(s, tuple):
            name, args = s
            if name not in builtin_steps():
                raise ValueError(f"no built-in step {name!r}; built-in steps: {builtin_steps()}")
            return StepSpec(name, json.dumps(args))
        return StepSpec("python", json.dumps(step_spec(s)))

    def _source_spec(self) -> SourceSpec:
        """A source read by emitter processes: a path or a named source."""
        src = self._source
        if isinstance(src, (str, os.PathLike)):
            return SourceSpec("jsonl", path=os.fspath(src))
        assert isinstance(src, NamedSource)
        return SourceSpec("named", name=src.name, args=json.dumps(src.args))

    def _in_memory(self) -> bool:
        src = self._source
        return src is not None and not isinstance(src, (str, os.PathLike, NamedSource))

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

    def _start_run(self, spec: RunSpec, feed: Any = None) -> PipelineRun:
        return PipelineRun.start(spec, sys.executable, self._child_args(), feed)

    def _feed_spec(self) -> tuple[SourceSpec, Any]:
        """The source as this process reads it (in-memory sources, persistent workers,
        ``workers=0``): an in-memory source is read item by item (never pickled, never
        materialised with ``list``)."""
        src = self._source
        if isinstance(src, (str, os.PathLike, NamedSource)):
            return self._source_spec(), None
        if isinstance(src, dict):
            raise TypeError("source: a dict is not a sequence of items; pass a list of "
                            "items (e.g. list(d.values()))")
        if not (hasattr(src, "__len__") and hasattr(src, "__getitem__")
                or isinstance(src, Iterable)):
            raise TypeError(f"source: a path, a sequence or an iterable, not {src!r}")
        return SourceSpec("object"), src

    def _feeding(self) -> bool:
        """This process reads the source: an in-memory one always, any with persistent
        workers or ``workers=0``."""
        return self._source is not None and (self._in_memory() or self._persistent
                                             or self._spec.workers == 0)

    def start(self) -> "Pipeline":
        """Starts the worker processes now, and returns the pipeline.

        Without a source: the pipeline then takes :meth:`enqueue` (which also starts it).
        With a source: the workers become persistent, serving every later iteration until
        :meth:`close`. Starting a started pipeline does nothing.
        """
        with self._start_lock:
            self._check_not_closed()
            if self._source is None:
                if self._run is None:
                    self._run = self._start_run(self._spec)
            elif self._run is None or not self._persistent:
                self.close()
                self._persistent = True
                self._start_fed_once()
        return self

    def _check_not_closed(self) -> None:
        if self._closed:
            raise ValueError("the pipeline is closed")

    def _enqueue_run(self) -> PipelineRun:
        run = self._run
        if run is not None and self._source is None:
            return run
        if self._source is not None:
            raise ValueError("enqueue and dequeue need a pipeline without a source: "
                             "Pipeline(steps, workers=...); a pipeline with a source is "
                             "iterated")
        self.start()
        assert self._run is not None
        return self._run

    def enqueue(self, item: Any, timeout: float | None = None) -> None:
        """Feeds one item (a dict, or any value) to the pipeline.

        Returns at once while fewer than ``max_in_flight`` inputs are in the pipeline;
        otherwise waits for room (see the class doc, *back-pressure*), up to ``timeout``
        seconds (``None``: no limit), then raises ``TimeoutError``. Raises ``ValueError``
        after :meth:`close_input` or :meth:`close`, and the pipeline's failure
        (:class:`shmpipe.StepError`, :class:`shmpipe.WorkerDied`, ...) once it failed.
        """
        self._enqueue_run().enqueue(item, timeout)

    def enqueue_many(self, items: Iterable[Any], timeout: float | None = None) -> None:
        """:meth:`enqueue` of every item of ``items`` in turn (``timeout`` for each)."""
        run = self._enqueue_run()
        for it in items:
            run.enqueue(it, timeout)

    def close_input(self) -> None:
        """No more input: the stream ends after the outputs of everything enqueued, and
        :meth:`dequeue` then returns ``None``."""
        self._enqueue_run().close_input()

    def dequeue(self, timeout: float | None = None) -> Any:
        """The next output, or ``None`` at the end of stream (and on every later call).

        Waits up to ``timeout`` seconds (``None``: no limit), then raises ``TimeoutError``
        (the pipeline runs on). Outputs come in input order with ``ordered=True``. A step's
        exception is raised as :class:`shmpipe.StepError`, a dead worker as
        :class:`shmpipe.WorkerDied`; after a failure every call raises it again.
        """
        return self._enqueue_run().dequeue(timeout)

    @property
    def pending(self) -> int:
        """Inputs enqueued (or fed from the source) whose outputs have not all been
        returned yet."""
        return self._run.pending if self._run else 0

    def __iter__(self) -> Iterator[Any]:
        if self._source is None:
            # Enqueue mode: the outputs, to the end of stream.
            yield from self._enqueue_run()
            return
        if self._feeding():
            yield from self._iter_fed()
            return
        self.close()
        self._closed = False
        run = self._start_run(dataclasses.replace(self._spec, source=self._source_spec()))
        self._run = run
        try:
            yield from run
        finally:
            run.close()

    def _iter_fed(self) -> Iterator[Any]:
        """Epochs of a source read by this process: persistent workers, or ``workers=0``."""
        persistent = self._persistent
        if persistent:
            self.start()
        else:
            self._epoch = 0
            self._start_fed_once()
        run = self._run
        assert run is not None
        epochs = self._spec.epochs
        try:
            n = 0
            while epochs is None or n < epochs:
                run.start_epoch(self._epoch)
                self._epoch += 1
                n += 1
                fed = run.fed
                while (out := run.next_in_epoch()) is not None:
                    yield out
                if epochs is None and run.fed == fed:
                    # Endless epochs of a source that gives nothing (empty, or a generator
                    # already used up) would spin for ever: they end, as GluonTS's Cyclic does.
                    # Not an epoch whose inputs gave no output: a step may hold them (a
                    # batching step gives its batch in a later epoch).
                    break
            if not persistent:
                # The end of stream: what the steps' finish() still holds.
                run.close_input()
                yield from run
        finally:
            if not persistent:
                run.close()
                self._run = None

    def _start_fed_once(self) -> None:
        feed, obj = self._feed_spec()
        self._run = self._start_run(dataclasses.replace(self._spec, feed=feed), obj)

    @property
    def pids(self) -> list[int]:
        """Pids of the running pipeline's processes (empty before it starts, and with
        ``workers=0``)."""
        return self._run.pids if self._run else []

    def close(self) -> None:
        """Stops every process and frees the shared memory of the current run. A pipeline
        without a source cannot be used after it; one with a source starts anew (persistent
        workers: new ones) when it is iterated again. Any thread may call it, several at once.

        In a process forked from the one that started the run (``os.fork``,
        ``multiprocessing``'s fork start method) it does nothing to the run, nor does the
        garbage collection of the copy: the processes are the parent's. There, iterating the
        copy, :meth:`enqueue` and :meth:`dequeue` raise :class:`shmpipe.PipelineError`; a
        pipeline with a source may be iterated anew (that starts the child's own run)."""
        run = getattr(self, "_run", None)
        if run is not None:
            self._run = None
            run.close()
        if getattr(self, "_source", False) is None:
            self._closed = True



_rng = threading.local()


def item_seed() -> int:
    """The seed of the input the calling step processes (see :func:`item_rng`)."""
    s = _item_seed()
    if s is None:
        raise RuntimeError("shmpipe.item_rng() / item_seed() work inside a step: they are "
                           "defined while a pipeline step processes an input")
    return s


def item_rng() -> np.random.Generator:
    """A numpy generator for the input the calling step processes.

    Seeded from the pipeline's ``seed``, the input's position in the stream (over all
    epochs) and the step's position in ``steps``: never from the worker, so a seed gives the
    same outputs with any number of workers. Every call during one input's step returns the
    same generator (each output of a flat-map draws on from where the previous stopped).
    Raises ``RuntimeError`` outside a step.
    """
    s = item_seed()
    cached = getattr(_rng, "cached", None)
    if cached is None or cached[0] != s:
        import numpy

        cached = (s, numpy.random.default_rng(s))
        _rng.cached = cached
    return cached[1]
