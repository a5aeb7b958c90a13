"""The Rust fast path of shmpipe.gluonts: which chains take it, and that its batches are
GluonTS's (validation and test: field for field; training: every window is the slice of
its series that its forecast_start says)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gluonts")
pd = pytest.importorskip("pandas")

from gluonts.dataset import loader as gl  # noqa: E402
from gluonts.dataset.field_names import FieldName  # noqa: E402
from gluonts.time_feature import hour_of_day  # noqa: E402
from gluonts.transform import (  # noqa: E402
    AddTimeFeatures,
    AsNumpyArray,
    Chain,
    RemoveFields,
    SelectFields,
    SetField,
)

import gluonts_helpers as h  # noqa: E402
from shmpipe.gluonts import (  # noqa: E402
    InferenceDataLoader,
    TrainDataLoader,
    ValidationDataLoader,
)
from test_gluonts import stack_numpy  # noqa: E402

PRED, CONTEXT = 6, 12


def static_prefix():
    """DeepAR's fields when it has no static features: constants, as its estimator sets."""
    return Chain([
        RemoveFields(field_names=[FieldName.FEAT_STATIC_REAL, FieldName.FEAT_DYNAMIC_REAL]),
        SetField(output_field=FieldName.FEAT_STATIC_CAT, value=[0]),
        SetField(output_field=FieldName.FEAT_STATIC_REAL, value=[0.0]),
        AsNumpyArray(field=FieldName.FEAT_STATIC_CAT, expected_ndim=1, dtype=int),
        AsNumpyArray(field=FieldName.FEAT_STATIC_REAL, expected_ndim=1),
    ])


def static_from_data():
    """DeepAR's fields when it has static features (num_feat_static_cat/real > 0)."""
    return Chain([
        AsNumpyArray(field=FieldName.FEAT_STATIC_CAT, expected_ndim=1, dtype=int),
        AsNumpyArray(field=FieldName.FEAT_STATIC_REAL, expected_ndim=1),
    ])


def chain(split, past=None, prefix=True, select=False, static=False):
    c = h.deepar_chain(context=CONTEXT, pred=PRED, sampler=h.samplers(PRED)[split], past=past)
    if static:
        c = static_from_data() + c
    elif prefix:
        c = static_prefix() + c
    if select:
        c = c + SelectFields(["feat_static_cat", "past_target", "past_time_feat",
                              "future_target", "past_observed_values", "forecast_start"])
    return c


def data(tmp_path, kind, n=13, length=90, freq="h", static=False):
    recs = h.records(n, length, nan=0.08, min_len=20, seed=3)
    for i, r in enumerate(recs):
        r["feat_static_cat"] = [i % 4, 7] if static else [3]
        if static:
            r["feat_static_real"] = [i / 3.0]
    return h.file_dataset(tmp_path, recs, freq) if kind == "file" else h.list_dataset(recs, freq)


def close(got, want):
    assert list(got.keys()) == list(want.keys())
    for k, w in want.items():
        g = got[k]
        if isinstance(w, np.ndarray):
            assert (g.dtype, g.shape) == (w.dtype, w.shape), k
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-6, err_msg=k)
        else:
            assert g == w, k


def test_the_deepar_chain_takes_the_fast_path_and_others_do_not(tmp_path):
    ds = data(tmp_path, "file")
    kw = dict(batch_size=4, stack_fn=stack_numpy)
    assert ValidationDataLoader(ds, transform=chain("validation"), **kw).fast_path
    assert InferenceDataLoader(ds, transform=chain("test"), **kw).fast_path
    with TrainDataLoader(ds, transform=chain("train", past=CONTEXT + 7), **kw) as dl:
        assert dl.fast_path
    not_rust = [
        h.LogScale() + chain("validation"),                        # a user step
        chain("validation", prefix=False) + h.WriteIsTrain(),      # a field Rust lacks
        h.default_transformation(),                                # other splitter
    ]
    other_features = chain("validation")
    other_features.transformations[7] = AddTimeFeatures(
        start_field="start", target_field="target", output_field="time_feat",
        time_features=[hour_of_day], pred_length=PRED)
    not_rust.append(other_features)
    for c in not_rust:
        assert not ValidationDataLoader(ds, transform=c, **kw).fast_path
    assert not InferenceDataLoader(ds, transform=chain("validation"), **kw).fast_path
    assert not ValidationDataLoader(ds, transform=chain("validation"), fast_path=False,
                                    **kw).fast_path


@pytest.mark.parametrize("kind", ["file", "list"])
@pytest.mark.parametrize("split,select,lags", [("validation", False, 0), ("test", False, 9),
                                               ("validation", True, 9), ("test", True, 0)])
def test_validation_and_test_batches_are_gluonts_own(tmp_path, kind, split, select, lags):
    ds = data(tmp_path, kind)
    c = chain(split, past=CONTEXT + lags, select=select)
    ours = ValidationDataLoader if split == "validation" else InferenceDataLoader
    theirs = gl.ValidationDataLoader if split == "validation" else gl.InferenceDataLoader
    dl = ours(ds, transform=c, batch_size=5, stack_fn=stack_numpy, num_workers=2)
    assert dl.fast_path
    got = list(dl)
    want = list(theirs(ds, transform=c, batch_size=5, stack_fn=stack_numpy))
    assert len(got) == len(want) > 1
    for g, w in zip(got, want):
        close(g, w)


