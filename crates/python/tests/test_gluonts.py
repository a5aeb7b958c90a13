"""shmpipe.gluonts's loaders against GluonTS's own (gluonts.dataset.loader), on the same data.

Derived from GluonTS's loader tests (test/dataset/test_data_loader.py: ``WriteIsTrain``,
``ExactlyOneSampler``, every item id counted, ``is_train`` seen by the transformation) plus
what its documentation says: batch keys and shapes, ``num_batches_per_epoch``, cycling,
shuffling, each series exactly once in validation and inference, an empty dataset.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

gluonts = pytest.importorskip("gluonts")
pytest.importorskip("pandas")

from gluonts.dataset import loader as gl  # noqa: E402
from gluonts.dataset.field_names import FieldName  # noqa: E402
from gluonts.itertools import Cached, rows_to_columns  # noqa: E402

import gluonts_helpers as h  # noqa: E402
from shmpipe.gluonts import InferenceDataLoader, TrainDataLoader, ValidationDataLoader  # noqa: E402


def stack_numpy(rows):
    """A stack_fn without torch: numpy columns (lists for non-array values)."""
    return {k: np.stack(v) if isinstance(v[0], np.ndarray) else list(v)
            for k, v in rows_to_columns(rows).items()}


def datasets(tmp_path, recs):
    return {"ListDataset": h.list_dataset(recs), "FileDataset": h.file_dataset(tmp_path, recs),
            "Cached": Cached(h.file_dataset(tmp_path, recs))}


def ids(batches):
    c = Counter()
    for b in batches:
        c.update(b[FieldName.ITEM_ID])
    return c


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert list(g.keys()) == list(w.keys())
        for k in w:
            if isinstance(w[k], np.ndarray):
                assert g[k].dtype == w[k].dtype, k
                np.testing.assert_array_equal(g[k], w[k], err_msg=k)
            else:
                assert g[k] == w[k], k


@pytest.mark.parametrize("kind", ["ListDataset", "FileDataset", "Cached"])
def test_training_cycles_and_sees_every_series(tmp_path, kind):
    # GluonTS's test_training_data_loader: an endless loader read in slices of 2 batches,
    # 20 times: every series comes back at least `passes` times, with is_train=True.
    dataset = datasets(tmp_path, h.records(10, 5))[kind]
    dl = TrainDataLoader(dataset, transform=h.default_transformation(), batch_size=4,
                         stack_fn=stack_numpy, num_workers=2)
    with dl:
        batches = []
        for _ in range(20):
            for b in itertools.islice(dl, 2):
                assert all(x is True for x in b["is_train"])
                batches.append(b)
    passes = 20 * 2 * 4 // 10
    counter = ids(batches)
    assert set(counter) == {f"s{i}" for i in range(10)}
    assert min(counter.values()) >= passes - 1


def test_num_batches_per_epoch_and_the_stream_continues_across_epochs():
    recs = h.list_dataset(h.records(7, 5))
    with TrainDataLoader(recs, transform=h.default_transformation(), batch_size=3,
                         stack_fn=stack_numpy, num_batches_per_epoch=4, num_workers=2) as dl:
        epochs = [list(dl) for _ in range(3)]
    assert [len(e) for e in epochs] == [4, 4, 4]
    assert all(len(b["item_id"]) == 3 for e in epochs for b in e)
    # 36 windows of 7 series, one window per series and pass: about 5 passes, every
    # series in every epoch's 12 windows or the next's.
    counter = ids(b for e in epochs for b in e)
    assert set(counter) == {f"s{i}" for i in range(7)}
    assert max(counter.values()) - min(counter.values()) <= 2


def test_training_batches_have_gluonts_keys_types_and_shapes(tmp_path):
    ds = h.file_dataset(tmp_path, h.records(12, 200, nan=0.05))
    kw = dict(transform=h.deepar_chain(), batch_size=8, stack_fn=stack_numpy,
              num_batches_per_epoch=3)
    want = next(iter(gl.TrainDataLoader(ds, **kw)))
    with TrainDataLoader(ds, num_workers=2, fast_path=False, **kw) as dl:
        got = next(iter(dl))
    assert list(got.keys()) == list(want.keys())
    for k, w in want.items():
        g = got[k]
        assert type(g) is type(w), k
        if isinstance(w, np.ndarray):
            assert (g.shape, g.dtype) == (w.shape, w.dtype), k
        else:
            assert [type(x) for x in g] == [type(x) for x in w], k
    assert isinstance(got["forecast_start"][0], type(want["forecast_start"][0]))
    assert got["forecast_start"][0].freqstr == want["forecast_start"][0].freqstr


@pytest.mark.parametrize("kind", ["ListDataset", "FileDataset", "Cached"])
@pytest.mark.parametrize("split", ["validation", "test"])
def test_validation_and_inference_equal_gluonts_batch_for_batch(tmp_path, kind, split):
    # Deterministic splitters: the batches must be GluonTS's, field for field, in order.
    recs = h.records(11, 60, nan=0.1, min_len=30)
    ds = datasets(tmp_path, recs)[kind]
    chain = h.deepar_chain(context=12, pred=6, sampler=h.samplers(6)[split])
    ours = ValidationDataLoader if split == "validation" else InferenceDataLoader
    theirs = gl.ValidationDataLoader if split == "validation" else gl.InferenceDataLoader
    want = list(theirs(ds, transform=chain, batch_size=4, stack_fn=stack_numpy))
    got = list(ours(ds, transform=chain, batch_size=4, stack_fn=stack_numpy, num_workers=2,
                    fast_path=False))
    assert [len(b["item_id"]) for b in got] == [4, 4, 3]
    assert_same_batches(got, want)


@pytest.mark.parametrize("split", ["validation", "test"])
def test_static_and_dynamic_features_and_lags_equal_gluonts(tmp_path, split):
    # DeepAR's chain with static features and feat_dynamic_real, past = context + 9 lags.
    recs = h.records(9, 80, nan=0.05, min_len=40, features=True,
                     future=6 if split == "test" else 0)
    ds = h.file_dataset(tmp_path, recs)
    chain = h.deepar_chain(context=12, pred=6, past=21, sampler=h.samplers(6)[split],
                           dynamic=True)
    ours = ValidationDataLoader if split == "validation" else InferenceDataLoader
    theirs = gl.ValidationDataLoader if split == "validation" else gl.InferenceDataLoader
    want = list(theirs(ds, transform=chain, batch_size=4, stack_fn=stack_numpy))
    dl = ours(ds, transform=chain, batch_size=4, stack_fn=stack_numpy, num_workers=2)
    got = list(dl)
    assert want[0]["past_time_feat"].shape[1:] == (21, 4 + 1 + 2)
    assert want[0]["feat_static_cat"].dtype == np.int64
    assert_same_batches(got, want)


def test_training_with_static_and_dynamic_features_and_lags_has_gluonts_fields(tmp_path):
    # The training windows of DeepAR's chain with static features, feat_dynamic_real and
    # past = context + 9 lags: GluonTS's keys, types, dtypes and shapes, every window the
    # series' own static features.
    recs = h.records(9, 80, nan=0.05, min_len=40, features=True)
    ds = h.file_dataset(tmp_path, recs)
    chain = h.deepar_chain(context=12, pred=6, past=21, dynamic=True)
    kw = dict(transform=chain, batch_size=4, stack_fn=stack_numpy, num_batches_per_epoch=5)
    want = next(iter(gl.TrainDataLoader(ds, **kw)))
    with TrainDataLoader(ds, num_workers=2, seed=2, **kw) as dl:
        batches = list(dl)
    assert len(batches) == 5
    assert want["past_time_feat"].shape[1:] == (21, 4 + 1 + 2)
    static = {r["item_id"]: (r["feat_static_cat"], r["feat_static_real"]) for r in recs}
    for got in batches:
        assert list(got.keys()) == list(want.keys())
        for k, w in want.items():
            if isinstance(w, np.ndarray):
                assert (got[k].shape, got[k].dtype) == (w.shape, w.dtype), k
            else:
                assert [type(x) for x in got[k]] == [type(x) for x in w], k
        for r, iid in enumerate(got["item_id"]):
            np.testing.assert_array_equal(got["feat_static_cat"][r], static[iid][0])
            np.testing.assert_array_equal(got["feat_static_real"][r],
                                          np.float32(static[iid][1]))


@pytest.mark.parametrize("Loader,is_train", [(ValidationDataLoader, True),
                                             (InferenceDataLoader, False)])
def test_each_series_exactly_once_with_item_ids_and_is_train(tmp_path, Loader, is_train):
    ds = h.file_dataset(tmp_path, h.records(10, 5, int_ids=True))
    dl = Loader(ds, transform=h.default_transformation(), batch_size=4, stack_fn=stack_numpy,
                num_workers=2)
    batches = list(dl)
    assert all(x is is_train for b in batches for x in b["is_train"])
    assert [b["item_id"] for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    again = list(dl)  # a second pass gives the same batches
    assert_same_batches(again, batches)


@pytest.mark.parametrize("Loader", [TrainDataLoader, ValidationDataLoader,
                                    InferenceDataLoader])
@pytest.mark.parametrize("kind", ["list", "ListDataset", "FileDataset"])
def test_an_empty_dataset_gives_no_batches(tmp_path, Loader, kind):
    ds = {"list": lambda: [], "ListDataset": lambda: h.list_dataset([]),
          "FileDataset": lambda: h.file_dataset(tmp_path, [])}[kind]()
    dl = Loader(ds, transform=h.default_transformation(), batch_size=4, stack_fn=stack_numpy,
                num_workers=2)
    assert list(itertools.islice(dl, 3)) == []
    assert list(itertools.islice(dl, 3)) == []  # and again
    if Loader is TrainDataLoader:
        dl.close()


def test_shuffling_is_seeded_and_mixes_the_entries():
    recs = h.list_dataset(h.records(40, 5))
    kw = dict(transform=h.default_transformation(), batch_size=10, stack_fn=stack_numpy,
              num_batches_per_epoch=4)

    def order(workers=1, **more):
        with TrainDataLoader(recs, num_workers=workers, **kw, **more) as dl:
            return [i for b in dl for i in b["item_id"]]

    assert order(seed=1) == [f"s{i}" for i in range(40)]  # no buffer: dataset order
    a, b, c = (order(shuffle_buffer_length=16, seed=s) for s in (1, 1, 2))
    assert a == b
    assert a != c
    # GluonTS's PseudoShuffled over the cycled data: the k-th entry out is one of the
    # first k + 16 in, so it is never more than 15 places early; most are distinct.
    assert all(int(x[1:]) - k <= 15 for k, x in enumerate(a))
    assert len(set(a)) > 25 and a != sorted(a)
    # Two workers: each batches its own windows, the same ones for the same seed.
    a2, b2 = (order(2, shuffle_buffer_length=16, seed=1) for _ in range(2))
    assert a2 == b2 and sorted(a2[:20]) == sorted(a[:20])


def test_windows_depend_on_the_seed_not_on_the_number_of_workers():
    # A stateless random sampler: each entry's windows come from (seed, entry, pass) only.
    recs = h.list_dataset(h.records(9, 80))
    chain = h.deepar_chain(context=8, pred=4, sampler=h.samplers(4)["uniform"])

    def windows(workers, seed):
        val = ValidationDataLoader(recs, transform=chain, batch_size=5, stack_fn=stack_numpy,
                                   seed=seed, num_workers=workers, fast_path=False)
        return [(i, str(p)) for b in val for i, p in zip(b["item_id"], b["forecast_start"])]

    one, two, other = windows(1, 5), windows(2, 5), windows(2, 6)
    assert len(one) > 9
    assert one == two
    assert one != other


def test_a_transformation_error_is_raised_with_its_type_and_the_worker_traceback():
    recs = h.list_dataset(h.records(6, 5))
    chain = h.FailOn("s4") + h.default_transformation()
    dl = ValidationDataLoader(recs, transform=chain, batch_size=2, stack_fn=stack_numpy,
                              num_workers=2)
    with pytest.raises(h.Boom, match="cannot transform s4") as ei:
        list(dl)
    assert "map_transform" in str(ei.value.__cause__)


@pytest.mark.parametrize("cached", [True, False])
def test_what_gluonts_caches_is_computed_once_per_entry_in_each_worker(cached):
    # Cached(TransformedDataset) is what an estimator's train(..., cache_data=True) builds.
    data = h.CountCalls().apply(h.list_dataset(h.records(6, 5)))
    with TrainDataLoader(Cached(data) if cached else data,
                         transform=h.default_transformation(), batch_size=4,
                         stack_fn=stack_numpy, num_batches_per_epoch=9, num_workers=2) as dl:
        batches = list(dl)  # 36 windows: each of the 6 entries 6 times
    stamps: dict = {}
    for b in batches:
        for i, c in zip(b["item_id"], b["calls"]):
            stamps.setdefault(i, set()).add(c)
    assert len(stamps) == 6
    if cached:
        assert all(len(s) == 1 for s in stamps.values()), stamps
    else:
        assert all(len(s) >= 5 for s in stamps.values()), stamps


def test_num_workers_zero_is_gluonts_own_loader():
    recs = h.list_dataset(h.records(6, 5))
    dl = ValidationDataLoader(recs, transform=h.default_transformation(), batch_size=4,
                              stack_fn=stack_numpy, num_workers=0)
    want = list(gl.ValidationDataLoader(recs, transform=h.default_transformation(),
                                        batch_size=4, stack_fn=stack_numpy))
    assert_same_batches(list(dl), want)
