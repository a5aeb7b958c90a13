"""``TrainDataLoader``, ``ValidationDataLoader``, ``InferenceDataLoader``: GluonTS's loaders
with the transformation in shmpipe worker processes."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Callable, Optional

import numpy as np

from .. import _options
from .._closing import Closing
from .._native import ShmpipeError
from ..pipeline import Pipeline
from . import _batch, _fast, _guard, _source
from ._step import raise_error


def _identity():
    from gluonts.transform import Identity

    return Identity()


def _default_seed(seed: Optional[int]) -> int:
    # Like GluonTS, whose windows come from numpy's global generator: seeding numpy
    # (np.random.seed, lightning's seed_everything) before building the loader fixes them.
    if seed is None:
        return int(np.random.randint(0, 2**31 - 1))
    checked = _options.whole("seed", seed, most=_options.SEED[1])
    assert checked is not None
    return checked


class _Loader(Closing):
    """What the three loaders share: the plan (fast path or Python workers) and decoding."""

    _train = True

    def __init__(self, dataset: Any, *, transform: Any, batch_size: int, stack_fn: Callable,
                 num_workers: int, seed: Optional[int], fast_path: bool,
                 shuffle_buffer_length: Optional[int] = None):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size= must be a positive integer, not {batch_size!r}")
        _options.whole("batch_size", batch_size, least=1, most=_options.MAX_BATCH_SIZE)
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers= must be 0 or more, not {num_workers!r}")
        self.dataset, self.transform = dataset, transform if transform is not None else _identity()
        self.batch_size, self.stack_fn = batch_size, stack_fn
        self.num_workers, self.seed = num_workers, _default_seed(seed)
        self.shuffle_buffer_length = shuffle_buffer_length
        self._stack = _batch.Stacker(stack_fn)
        self._fast: Optional[_fast.FastPlan] = None
        self.why_not_fast = "fast_path=False" if not fast_path else "num_workers=0"
        if num_workers == 0:
            return
        source, fns, stages, cached = _source.plan(dataset)
        stages = stages + [(self.transform, self._is_train)]
        self._files = source.data if source.kind == _source.LINES else None
        self._fns, self._stages = fns, stages
        # GluonTS's check for a stream without windows (training only: one pass ends).
        self._idle = _guard.idle_limit(stages) if self._train else (0, None)
        if fast_path:
            try:
                self._fast, self.why_not_fast = _fast.plan(
                    source, fns, stages, mode=self._mode, batch_size=batch_size,
                    seed=self.seed, num_workers=num_workers,
                    shuffle_buffer_length=shuffle_buffer_length)
            except Exception as e:  # noqa: BLE001 - the data's error: raised when read, below
                # GluonTS reads nothing before the iteration; the workers raise it then,
                # with GluonTS's type and the file and line.
                self.why_not_fast = f"the first entries do not read ({type(e).__name__}: {e})"
            if self._fast is not None:
                return
        self._source = _guard.Counted.of(source.configured(
            shuffle_buffer_length if self._train else None, self.seed))
        files = [f[0] for f in source.data] if source.kind == _source.LINES else None
        self._step = _guard.CountingStep(
            source.kind, fns, stages, seed=self.seed, batch_size=batch_size,
            batch_in_worker=self._train, cached=cached, native=fast_path,
            idle_limit=self._idle[0], files=files)

    @property
    def fast_path(self) -> bool:
        """Whether the batches come from the Rust chain (``crates/timeseries``); if not,
        ``why_not_fast`` says which part of the chain or data it does not have."""
        return self._fast is not None

    def _pipeline(self) -> Pipeline:
        if self._fast is not None:
            return self._fast.pipeline(epochs=None if self._train else 1)
        return Pipeline(self._source, steps=[self._step], workers=self.num_workers,
                        ordered=True, epochs=None if self._train else 1, seed=self.seed)

    def _chunks(self, pipe: Pipeline) -> Iterator[_batch.Chunk]:
        idle = _guard.IdleCheck(*self._idle)
        items = iter(pipe)
        while True:
            try:
                item = next(items)
            except StopIteration:
                return
            except ShmpipeError as err:  # the fast path's reader or step: GluonTS's error
                if self._fast is None or not self._files:
                    raise
                own = _guard.replay(err, self._files, self._fns, self._stages)
                if own is None:
                    raise
                raise own from err
            if "idle" in item:
                idle.see(item)
            elif "err" in item:
                self._raise(item)
            else:
                yield self._fast.decode(item) if self._fast is not None else \
                    _batch.decode(item)

    def _raise(self, item: dict) -> None:
        """A worker's exception, named with the file and line of its entry."""
        try:
            raise_error(item)
        except BaseException as e:
            where = _guard.line_of(self._files, int(item["i"])) \
                if self._files and "i" in item else None
            if where is not None:
                _guard.note(e, *where)
            raise


