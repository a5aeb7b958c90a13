"""Transformations and data for test_gluonts*.py (importable by the worker processes).

``WriteIsTrain`` and ``ExactlyOneSampler`` follow GluonTS's own loader tests
(test/dataset/test_data_loader.py).
"""

from __future__ import annotations

import copy
import itertools
import json

import numpy as np
from gluonts.dataset.common import DataEntry, FileDataset, ListDataset
from gluonts.dataset.field_names import FieldName
from gluonts.time_feature import time_features_from_frequency_str
from gluonts.transform import (
    AddAgeFeature,
    AddObservedValuesIndicator,
    AddTimeFeatures,
    AsNumpyArray,
    Chain,
    ExpectedNumInstanceSampler,
    InstanceSampler,
    InstanceSplitter,
    MapTransformation,
    TestSplitSampler,
    UniformSplitSampler,
    ValidationSplitSampler,
    VstackFeatures,
)


class WriteIsTrain(MapTransformation):
    def map_transform(self, data: DataEntry, is_train: bool) -> DataEntry:
        data["is_train"] = is_train
        return data


class ExactlyOneSampler(InstanceSampler):
    def __call__(self, ts: np.ndarray) -> np.ndarray:
        a, b = self._get_bounds(ts)
        assert b - a + 1 > 0
        return np.array([a])


class Boom(ValueError):
    """A user's own exception type."""


class FailOn(MapTransformation):
    def __init__(self, item_id: str):
        self.item_id = item_id

    def map_transform(self, data: DataEntry, is_train: bool) -> DataEntry:
        if data.get(FieldName.ITEM_ID) == self.item_id:
            raise Boom(f"cannot transform {self.item_id}")
        return data


_CALLS = itertools.count()


class CountCalls(MapTransformation):
    """Stamps each entry with how many entries this process transformed before."""

    def map_transform(self, data: DataEntry, is_train: bool) -> DataEntry:
        data["calls"] = next(_CALLS)
        return data


class AddOneInPlace(MapTransformation):
    """A user step that changes the target array in place (GluonTS copies only the dict)."""

    def map_transform(self, data: DataEntry, is_train: bool) -> DataEntry:
        data[FieldName.TARGET] += 1.0
        return data


class LogScale(MapTransformation):
    """A user transformation the Rust chain does not have: log1p of the target."""

    def map_transform(self, data: DataEntry, is_train: bool) -> DataEntry:
        data[FieldName.TARGET] = np.log1p(np.abs(data[FieldName.TARGET]))
        return data


def splitter(sampler, past=10, future=5, fields=(), dummy=1.0):
    return InstanceSplitter(
        target_field=FieldName.TARGET, is_pad_field=FieldName.IS_PAD,
        start_field=FieldName.START, forecast_start_field=FieldName.FORECAST_START,
        instance_sampler=sampler, past_length=past, future_length=future,
        time_series_fields=list(fields), dummy_value=dummy)


def default_transformation(sampler=None):
    """GluonTS's test chain: WriteIsTrain + InstanceSplitter(ExactlyOneSampler)."""
    return WriteIsTrain() + splitter(sampler or ExactlyOneSampler())


def deepar_chain(freq="h", context=24, pred=6, sampler=None, past=None, dynamic=False):
    """The DeepAR-style chain (the Rust crate's), with GluonTS's classes; ``dynamic``: with
    the data's static features and ``feat_dynamic_real`` stacked into ``time_feat``, as
    DeepAR does with ``num_feat_dynamic_real > 0`` (not the Rust chain)."""
    static = [AsNumpyArray(field=FieldName.FEAT_STATIC_CAT, expected_ndim=1, dtype=int),
              AsNumpyArray(field=FieldName.FEAT_STATIC_REAL, expected_ndim=1)]
    extra = [FieldName.FEAT_DYNAMIC_REAL] if dynamic else []
    return Chain((static if dynamic else []) + [
        AsNumpyArray(field=FieldName.TARGET, expected_ndim=1),
        AddObservedValuesIndicator(target_field=FieldName.TARGET,
                                   output_field=FieldName.OBSERVED_VALUES),
        AddTimeFeatures(start_field=FieldName.START, target_field=FieldName.TARGET,
                        output_field=FieldName.FEAT_TIME,
                        time_features=time_features_from_frequency_str(freq), pred_length=pred),
        AddAgeFeature(target_field=FieldName.TARGET, output_field=FieldName.FEAT_AGE,
                      pred_length=pred, log_scale=True),
        VstackFeatures(output_field=FieldName.FEAT_TIME,
                       input_fields=[FieldName.FEAT_TIME, FieldName.FEAT_AGE] + extra),
        splitter(sampler or ExpectedNumInstanceSampler(num_instances=1.0, min_future=pred),
                 past=past or context, future=pred,
                 fields=[FieldName.FEAT_TIME, FieldName.OBSERVED_VALUES], dummy=0.0),
    ])


def samplers(pred):
    return {"train": ExpectedNumInstanceSampler(num_instances=1.0, min_future=pred),
            "validation": ValidationSplitSampler(min_future=pred),
            "test": TestSplitSampler(),
            "uniform": UniformSplitSampler(p=0.05, min_future=pred)}


def records(n=10, length=5, seed=0, nan=0.0, int_ids=False, min_len=None, features=False,
            future=0):
    """GluonTS-format dicts (``start`` strings, ``target`` lists with ``None``); ``features``:
    with ``feat_static_cat``, ``feat_static_real`` and two rows of ``feat_dynamic_real``
    (``future`` points longer than the target, as inference needs)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ln = length if min_len is None else int(rng.integers(min_len, length + 1))
        y = np.round(rng.gamma(2.0, 5.0, ln), 3)
        t = [None if m else float(v) for v, m in zip(y, rng.random(ln) < nan)]
        r = {"start": "2021-01-01 00:00:00", "item_id": i if int_ids else f"s{i}", "target": t}
        if features:
            r["feat_static_cat"] = [i % 3, 1]
            r["feat_static_real"] = [float(i) / 7]
            r["feat_dynamic_real"] = np.round(rng.normal(size=(2, ln + future)), 3).tolist()
        out.append(r)
    return out


def file_dataset(tmp_path, recs, freq="h"):
    path = tmp_path / "data.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return FileDataset(path, freq)


def list_dataset(recs, freq="h"):
    return ListDataset(copy.deepcopy(recs), freq=freq)  # it processes the dicts in place
