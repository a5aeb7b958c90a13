"""The workers' windows-only DeepAR steps (``_core``) give GluonTS's windows exactly."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

pytest.importorskip("gluonts")
pd = pytest.importorskip("pandas")

from gluonts.dataset.common import ProcessDataEntry  # noqa: E402
from gluonts.transform import InstanceSampler, MapTransformation  # noqa: E402

import gluonts_helpers as h  # noqa: E402
from shmpipe.gluonts import TrainDataLoader  # noqa: E402
from shmpipe.gluonts._accel import accelerate  # noqa: E402
from shmpipe.gluonts._core import fuse  # noqa: E402


class PastTheEnd(InstanceSampler):
    """Split points past the series' end and at its start (the splitter clips them)."""

    def __call__(self, ts: np.ndarray) -> np.ndarray:
        return np.array([0, ts.shape[-1] + 3])


class HasObserved(MapTransformation):
    """A user step writing a field the fused run also writes: those entries fall back."""

    def map_transform(self, data, is_train):
        if len(data["target"]) % 2:
            data["observed_values"] = np.zeros(3)
        data["note"] = len(data["target"])
        return data


def entries(freq, n=40, seed=0):
    rng = np.random.default_rng(seed)
    process = ProcessDataEntry(freq)
    out = []
    for i in range(n):
        ln = int(rng.choice([1, 5, 30, 61, 200, 3000]))
        t = pd.Timestamp("1999-12-31") + pd.Timedelta(minutes=int(rng.integers(0, 4e7)))
        y = [None if m else float(v) for v, m in zip(rng.gamma(2, 5, ln), rng.random(ln) < .1)]
        out.append(process({"start": str(t), "item_id": f"s{i}", "target": y}))
    return out


def assert_same_windows(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert list(g) == list(w)
        for k in w:
            assert type(g[k]) is type(w[k]), k
            if isinstance(w[k], np.ndarray):
                assert (g[k].dtype, g[k].shape) == (w[k].dtype, w[k].shape), k
                # bit for bit (the sign of zero included)
                np.testing.assert_array_equal(np.ascontiguousarray(g[k]).view(np.uint8),
                                              np.ascontiguousarray(w[k]).view(np.uint8), k)
            else:
                assert g[k] == w[k], k


def run(chain, es, is_train, seed=7):
    np.random.seed(seed)
    out = []
    for k, e in enumerate(es):
        np.random.seed(seed + k)  # as the workers seed each entry
        out += list(chain([dict(e)], is_train))
    return out


def fused(chain):
    f = fuse(accelerate(copy.deepcopy(chain)))
    assert "WindowsOnly" in [type(t).__name__ for t in f.transformations]
    return f


@pytest.mark.parametrize("freq", ["h", "D", "min", "s"])
@pytest.mark.parametrize("sampler", ["train", "validation", "test", "uniform", "exact", "past"])
def test_windows_equal_gluonts_chain(freq, sampler):
    smp = {**h.samplers(6), "exact": h.ExactlyOneSampler(), "past": PastTheEnd()}[sampler]
    es = entries(freq)
    for past, lead, dummy in ((24, 0, 0.0), (60, 3, 1.0)):
        chain = h.deepar_chain(freq=freq, context=24, pred=6, past=past, sampler=smp)
        chain.transformations[-1].lead_time = lead
        chain.transformations[-1].dummy_value = dummy
        for is_train in (True, False):
            if sampler == "test" and is_train:
                continue
            want = run(copy.deepcopy(chain), es, is_train)
            assert_same_windows(run(fused(chain), es, is_train), want)


def test_a_user_step_in_front_and_fallback_entries():
    es = entries("h") + [dict(e, start=pd.Period(e["start"], "W")) for e in entries("h", 5)]
    chain = HasObserved() + h.deepar_chain(context=24, pred=6, sampler=h.samplers(6)["train"])
    want = run(copy.deepcopy(chain), es, True)
    assert_same_windows(run(fused(chain), es, True), want)


def test_other_chains_are_left_alone():
    chain = h.deepar_chain(dynamic=True)  # feat_dynamic_real stacked too: not the run
    names = [type(t).__name__ for t in fuse(accelerate(copy.deepcopy(chain))).transformations]
    assert "WindowsOnly" not in names and "NativeTimeFeatures" in names


def test_training_loader_over_a_user_chain_gives_gluonts_batches(tmp_path):
    # Same seed for every entry: the per-entry seeding of the workers (entry_seed) makes
    # the draws differ from GluonTS's, so compare with num_workers=1 against in-process
    # runs of both chains with the workers' seeds.
    from shmpipe.gluonts._step import entry_seed

    recs = h.records(12, 400, nan=0.05, min_len=30)
    ds = h.file_dataset(tmp_path, recs)
    chain = h.LogScale() + h.deepar_chain(context=24, pred=6, past=40,
                                          sampler=h.samplers(6)["train"])
    with TrainDataLoader(ds, transform=chain, batch_size=4, stack_fn=lambda rows: rows,
                         num_batches_per_epoch=3, num_workers=1, seed=5) as dl:
        got = [w for b in dl for w in b]
    want = []
    plain = copy.deepcopy(chain)
    for i, e in enumerate(ds):
        s = entry_seed(5, i, 0)
        np.random.seed(s)
        random.seed(s)
        want += list(plain([e], True))
    assert_same_windows(got, want[:len(got)])
    assert len(got) == 12
