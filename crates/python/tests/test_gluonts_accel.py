"""The native AddTimeFeatures of shmpipe.gluonts's workers equals GluonTS's, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gluonts")
pd = pytest.importorskip("pandas")

from gluonts.dataset import loader as gl  # noqa: E402
from gluonts.time_feature import _base  # noqa: E402
from gluonts.transform import AddTimeFeatures, Chain  # noqa: E402

import gluonts_helpers as h  # noqa: E402
from shmpipe.gluonts import ValidationDataLoader  # noqa: E402
from shmpipe.gluonts._accel import _NAMES, accelerate  # noqa: E402
from test_gluonts import assert_same_batches, stack_numpy  # noqa: E402

FEATURES = [getattr(_base, n) for n in _NAMES]


@pytest.mark.parametrize("freq", ["s", "min", "h", "D"])
@pytest.mark.parametrize("is_train", [True, False])
def test_native_time_features_equal_gluonts(freq, is_train):
    rng = np.random.default_rng(hash((freq, is_train)) % 2**32)
    orig = AddTimeFeatures(start_field="start", target_field="target",
                           output_field="time_feat", time_features=FEATURES, pred_length=7)
    native = accelerate(orig)
    assert type(native).__name__ == "NativeTimeFeatures"
    # Starts over 1970-2100 (leap years, year ends, ISO week 53) and lengths up to 3,000.
    for _ in range(25):
        t = pd.Timestamp("1970-01-01") + pd.Timedelta(seconds=int(rng.integers(0, 4.1e9)))
        entry = {"start": pd.Period(t, freq), "target": np.zeros(int(rng.integers(1, 3000)))}
        want = orig.map_transform(dict(entry), is_train)["time_feat"]
        got = native.map_transform(dict(entry), is_train)["time_feat"]
        assert got.dtype == want.dtype == np.float32
        np.testing.assert_array_equal(got, want, err_msg=f"{entry['start']}")


def test_only_gluonts_own_features_at_float32_are_replaced():
    def mine(index):
        return np.zeros(len(index))

    kw = dict(start_field="start", target_field="target", output_field="time_feat",
              pred_length=3)
    for t in (AddTimeFeatures(time_features=[_base.hour_of_day, mine], **kw),
              AddTimeFeatures(time_features=[_base.hour_of_day], dtype=np.float64, **kw),
              AddTimeFeatures(time_features=[], **kw)):
        assert accelerate(t) is t
    c = accelerate(Chain([h.WriteIsTrain(), AddTimeFeatures(time_features=FEATURES, **kw)]))
    assert [type(s).__name__ for s in c.transformations] == ["WriteIsTrain",
                                                             "NativeTimeFeatures"]
    # a weekly start is not a fixed-length unit: GluonTS's own code runs
    native = accelerate(AddTimeFeatures(time_features=FEATURES, **kw))
    e = {"start": pd.Period("2021-03-01", "W"), "target": np.zeros(20)}
    np.testing.assert_array_equal(
        native.map_transform(dict(e), True)["time_feat"],
        AddTimeFeatures(time_features=FEATURES, **kw).map_transform(dict(e), True)["time_feat"])


def test_a_user_chain_with_native_time_features_gives_gluonts_batches(tmp_path):
    ds = h.file_dataset(tmp_path, h.records(9, 300, nan=0.05, min_len=100))
    chain = h.LogScale() + h.deepar_chain(context=48, pred=12,
                                          sampler=h.samplers(12)["validation"])
    dl = ValidationDataLoader(ds, transform=chain, batch_size=4, stack_fn=stack_numpy)
    assert not dl.fast_path and dl.why_not_fast
    want = list(gl.ValidationDataLoader(ds, transform=chain, batch_size=4,
                                        stack_fn=stack_numpy))
    assert_same_batches(list(dl), want)