def test_training_windows_are_slices_of_their_series(tmp_path):
    recs = h.records(15, 120, nan=0.1, min_len=30, seed=4)
    ds = h.file_dataset(tmp_path, recs)
    series = {r["item_id"]: np.array([np.nan if v is None else v for v in r["target"]],
                                     np.float32) for r in recs}
    past = CONTEXT + 10
    c = chain("train", past=past)
    want = next(iter(gl.TrainDataLoader(ds, transform=c, batch_size=8, stack_fn=stack_numpy)))
    with TrainDataLoader(ds, transform=c, batch_size=8, stack_fn=stack_numpy,
                         num_batches_per_epoch=6, num_workers=2, seed=3) as dl:
        assert dl.fast_path
        batches = list(dl)
    seen = set()
    for b in batches:
        assert list(b.keys()) == list(want.keys())
        for k, w in want.items():
            if isinstance(w, np.ndarray):
                assert (b[k].dtype, b[k].shape[1:]) == (w.dtype, w.shape[1:]), k
        np.testing.assert_array_equal(b["feat_static_cat"], np.zeros((8, 1), np.int64))
        for r in range(8):
            iid, fs, start = b["item_id"][r], b["forecast_start"][r], b["start"][r]
            assert start == pd.Period("2021-01-01 00:00", "h")
            idx = (fs - start).n
            y = series[iid]
            assert PRED <= len(y) - idx and idx >= 0
            lo = max(idx - past, 0)
            pad = past - (idx - lo)
            want_past = np.concatenate([np.zeros(pad, np.float32), np.nan_to_num(y[lo:idx])])
            np.testing.assert_array_equal(b["past_target"][r], want_past)
            np.testing.assert_array_equal(b["past_is_pad"][r][:pad], 1)
            np.testing.assert_array_equal(b["future_target"][r],
                                          np.nan_to_num(y[idx:idx + PRED]))
            np.testing.assert_array_equal(b["future_observed_values"][r],
                                          ~np.isnan(y[idx:idx + PRED]))
            seen.add(iid)
    assert len(seen) >= 10


@pytest.mark.parametrize("kind", ["file", "list"])
@pytest.mark.parametrize("split", ["validation", "test"])
def test_static_features_from_the_data_are_gluonts_own(tmp_path, kind, split):
    # DeepAR with num_feat_static_cat/real > 0 keeps the data's static features.
    ds = data(tmp_path, kind, static=True)
    c = chain(split, past=CONTEXT + 3, static=True)
    ours = ValidationDataLoader if split == "validation" else InferenceDataLoader
    theirs = gl.ValidationDataLoader if split == "validation" else gl.InferenceDataLoader
    dl = ours(ds, transform=c, batch_size=5, stack_fn=stack_numpy, num_workers=2)
    assert dl.fast_path, dl.why_not_fast
    got = list(dl)
    want = list(theirs(ds, transform=c, batch_size=5, stack_fn=stack_numpy))
    assert want[0]["feat_static_cat"].dtype == np.int64
    assert len(got) == len(want) > 1
    for g, w in zip(got, want):
        close(g, w)


def test_training_fast_path_epochs_and_static_features(tmp_path):
    # num_batches_per_epoch batches per iteration, the stream going on across epochs, every
    # series seen, each row with its own series' static features.
    ds = data(tmp_path, "file", static=True)
    want = {f"s{i}": ([i % 4, 7], [np.float32(i / 3.0)]) for i in range(13)}
    with TrainDataLoader(ds, transform=chain("train", past=CONTEXT + 5, static=True),
                         batch_size=4, stack_fn=stack_numpy, num_batches_per_epoch=3,
                         num_workers=2, seed=1) as dl:
        assert dl.fast_path, dl.why_not_fast
        epochs = [list(dl) for _ in range(4)]
    assert [len(e) for e in epochs] == [3, 3, 3, 3]
    seen = set()
    for b in (b for e in epochs for b in e):
        assert len(b["item_id"]) == 4
        assert b["feat_static_cat"].dtype == np.int64
        for r, iid in enumerate(b["item_id"]):
            np.testing.assert_array_equal(b["feat_static_cat"][r], want[iid][0])
            np.testing.assert_array_equal(b["feat_static_real"][r], want[iid][1])
            seen.add(iid)
    # 48 windows of 13 series: about one per series and pass (the sampler draws 0, 1, 2, ...
    # windows per series and pass, so a series may be missed)
    assert seen <= set(want) and len(seen) >= 10, seen


@pytest.mark.parametrize("fast", [True, False])
def test_series_longer_than_a_pool_block_go_through(tmp_path, fast):
    # shmpipe.gluonts adds no size limit of its own: a 1.8 MB JSON line (280,000+ points,
    # 1.1 MB as float32, above the 1 MiB pool block) reaches the windows on either path
    # (before main's large items, the emitter refused it: WorkerDied, "zero-copy array
    # needs ... bytes but the limit is 1048576 bytes").
    recs = h.records(2, 300_000, min_len=280_000, seed=1)
    for r in recs:
        r["feat_static_cat"] = [3]
    ds = h.file_dataset(tmp_path, recs)
    c = chain("validation")
    dl = ValidationDataLoader(ds, transform=c, batch_size=2, stack_fn=stack_numpy,
                              num_workers=2, fast_path=fast)
    assert dl.fast_path == fast
    got = list(dl)
    want = list(gl.ValidationDataLoader(ds, transform=c, batch_size=2, stack_fn=stack_numpy))
    assert len(got) == len(want) == 1
    close(got[0], want[0])
