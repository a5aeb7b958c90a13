"""GluonTS's data loaders with the transformations in shmpipe worker processes."""

from __future__ import annotations

from ._batch import TorchColumns
from ._loaders import InferenceDataLoader, TrainDataLoader, ValidationDataLoader

__all__ = ["InferenceDataLoader", "TorchColumns", "TrainDataLoader", "ValidationDataLoader"]
