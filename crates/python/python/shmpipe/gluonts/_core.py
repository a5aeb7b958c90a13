"""DeepAR's feature steps and instance splitter, computed for the windows only, in a worker.

After the native line reading (``_lines``) and time features (``_accel``), most of a
worker's time on a user chain went to the steps that build features over the whole series
only for the splitter to cut one window of ``past + future`` points out of them (2026-12-04,
``bench/profile_gluonts_worker.py``, 2,750-point series: ``AddAgeFeature``,
``VstackFeatures`` and ``InstanceSplitter`` ~0.11 ms per entry of ~0.23 ms). A worker
replaces each run of its copy of the chain that reads

    AsNumpyArray(target, 1, float32)  AddObservedValuesIndicator(target -> observed)
    AddTimeFeatures(start, target -> feat, GluonTS's calendar features, float32)
    AddAgeFeature(target -> age, log_scale=True, float32)
    VstackFeatures(feat, [feat, age], drop age)  [AsNumpyArray(feat, 2, float32)]
    InstanceSplitter(target, start, time_series_fields = {feat, observed}, output_NTC)

(DeepAR's, with any field names, lengths, lead time, padding value and sampler) with one
step that runs the first two with GluonTS's own code, asks GluonTS's own sampler for the
split points (the same draws from numpy's generator), and then builds each window's
fields from the window's range only: time features from ``crates/timeseries``
(``_accel``), the age from the same float32 ``log10`` numpy computes, target and observed
values sliced and padded as the splitter does. The windows are GluonTS's: same keys in the
same order (the entry's other fields passed through as the splitter passes them), dtypes
and values (``tests/test_gluonts_core.py``). An entry it does not cover (a start that is
not a ``pandas.Period`` of ``s``/``min``/``h``/``D``, a field the run would overwrite
already there, a split point outside the series) goes through the original steps.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from ._accel import _FREQS


def _is(t: Any, cls: type, **attrs) -> bool:
    return type(t) is cls and all(getattr(t, k, object()) == v for k, v in attrs.items())


def _match(ts: list, i: int) -> int:
    """The length of the fusable run at ``ts[i]`` (0: none)."""
    import gluonts.transform as T

    from ._accel import _CLS

    if i + 6 > len(ts) or _CLS is None:
        return 0
    asn, obs, tf, age, vst = ts[i:i + 5]
    if not _is(asn, T.AsNumpyArray, expected_ndim=1) or np.dtype(asn.dtype) != np.float32:
        return 0
    tgt = asn.field
    if not (_is(obs, T.AddObservedValuesIndicator, target_field=tgt)
            and np.dtype(obs.dtype) == np.float32):
        return 0
    if type(tf) is not _CLS or tf.orig.target_field != tgt:
        return 0
    feat, p = tf.orig.output_field, tf.orig.pred_length
    if not (_is(age, T.AddAgeFeature, target_field=tgt, pred_length=p, log_scale=True)
            and np.dtype(age.dtype) == np.float32):
        return 0
    if not _is(vst, T.VstackFeatures, output_field=feat, h_stack=False,
               input_fields=[feat, age.feature_name], cols_to_drop=[age.feature_name]):
        return 0
    n = 5
    if _is(ts[i + n], T.AsNumpyArray, field=feat, expected_ndim=2) \
            and np.dtype(ts[i + n].dtype) == np.float32:
        n += 1
    if i + n >= len(ts):
        return 0
    split = ts[i + n]
    names = {feat, obs.output_field, tgt, age.feature_name}
    if not (_is(split, T.InstanceSplitter, target_field=tgt, start_field=tf.orig.start_field,
                output_NTC=True) and sorted(split.ts_fields) == sorted([feat, obs.output_field])
            and len(names) == 4 and int(split.lead_time) >= 0):
        return 0
    return n + 1


def fuse(t: Any) -> Any:
    """``t`` (a worker's copy, after ``_accel.accelerate``) with each fusable run replaced."""
    from gluonts.transform import Chain

    if not isinstance(t, Chain):
        return t
    ts, out, i = t.transformations, [], 0
    while i < len(ts):
        n = _match(ts, i)
        if n:
            out.append(_make_class()(ts[i:i + n]))
            i += n
        else:
            out.append(ts[i])
            i += 1
    return Chain(out) if len(out) != len(ts) else t


_FUSED = None


def _make_class():
    global _FUSED
    if _FUSED is not None:
        return _FUSED
    from gluonts.transform import FlatMapTransformation

    from .._native import time_features

    class WindowsOnly(FlatMapTransformation):
        """DeepAR's feature steps and splitter for the windows only (see ``_core``)."""

        def __init__(self, steps: list):
            super().__init__()
            self.steps = steps
            self.asn, self.obs, self.tf, self.age = steps[:4]
            self.split = steps[-1]
            o = self.tf.orig
            self.target, self.start, self.feat = o.target_field, o.start_field, o.output_field
            self.pred = o.pred_length
            self.observed = self.obs.output_field
            s = self.split
            self.past, self.future, self.lead = s.past_length, s.future_length, s.lead_time
            self.dummy = s.dummy_value
            self.order = list(s.ts_fields) + [self.target]
            self.outputs = {self.observed, self.feat, self.age.feature_name,
                            s._past(s.is_pad_field), s.forecast_start_field}
            self.outputs |= {f(c) for c in self.order for f in (s._past, s._future)}
            self.ages = np.zeros(0, np.float32)

        def _age(self, n: int) -> np.ndarray:
            if len(self.ages) < n:  # AddAgeFeature's own expression
                self.ages = np.log10(2.0 + np.arange(max(n, 2 * len(self.ages)),
                                                     dtype=np.float32))
            return self.ages

        def _original(self, data: dict, is_train: bool) -> Iterator[dict]:
            for t in self.steps[:-1]:
                data = t.map_transform(data, is_train)
            yield from self.split.flatmap_transform(data, is_train)

        def flatmap_transform(self, data: dict, is_train: bool) -> Iterator[dict]:
            start = data.get(self.start)
            if (type(start).__name__ != "Period" or getattr(start, "freqstr", None) not in _FREQS
                    or not self.outputs.isdisjoint(data)):
                yield from self._original(data, is_train)
                return
            data = self.obs.map_transform(self.asn.map_transform(data, is_train), is_train)
            target, observed = data[self.target], data[self.observed]
            n = len(target)
            nf = n + (0 if is_train else self.pred)  # target_transformation_length
            idxs = self.split.instance_sampler(target)
            if not all(0 <= i <= n for i in idxs):  # the splitter's own slicing, same draws
                for t in self.steps[2:-1]:
                    data = t.map_transform(data, is_train)
                for idx in idxs:
                    yield self.split._split_instance(data, idx)
                return
            rest = {k: v for k, v in data.items() if k != self.target and k != self.observed}
            s, past, dummy = self.split, self.past, self.dummy
            ordinal, freq, names = int(start.ordinal), start.freqstr, self.tf.names
            ages = self._age(nf)
            for idx in idxs:
                idx = int(idx)
                out = dict(rest)
                f0 = idx + self.lead
                pieces = {self.target: target, self.observed: observed}
                for c in self.order:
                    if c == self.feat:
                        pp = self._feat(ordinal, freq, names, ages, idx - past, idx, nf)
                        fp = self._feat(ordinal, freq, names, ages, f0, f0 + self.future, nf)
                    else:
                        a = pieces[c]
                        pp = a[idx - past:idx] if idx >= past else _pad(a[:idx], past - idx, dummy)
                        fp = a[f0:f0 + self.future]
                    out[s._past(c)], out[s._future(c)] = pp, fp
                pad = np.zeros(past, dtype=target.dtype)
                pad[:max(past - idx, 0)] = 1
                out[s._past(s.is_pad_field)] = pad
                out[s.forecast_start_field] = start + idx + self.lead
                yield out

        def _feat(self, ordinal, freq, names, ages, a, b, n) -> np.ndarray:
            """``(b - a, F + 1)`` rows of the stacked features of periods ``a..b`` clipped
            to ``..n`` (numpy's slicing), rows before 0 the padding value."""
            lo = max(a, 0)
            hi = max(min(b, n), lo)
            body = np.empty((hi - lo + (lo - a), len(names) + 1), np.float32)
            body[:lo - a] = self.dummy
            if hi > lo:
                body[lo - a:, :-1] = time_features(freq, ordinal + lo, hi - lo, names).T
                body[lo - a:, -1] = ages[lo:hi]
            return body

    _FUSED = WindowsOnly
    return WindowsOnly


def _pad(a: np.ndarray, left: int, value: float) -> np.ndarray:
    out = np.empty(left + len(a), a.dtype)
    out[:left] = value
    out[left:] = a
    return out