class TrainDataLoader(_Loader):
    """``gluonts.dataset.loader.TrainDataLoader`` with the transformation in worker processes.

    Same arguments and behaviour: the dataset is cycled, ``transform`` applied with
    ``is_train=True``, windows batched by ``batch_size`` and stacked by ``stack_fn``;
    iterating yields ``num_batches_per_epoch`` batches (``None``: endless) and the next
    iteration continues the same stream. ``shuffle_buffer_length`` shuffles the entries
    through a buffer of that size (GluonTS's ``PseudoShuffled``); an empty dataset gives
    no batches.

    shmpipe's own arguments: ``num_workers`` (worker processes; 0 runs GluonTS's own loader
    in this process), ``seed`` (the windows drawn; default: drawn from numpy's global
    generator, so ``np.random.seed`` fixes them as it does for GluonTS), ``fast_path``
    (take the Rust chain when the transformation is one it implements; else run the
    chain's ``AddTimeFeatures`` with Rust's time features, see ``_accel``; ``False``: every
    step is GluonTS's own code).

    Each worker batches the windows it makes, so with several workers a batch holds
    windows of every ``num_workers``-th entry (GluonTS's: of consecutive entries). Batches
    are the same for the same ``seed`` and ``num_workers``. Call :meth:`close` (or use
    ``with``) to stop the workers before the loader is garbage.
    """

    _mode = "train"
    _is_train = True

    def __init__(self, dataset: Any, *, transform: Any = None, batch_size: int,
                 stack_fn: Callable, num_batches_per_epoch: Optional[int] = None,
                 shuffle_buffer_length: Optional[int] = None, num_workers: int = 2,
                 seed: Optional[int] = None, fast_path: bool = True):
        super().__init__(dataset, transform=transform, batch_size=batch_size,
                         stack_fn=stack_fn, num_workers=num_workers, seed=seed,
                         fast_path=fast_path, shuffle_buffer_length=shuffle_buffer_length)
        self.num_batches_per_epoch = num_batches_per_epoch
        self._pipe: Optional[Pipeline] = None
        self._it: Optional[Iterator] = None

    def _stream(self) -> Iterator:
        if self.num_workers == 0:
            from gluonts.dataset import loader

            yield from loader.TrainDataLoader(
                self.dataset, transform=self.transform, batch_size=self.batch_size,
                stack_fn=self.stack_fn, shuffle_buffer_length=self.shuffle_buffer_length)
            return
        self._pipe = pipe = self._pipeline()
        try:
            for c in self._chunks(pipe):
                yield self._stack(c)
        finally:  # an error (or close()) stops the workers at once
            pipe.close()

    def __iter__(self) -> Iterator:
        if self._it is None:
            self._it = self._stream()
        return itertools.islice(self._it, self.num_batches_per_epoch)

    def close(self) -> None:
        """Stops the worker processes (a later iteration starts them again)."""
        it, self._it = self._it, None
        if it is not None:
            it.close()
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None



class _OnePass(_Loader):
    _train = False
    _live: list  # the pipelines of the iterations under way

    def __iter__(self) -> Iterator:
        if self.num_workers == 0:
            from gluonts.dataset import loader

            f = getattr(loader, type(self).__name__)
            yield from f(self.dataset, transform=self.transform, batch_size=self.batch_size,
                         stack_fn=self.stack_fn)
            return
        rb = _batch.Rebatcher(self.batch_size)
        pipe = self._pipeline()
        self._live.append(pipe)
        try:
            for c in self._chunks(pipe):
                for b in rb.push(c):
                    yield self._stack(b)
            for b in rb.finish():
                yield self._stack(b)
        finally:
            if pipe in self._live:
                self._live.remove(pipe)
            pipe.close()

    def close(self) -> None:
        """Stops the worker processes of the iterations under way (a later iteration
        starts them again); safe to call repeatedly. ``with`` calls it at the block's end."""
        live = getattr(self, "_live", [])
        while live:
            live.pop().close()


class ValidationDataLoader(_OnePass):
    """``gluonts.dataset.loader.ValidationDataLoader`` with the transformation in worker
    processes: one pass over the dataset per iteration, ``transform`` applied with
    ``is_train=True``, batches of ``batch_size`` windows in dataset order (the last one
    partial), stacked by ``stack_fn``. ``num_workers``, ``seed``, ``fast_path``: as for
    :class:`TrainDataLoader`."""

    _mode = "validation"
    _is_train = True

    def __init__(self, dataset: Any, *, transform: Any = None, batch_size: int,
                 stack_fn: Callable, num_workers: int = 2, seed: Optional[int] = None,
                 fast_path: bool = True):
        self._live = []
        super().__init__(dataset, transform=transform, batch_size=batch_size,
                         stack_fn=stack_fn, num_workers=num_workers, seed=seed,
                         fast_path=fast_path)


class InferenceDataLoader(_OnePass):
    """``gluonts.dataset.loader.InferenceDataLoader`` with the transformation in worker
    processes: as :class:`ValidationDataLoader`, with ``is_train=False``."""

    _mode = "test"
    _is_train = False

    def __init__(self, dataset: Any, *, transform: Any = None, batch_size: int,
                 stack_fn: Callable, num_workers: int = 2, seed: Optional[int] = None,
                 fast_path: bool = True):
        self._live = []
        super().__init__(dataset, transform=transform, batch_size=batch_size,
                         stack_fn=stack_fn, num_workers=num_workers, seed=seed,
                         fast_path=fast_path)
