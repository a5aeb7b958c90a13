"""GluonTS-compatible data loaders whose transformations run in Rust, in worker processes.

Drop-ins for ``gluonts.dataset.loader.TrainDataLoader`` / ``ValidationDataLoader`` /
``InferenceDataLoader`` with the DeepAR-style chain (``AsNumpyArray``,
``AddObservedValuesIndicator``, ``AddTimeFeatures``, ``AddAgeFeature(log_scale)``,
``VstackFeatures``, ``InstanceSplitter``) of ``crates/timeseries``. Batches are dicts of
numpy arrays with GluonTS's names, dtypes (float32) and layouts: ``past_target`` (batch, T),
``past_time_feat`` (batch, T, C), ``past_observed_values``, ``past_is_pad``,
``future_target``, ``future_time_feat``, ``future_observed_values``, plus
``forecast_start`` (int64 period ordinals of ``freq``), ``start`` (int64: each row's series
start ordinal) and ``item_ids`` (a list of str, one per row).

Each loader is a context manager: ``with TrainLoader(...) as dl:`` stops its processes and
removes its temporary file at the end (``close()`` does the same).

``freq`` is a pandas frequency string (``"h"``, ``"15min"``, ``"D"``, ``"W-SUN"``, ...); an
unsupported one raises ``ValueError`` naming ``freq=`` at construction. ``workers`` (worker
processes; 2 for ``TrainLoader``, 1 for the others) may be given as ``num_workers=``, the
name ``torch.utils.data.DataLoader`` uses (not both).

``data`` is a GluonTS JSON-lines file (``start``, ``target`` with ``null``/``"NaN"``
missing values, ``item_id``, ``feat_static_cat``, ...) or a list of such dicts.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _options
from ._closing import Closing
from ._native import time_features
from .pipeline import NamedSource, Pipeline, workers_alias

__all__ = ["TrainLoader", "ValidationLoader", "TestLoader"]


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return [None if isinstance(x, float) and x != x else x for x in v.tolist()]
    if hasattr(v, "isoformat"):
        return str(v)
    return str(v) if type(v).__name__ == "Period" else v


def _check_freq(freq) -> None:
    """A ``ValueError`` naming ``freq=`` (and the supported frequencies) now, not a
    ``StepError`` at the first batch: the Rust parser of the steps decides."""
    if not isinstance(freq, str):
        raise TypeError(f"freq={freq!r}: a pandas frequency string such as 'h' or '15min'")
    time_features(freq, 0, 0, [])


def _batch(b: dict) -> dict:
    """A batch as the Rust step sent it, with its ``item_ids`` (a JSON list on the wire) as a
    list of str."""
    ids = b.get("item_ids")
    if isinstance(ids, (str, bytes)):
        b["item_ids"] = json.loads(ids)
    return b


class _Loader(Closing):
    _step = ""

    def __init__(self, data, *, freq: str, context_length: int, prediction_length: int,
                 batch_size: int = 32, workers: int | None = None, emitters: int = 1,
                 seed: int = 0, num_workers: int | None = None, **kw):
        self._tmp = None
        workers = workers_alias(workers, num_workers, default=2)
        _check_freq(freq)
        context_length = _options.whole("context_length", context_length, least=1)
        prediction_length = _options.whole("prediction_length", prediction_length, least=1)
        batch_size = _options.whole("batch_size", batch_size, least=1,
                                    most=_options.MAX_BATCH_SIZE)
        workers = _options.whole("workers", workers, most=_options.MAX_PROCS)
        seed = _options.whole("seed", seed, most=_options.SEED[1])
        if isinstance(data, (str, os.PathLike)):
            path = _options.existing_file("data", data)
        else:
            self._tmp = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
            for d in data:
                self._tmp.write(json.dumps({k: _jsonable(v) for k, v in d.items()}) + "\n")
            self._tmp.close()
            path = self._tmp.name
        self.args = {"freq": freq, "context_length": context_length,
                     "prediction_length": prediction_length, "batch_size": batch_size}
        self._pipe_kw = dict(workers=workers, emitters=emitters, seed=seed, **kw)
        self._path = path

    def _pipeline(self, args: dict, **kw) -> Pipeline:
        # Records of consecutive lines up to 64 KiB together (a longer series alone): grouped
        # by bytes, so long series never make a record larger than a channel carries well.
        src = NamedSource("gluonts_lines", {"path": self._path})
        return Pipeline(src, steps=[(self._step, args)], **dict(self._pipe_kw, **kw))

    def close(self) -> None:
        if self._tmp is not None:
            try:
                os.unlink(self._tmp.name)
            except FileNotFoundError:
                pass
            self._tmp = None



class TrainLoader(_Loader):
    """``TrainDataLoader(dataset, transform=deepar_chain, batch_size=..., num_batches_per_epoch=...)``.

    Endless and shuffled like GluonTS's: the data is cycled (each pass with its own
    permutation, ``seed``), windows are sampled by ``ExpectedNumInstanceSampler(
    num_instances)``; iterating yields ``num_batches_per_epoch`` batches, and the next
    iteration continues the same stream. Batches are full (``batch_size`` rows).
    """

    _step = "gluonts_train"

    def __init__(self, data, *, num_batches_per_epoch: int = 50, num_instances: float = 1.0,
                 shuffle: bool = True, **kw):
        super().__init__(data, **kw)
        self.num_batches_per_epoch = num_batches_per_epoch
        # data_path: the workers take the sampler's mean window from the whole file, so a
        # seed gives the same windows for any number of workers (each record draws from its
        # own seed).
        args = dict(self.args, num_instances=num_instances, fused=True, data_path=self._path)
        self._pipe = self._pipeline(args, epochs=None, shuffle=shuffle)
        self._it: Iterator[dict] | None = None

    def __iter__(self) -> Iterator[dict]:
        if self._it is None:
            self._it = map(_batch, iter(self._pipe))
        return itertools.islice(self._it, self.num_batches_per_epoch)

    def close(self) -> None:
        """Stops the worker processes and removes the temporary file of a list of dicts."""
        if getattr(self, "_pipe", None) is not None:
            self._pipe.close()
        self._it = None
        super().close()


class _EvalLoader(_Loader):
    # The same Rust step as training, with GluonTS's validation or test split sampler
    # (`ChainConfig::split` of shmpipe-timeseries).
    _step = "gluonts_train"
    _mode = ""

    def __init__(self, data, *, workers: int | None = None, num_workers: int | None = None,
                 **kw):
        super().__init__(data, workers=workers_alias(workers, num_workers, default=1), **kw)

    def __iter__(self) -> Iterator[dict]:
        """One pass, series in file order (with one worker, batches as GluonTS forms them;
        with more, each batch holds windows of one worker)."""
        args = dict(self.args, split=self._mode)
        yield from map(_batch, self._pipeline(args, epochs=1, ordered=True))


class ValidationLoader(_EvalLoader):
    """``ValidationDataLoader``: the last ``prediction_length`` points of each series are the
    future window (``ValidationSplitSampler``, training-mode transformation)."""

    _mode = "validation"


class TestLoader(_EvalLoader):
    """``InferenceDataLoader``: one window per series ending at its end, with
    ``prediction_length`` steps of future features (``TestSplitSampler``)."""

    __test__ = False  # not a pytest test class despite its name
    _mode = "test"
