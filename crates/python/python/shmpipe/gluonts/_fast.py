"""The Rust fast path: when the transformation is the chain ``crates/timeseries`` implements.

That chain is DeepAR's (``gluonts.torch.model.deepar``'s ``create_transformation`` plus
its instance splitter), written with GluonTS's own classes:

    [RemoveFields] [SetField(feat_static_cat|feat_static_real)] [AsNumpyArray(static)]
    AsNumpyArray(target, 1) AddObservedValuesIndicator(DummyValueImputation(0.0))
    AddTimeFeatures(the frequency's default features) AddAgeFeature(log_scale=True)
    VstackFeatures(time_feat, [time_feat, feat_dynamic_age]) [AsNumpyArray(time_feat, 2)]
    InstanceSplitter(ExpectedNumInstanceSampler | ValidationSplitSampler (training mode)
                     | TestSplitSampler (inference mode),
                     time_series_fields=[time_feat, observed_values], dummy_value=0.0,
                     any past_length, e.g. context_length + max(lags_seq))
    [SelectFields]

with the same ``prediction_length`` everywhere, over hourly, daily, minutely or secondly
data. :func:`plan` recognises it (class by class, field by field) and returns a
:class:`FastPlan`, or ``None`` (the Python workers run the chain then).

The batch's fields, their order and dtypes are learnt by running the user's chain once here
on the first entries (a copy of it, numpy's and Python's random state put back after): the
fast path fills exactly those fields, from the Rust windows (``past_*``, ``future_*``,
``forecast_start`` and ``start`` as ``pandas.Period``, ``item_id``) and from the chain's
constants (``SetField``). Anything else in the output sends the chain to the Python workers.
The windows are drawn by the Rust samplers (seeded per worker): the same distribution as
GluonTS's, not the same draws; validation and test windows are GluonTS's exactly.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any, Optional

import numpy as np

from ..pipeline import NamedSource, Pipeline
from . import _batch
from ._source import LINES, EntrySource

# The time features of crates/timeseries/src/features.rs, by frequency unit.
_RUST_FEATURES = {
    "h": ["hour_of_day", "day_of_week", "day_of_month", "day_of_year"],
    "D": ["day_of_week", "day_of_month", "day_of_year"],
    "min": ["minute_of_hour", "hour_of_day", "day_of_week", "day_of_month", "day_of_year"],
    "s": ["second_of_minute", "minute_of_hour", "hour_of_day", "day_of_week",
          "day_of_month", "day_of_year"],
}
_RUST_ARRAYS = {"past_target", "future_target", "past_observed_values",
                "future_observed_values", "past_time_feat", "future_time_feat", "past_is_pad"}
_STATIC = ("feat_static_cat", "feat_static_real")
_DYNAMIC = ("feat_dynamic_real", "feat_dynamic_cat", "past_feat_dynamic_real")


class _No(Exception):
    """Not the Rust chain (the reason: the loader's ``why_not_fast``)."""


def _need(cond: bool, why: str) -> None:
    if not cond:
        raise _No(why)


def _flatten(stages: list) -> tuple[list, bool]:
    from gluonts.transform import Chain, Identity

    out: list = []
    flags = {bool(tr) for _, tr in stages}
    _need(len(flags) == 1, "stages with different is_train")

    def walk(t):
        if isinstance(t, Chain):
            for s in t.transformations:
                walk(s)
        elif not isinstance(t, Identity):
            out.append(t)

    for t, _ in stages:
        walk(t)
    return out, flags.pop()


def _unit(freqstr: str) -> str:
    base = freqstr.lstrip("0123456789")
    return {"H": "h", "T": "min", "S": "s"}.get(base, base)


def _is(t: Any, cls: type, **attrs) -> bool:
    if type(t) is not cls:
        return False
    return all(getattr(t, k, object()) == v for k, v in attrs.items())


def _want(ts: list, t: Any, cls: type, **attrs) -> None:
    """:class:`_No` naming the step (1-based, in the flattened chain) and what differs
    when ``t`` is not ``cls`` with ``attrs``."""
    pos = next((n for n, s in enumerate(ts, 1) if s is t), "?")
    if type(t) is not cls:
        raise _No(f"step {pos} is {type(t).__name__} where the Rust chain has {cls.__name__}"
                  f"({', '.join(f'{k}={v!r}' for k, v in attrs.items())})")
    for k, v in attrs.items():
        got = getattr(t, k, "missing")
        if not got == v:
            raise _No(f"step {pos} {cls.__name__}: {k}={got!r}, the Rust chain's is {v!r}")


def _match(ts: list, is_train: bool, freq: str) -> dict:
    """The Rust chain's arguments for the flattened chain ``ts``, or :class:`_No`."""
    import gluonts.transform as T
    from gluonts.transform.feature import DummyValueImputation
    from gluonts.transform.sampler import PredictionSplitSampler

    i, consts = 0, {}
    while i < len(ts) and type(ts[i]) in (T.RemoveFields, T.SetField, T.AsNumpyArray):
        t = ts[i]
        if type(t) is T.SetField:
            _need(t.output_field in _STATIC, f"SetField({t.output_field})")
            consts[t.output_field] = t
        elif type(t) is T.AsNumpyArray:
            if t.field == "target":
                break
            _need(t.field in _STATIC and t.expected_ndim == 1, f"AsNumpyArray({t.field})")
        i += 1
    core = ts[i:]
    _need(len(core) >= 6, f"{len(core)} steps from AsNumpyArray(target) on "
          f"({[type(t).__name__ for t in core]}), the Rust chain has AsNumpyArray, "
          "AddObservedValuesIndicator, AddTimeFeatures, AddAgeFeature, VstackFeatures, "
          "InstanceSplitter")
    split = core[-1] if type(core[-1]) is T.InstanceSplitter else core[-2]
    _need(type(split) is T.InstanceSplitter,
          f"the chain ends with {type(core[-1]).__name__}, not an InstanceSplitter")
    p = split.future_length
    asn, obs, tf, age, vst = core[:5]
    _want(ts, asn, T.AsNumpyArray, field="target", expected_ndim=1, dtype=np.float32)
    _want(ts, obs, T.AddObservedValuesIndicator, target_field="target",
          output_field="observed_values", dtype=np.float32)
    imp = getattr(obs, "imputation_method", None)
    _need(type(imp) is DummyValueImputation and imp.dummy_value == 0.0,
          f"AddObservedValuesIndicator: imputation_method={imp!r}, the Rust chain's is "
          "DummyValueImputation(0.0)")
    _want(ts, tf, T.AddTimeFeatures, start_field="start", target_field="target",
          output_field="time_feat", pred_length=p, dtype=np.float32)
    names = [getattr(f, "__name__", "") for f in getattr(tf, "date_features", [])]
    _need(names == _RUST_FEATURES.get(_unit(freq)),
          f"AddTimeFeatures: time_features={names}, the Rust chain has "
          f"{_RUST_FEATURES.get(_unit(freq))} for freq={freq!r}")
    _want(ts, age, T.AddAgeFeature, target_field="target", feature_name="feat_dynamic_age",
          pred_length=p, log_scale=True, dtype=np.float32)
    _want(ts, vst, T.VstackFeatures, output_field="time_feat", h_stack=False,
          input_fields=["time_feat", "feat_dynamic_age"], cols_to_drop=["feat_dynamic_age"])
    rest = core[5:]
    if type(rest[0]) is T.AsNumpyArray:
        _want(ts, rest[0], T.AsNumpyArray, field="time_feat", expected_ndim=2,
              dtype=np.float32)
        rest = rest[1:]
    _need(rest[0] is split and all(type(t) is T.SelectFields for t in rest[1:]),
          f"after VstackFeatures: {[type(t).__name__ for t in rest]}, the Rust chain has "
          "InstanceSplitter and SelectFields only")
    _want(ts, split, T.InstanceSplitter, target_field="target", is_pad_field="is_pad",
          start_field="start", forecast_start_field="forecast_start", lead_time=0,
          output_NTC=True, ts_fields=["time_feat", "observed_values"], dummy_value=0.0)
    s = split.instance_sampler
    _need(getattr(s, "axis", None) == -1, "sampler axis")
    args = {"freq": freq, "context_length": int(split.past_length), "prediction_length": int(p),
            "min_past": int(s.min_past), "fused": True}
    if type(s) is T.ExpectedNumInstanceSampler and is_train:
        _need(s.min_instances == 0, "min_instances")
        args.update(split="train", num_instances=float(s.num_instances),
                    min_future=int(s.min_future))
    elif type(s) is PredictionSplitSampler and s.allow_empty_interval and is_train:
        args.update(split="validation", min_future=int(s.min_future))  # ValidationSplitSampler
    elif (type(s) is PredictionSplitSampler and not s.allow_empty_interval
          and s.min_future == 0 and not is_train):
        args.update(split="test")  # TestSplitSampler
    else:
        raise _No(f"sampler {type(s).__name__} with is_train={is_train}")
    return {"args": args, "consts": set(consts)}


def _first_entries(source: EntrySource, fns: list, n: int) -> list:
    import pickle

    if source.kind != LINES:
        return [pickle.loads(b) for b in source.data[:n]]
    from gluonts import json as gjson

    out = []
    for path, start, count in source.data:
        with open(path, "rb") as f:
            for k, line in enumerate(f):
                if k < start:
                    continue
                if len(out) == n or (count is not None and k >= start + count):
                    break
                e = gjson.loads(line)
                for fn in fns:
                    e = fn(e)
                out.append(e)
        if len(out) == n:
            break
    return out


def _probe(entries: list, stages: list) -> Optional[dict]:
    """The first window the chain makes of ``entries`` (on a copy of the chain)."""
    st, pst = np.random.get_state(), random.getstate()
    try:
        stages = copy.deepcopy(stages)
        for e in entries:
            data = [e]
            for t, tr in stages:
                data = t(data, tr)
            for w in data:
                return w
    finally:
        np.random.set_state(st)
        random.setstate(pst)
    return None


def _schema(window: dict, consts: set) -> list:
    import pandas as pd

    out = []
    for k, v in window.items():
        if k in _RUST_ARRAYS:
            _need(type(v) is np.ndarray and v.dtype == np.float32, k)
            out.append((k, "array", np.dtype(np.float32), v.shape))
        elif k in ("start", "forecast_start"):
            _need(type(v) is pd.Period, k)
            out.append((k, "period", None, None))
        elif k == "item_id":
            _need(type(v) is str, "item_id not a str")
            out.append((k, "ids", None, None))
        elif k in consts:
            _need(type(v) is np.ndarray, k)
            out.append((k, "const", v, None))
        elif k in _STATIC:
            _need(type(v) is np.ndarray and v.ndim == 1, k)
            out.append((k, "array", v.dtype, v.shape))
        else:
            raise _No(f"field {k!r}")
    return out


def _item_of(e: dict) -> dict:
    """A processed GluonTS entry as an item the Rust step reads (``item_to_entry``)."""
    import pandas as pd

    s = e.get("start")
    _need(type(s) is pd.Period, "start not a Period")
    t = np.asarray(e["target"], np.float32)
    _need(t.ndim == 1, "target not 1-D")
    item: dict = {"target": t, "start": int(s.ordinal)}
    iid = e.get("item_id")
    if iid is not None:
        _need(type(iid) is str, "item_id not a str")
        item["item_id"] = iid
    for k in _STATIC:
        if e.get(k) is not None:
            item[k] = np.asarray(e[k], np.float32)
    return item


class FastPlan:
    """A loader's pipeline over the Rust chain, and the decoding of its items."""

    def __init__(self, *, args: dict, schema: list, freq: str, source: Any, train: bool,
                 batch_size: int, seed: int, workers: int,
                 shuffle_buffer_length: Optional[int]):
        self.args = dict(args, batch_size=batch_size)
        self.schema, self.freq, self.source, self.train = schema, freq, source, train
        self.seed, self.workers = seed, workers
        self.shuffle_buffer_length = shuffle_buffer_length

    def pipeline(self, epochs: Optional[int]) -> Pipeline:
        step = "gluonts_train" if self.train else "gluonts_transform"
        L = self.shuffle_buffer_length if self.train else None
        return Pipeline(self.source, steps=[(step, self.args)], workers=self.workers,
                        ordered=True, epochs=epochs, seed=self.seed, shuffle=bool(L),
                        shuffle_buffer=max(int(L or 1), 1))

    def _periods(self, ordinals) -> list:
        import pandas as pd

        f = self.freq
        return [pd.Period(ordinal=int(o), freq=f) for o in ordinals]

    def decode(self, item: dict) -> _batch.Chunk:
        if self.train:  # a batch: stacked arrays, ordinals, ids as JSON
            n = len(item["forecast_start"])
            ids = lambda: json.loads(item["item_ids"])  # noqa: E731
            one = lambda k: item[k]  # noqa: E731
        else:  # one window
            n = 1
            ids = lambda: [item["item_id"]]  # noqa: E731
            one = lambda k: np.asarray(item[k])[None]  # noqa: E731
        cols = []
        for k, how, dt, _ in self.schema:
            if how == "array":
                a = one(k)
                cols.append(a if a.dtype == dt else a.astype(dt))
            elif how == "period":
                cols.append(self._periods(item[k] if self.train else [item[k]]))
            elif how == "ids":
                cols.append(ids())
            else:  # a SetField constant, as every row holds it
                cols.append(np.repeat(dt[None], n, axis=0))
        return _batch.Chunk([s[0] for s in self.schema], cols, n)


def plan(source: EntrySource, fns: list, stages: list, *, mode: str, batch_size: int,
         seed: int, num_workers: int,
         shuffle_buffer_length: Optional[int]) -> tuple[Optional[FastPlan], str]:
    """``(FastPlan, "")`` when the chain is the Rust crate's, else ``(None, why not)``."""
    try:
        return _plan(source, fns, stages, mode=mode, batch_size=batch_size, seed=seed,
                     num_workers=num_workers, shuffle_buffer_length=shuffle_buffer_length), ""
    except _No as e:
        return None, str(e)


def _plan(source, fns, stages, *, mode, batch_size, seed, num_workers,
          shuffle_buffer_length) -> FastPlan:
    from gluonts.dataset.common import ProcessDataEntry

    ts, is_train = _flatten(stages)
    entries = _first_entries(source, fns, 20)
    _need(bool(entries), "no data")
    s0 = entries[0].get("start")
    freq = getattr(s0, "freqstr", None)
    _need(isinstance(freq, str) and _unit(freq) in _RUST_FEATURES, f"frequency {freq}")
    m = _match(ts, is_train, freq)
    window = _probe(entries, stages)
    _need(window is not None, "no window in the first entries")
    schema = _schema(window, m["consts"])
    if source.kind == LINES:
        _need(len(source.data) == 1 and source.data[0][1] == 0 and source.data[0][2] is None,
              "several files or a slice")
        _need(len(fns) == 1 and type(fns[0]) is ProcessDataEntry, "not FileDataset's Map")
        start_field, target_field = fns[0].trans[0], fns[0].trans[1]
        _need(not start_field.use_timestamp and target_field.req_ndim == 1, "FileDataset options")
        for e in entries:
            _need(all(e.get(k) is None for k in _DYNAMIC), "dynamic features in the data")
            _need(isinstance(e.get("item_id", ""), str), "item_id not a str")
        # Parsed once, by the emitter (the Rust reader), and sent from memory on every pass:
        # parsing each line on every pass was the bound (one window per series and pass).
        # One series per record (a record is one item between processes, of any size:
        # test_series_longer_than_a_pool_block_go_through).
        src: Any = NamedSource("gluonts_parsed",
                               {"path": source.data[0][0], "freq": freq, "group": 1})
    else:
        import pickle

        src = [_item_of(pickle.loads(b)) for b in source.data]
    return FastPlan(args=m["args"], schema=schema, freq=freq, source=src,
                    train=mode == "train", batch_size=batch_size, seed=seed,
                    workers=num_workers, shuffle_buffer_length=shuffle_buffer_length)
