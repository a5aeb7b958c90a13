"""GluonTS steps the workers run natively, inside the user's own chain.

The user's chain runs in Python, step by step, in the workers; one step of it costs more
than all the others together on long series: ``AddTimeFeatures`` (pandas builds a
``PeriodIndex`` of the whole series and a calendar accessor per feature, ~1.5 ms for 3,000
hourly points). A worker gives every ``AddTimeFeatures`` of its copy of the chain whose
features are GluonTS's own calendar functions (``hour_of_day``, ``day_of_week``, ...,
``week_of_year``) and whose dtype is float32 the features of ``crates/timeseries``
(``shmpipe._native.time_features``: the same ``x / (num - 1) - 0.5`` in float64, rounded
to float32), for entries whose ``start`` is a ``pandas.Period`` of a fixed-length unit
(``s``, ``min``, ``h``, ``D``); any other entry goes through GluonTS's own code. The outputs
are equal (``tests/test_gluonts_accel.py``). Nothing else of the chain is touched.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_FREQS = {"s", "min", "h", "D"}
_NAMES = ("second_of_minute", "minute_of_hour", "hour_of_day", "day_of_week",
          "day_of_month", "day_of_year", "month_of_year", "week_of_year")


def _native_names(features: list) -> list | None:
    from gluonts.time_feature import _base

    names = []
    for f in features:
        name = getattr(f, "__name__", None)
        if name not in _NAMES or getattr(_base, name, None) is not f:
            return None
        names.append(name)
    return names


def _make_class():
    from gluonts.transform import MapTransformation
    from gluonts.transform.feature import target_transformation_length

    from .._native import time_features

    class NativeTimeFeatures(MapTransformation):
        """``AddTimeFeatures`` with the features of ``crates/timeseries``."""

        def __init__(self, orig: Any, names: list):
            self.orig, self.names = orig, names

        def map_transform(self, data: dict, is_train: bool) -> dict:
            o = self.orig
            start = data[o.start_field]
            freq = getattr(start, "freqstr", None)
            if freq not in _FREQS or type(start).__name__ != "Period":
                return o.map_transform(data, is_train)
            n = target_transformation_length(data[o.target_field], o.pred_length, is_train)
            data[o.output_field] = time_features(freq, int(start.ordinal), n, self.names)
            return data

    return NativeTimeFeatures


_CLS = None


def accelerate(t: Any) -> Any:
    """``t`` with its eligible ``AddTimeFeatures`` steps (also inside chains) replaced."""
    global _CLS
    from gluonts.transform import AddTimeFeatures, Chain

    if type(t) is AddTimeFeatures:
        names = _native_names(t.date_features) if t.date_features else None
        if names is None or np.dtype(t.dtype) != np.float32:
            return t
        if _CLS is None:
            _CLS = _make_class()
        return _CLS(t, names)
    if isinstance(t, Chain):
        t.transformations = [accelerate(s) for s in t.transformations]
    return t
