"""GluonTS's data loaders with the transformation in shmpipe worker processes.

Drop-ins for ``gluonts.dataset.loader.TrainDataLoader`` / ``ValidationDataLoader`` /
``InferenceDataLoader`` (same arguments, same batches), plus ``num_workers``, ``seed`` and
``fast_path``::

    from gluonts.torch.batchify import batchify
    from shmpipe.gluonts import TrainDataLoader

    loader = TrainDataLoader(dataset, transform=chain, batch_size=32, stack_fn=batchify,
                             num_batches_per_epoch=100, num_workers=2)

The user's own ``Transformation`` (any GluonTS chain, pickled to the workers) runs in
``num_workers`` worker processes of a :class:`shmpipe.Pipeline`, the seed discussion's
``Pipeline(steps, num_workers)``: an emitter reads the dataset (JSON-lines files line by
line, anything else entry by entry), each worker applies the whole chain to the entries it
gets and batches its windows, the batches come back through shared memory. When the chain
is DeepAR's (the one ``crates/timeseries`` implements), the Rust chain runs instead
(``loader.fast_path`` says which). A ``gluonts.torch`` estimator trains with them after
``use_shmpipe(estimator)``.
"""

from __future__ import annotations

from ._batch import ColumnStack
from ._estimator import use_shmpipe
from ._loaders import InferenceDataLoader, TrainDataLoader, ValidationDataLoader

__all__ = ["ColumnStack", "InferenceDataLoader", "TrainDataLoader", "ValidationDataLoader",
           "use_shmpipe"]
