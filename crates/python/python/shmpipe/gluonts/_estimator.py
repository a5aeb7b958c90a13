"""``use_shmpipe(estimator)``: a ``gluonts.torch`` estimator trains with shmpipe's loaders.

GluonTS's ``PyTorchLightningEstimator.train_model`` applies ``create_transformation()`` to
the data (a ``TransformedDataset``) and asks ``create_training_data_loader`` /
``create_validation_data_loader`` for the batches; every ``gluonts.torch`` estimator builds
them with ``gluonts.dataset.loader.as_stacked_batches`` over its instance splitter.
:func:`use_shmpipe` gives the estimator object (not its class) its own two methods: each
calls the estimator's original method, reads from the loader it returns what it is made of
(splitter, field names, batch size, output type, batches per epoch, shuffle buffer) and
returns shmpipe's loader built from the same parts over the same data, so that the whole
chain (the estimator's transformation + splitter) runs in worker processes, or in Rust
when it is the chain ``crates/timeseries`` implements (DeepAR's). Nothing is patched in
GluonTS or torch; loaders made during ``train`` are closed when it returns.
"""

from __future__ import annotations

from typing import Any, Optional

from ._batch import ColumnStack
from ._loaders import TrainDataLoader, ValidationDataLoader


def _parts(loader: Any) -> dict:
    """What ``as_stacked_batches(instances, ...)`` was given, read from its result."""
    from gluonts.dataset.loader import Batch, Stack
    from gluonts.itertools import IterableSlice, PseudoShuffled
    from gluonts.transform import Chain, Identity, SelectFields, TransformedDataset, Valmap

    def fail(why: str):
        raise TypeError(
            f"shmpipe.gluonts.use_shmpipe: this estimator's loader is not the "
            f"gluonts.dataset.loader.as_stacked_batches of an instance splitter ({why})")

    if not isinstance(loader, IterableSlice) or not isinstance(loader.iterable,
                                                                TransformedDataset):
        fail(f"got {type(loader).__name__}")
    outer = loader.iterable
    ts = outer.transformation.transformations if isinstance(outer.transformation, Chain) \
        else [outer.transformation]
    ts = [t for t in ts if not isinstance(t, Identity)]
    names, batch_size, output_type = None, None, None
    for t in ts:
        if isinstance(t, SelectFields):
            names = list(t.input_fields)
        elif isinstance(t, Batch):
            batch_size = t.batch_size
        elif isinstance(t, Valmap):
            output_type = t.fn
        elif not isinstance(t, Stack):
            fail(f"unexpected {type(t).__name__}")
    if batch_size is None:
        fail("no batch size")
    inner, shuffle = outer.base_dataset, None
    if isinstance(inner, PseudoShuffled):
        inner, shuffle = inner.iterable, inner.shuffle_buffer_length
    if not isinstance(inner, TransformedDataset):
        fail(f"instances from {type(inner).__name__}")
    splitter = inner.transformation
    if names is not None:
        splitter = splitter + SelectFields(names)
    return {"transform": splitter, "batch_size": batch_size, "output_type": output_type,
            "num_batches": loader.length, "shuffle": shuffle}


def use_shmpipe(estimator: Any, *, num_workers: int = 2, seed: Optional[int] = None,
                fast_path: bool = True) -> Any:
    """Makes ``estimator`` (a ``gluonts.torch`` estimator, e.g. ``DeepAREstimator``) load its
    training and validation batches with shmpipe; returns the estimator::

        estimator = use_shmpipe(DeepAREstimator(freq="h", prediction_length=24, ...))
        predictor = estimator.train(dataset)

    ``num_workers`` worker processes run the estimator's transformation and instance
    splitter (or the Rust chain, ``fast_path``); ``seed``: as for :class:`TrainDataLoader`
    (default: from numpy's global generator, which ``lightning.seed_everything`` seeds).
    The training windows are shuffled by entry (``shuffle_buffer_length`` of ``train``),
    not by window as GluonTS's ``as_stacked_batches`` does. Prediction is unchanged
    (GluonTS's own loader: one pass, in order).
    """
    cls = type(estimator)
    made: list = []
    kw = dict(num_workers=num_workers, seed=seed, fast_path=fast_path)

    def create_training_data_loader(data, module, **kwargs):
        p = _parts(cls.create_training_data_loader(estimator, data, module, **kwargs))
        dl = TrainDataLoader(data, transform=p["transform"], batch_size=p["batch_size"],
                             stack_fn=ColumnStack(p["output_type"]),
                             num_batches_per_epoch=p["num_batches"],
                             shuffle_buffer_length=p["shuffle"], **kw)
        made.append(dl)
        return dl

    def create_validation_data_loader(data, module, **kwargs):
        p = _parts(cls.create_validation_data_loader(estimator, data, module, **kwargs))
        return ValidationDataLoader(data, transform=p["transform"], batch_size=p["batch_size"],
                                    stack_fn=ColumnStack(p["output_type"]), **kw)

    def train_model(*args, **kwargs):
        try:
            return cls.train_model(estimator, *args, **kwargs)
        finally:
            while made:
                made.pop().close()

    estimator.create_training_data_loader = create_training_data_loader
    estimator.create_validation_data_loader = create_validation_data_loader
    estimator.train_model = train_model
    return estimator
