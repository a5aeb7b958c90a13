"""The GluonTS loader from Python, against fixtures written by GluonTS 0.17 itself
(crates/timeseries/tests/fixtures, made by tools/gluonts_fixtures.py)."""

import json
import os

import numpy as np
import pytest

import shmpipe
from shmpipe.timeseries import TestLoader, TrainLoader, ValidationLoader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FIXTURES = os.path.join(ROOT, "crates", "timeseries", "tests", "fixtures", "gluonts_transforms.json")


def cases():
    with open(FIXTURES) as f:
        d = json.load(f)
    return [c for c in d["cases"]
            if c["sampler"]["kind"] in ("validation", "test") and c["batch"]
            and c["target_ndim"] == 1 and c["vstack_inputs"] == ["time_feat", "feat_dynamic_age"]]


@pytest.mark.parametrize("case", cases(), ids=lambda c: c["name"])
def test_validation_and_test_batches_match_gluonts(case, tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(line + "\n" for line in case["lines"]))
    Loader = ValidationLoader if case["sampler"]["kind"] == "validation" else TestLoader
    loader = Loader(str(path), freq=case["freq"], context_length=case["past_length"],
                    prediction_length=case["pred_length"], batch_size=64)
    batches = list(loader)
    assert len(batches) == 1
    got = batches[0]
    for name, want in case["batch"].items():
        a = got[name]
        assert a.dtype == np.float32, name
        assert list(a.shape) == want["shape"], name
        np.testing.assert_allclose(a.ravel(), np.array(want["data"], dtype=np.float32),
                                   rtol=0, atol=1e-6, err_msg=f"{case['name']}: {name}")


def _series(n, length, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = rng.random(length).astype(np.float32) * 10
        t[rng.random(length) < 0.05] = np.nan
        out.append({"start": "2021-01-01 00:00:00", "item_id": f"s{i}", "target": t})
    return out


def test_train_loader_over_a_list_of_dicts_yields_gluonts_layouts():
    loader = TrainLoader(_series(40, 300), freq="h", context_length=48, prediction_length=12,
                         batch_size=8, num_batches_per_epoch=5, workers=2)
    try:
        for _ in range(2):  # two epochs from the same endless stream
            batches = list(loader)
            assert len(batches) == 5
            for b in batches:
                assert b["past_target"].shape == (8, 48) and b["past_target"].dtype == np.float32
                assert b["future_target"].shape == (8, 12)
                assert b["past_time_feat"].shape[:2] == (8, 48) and b["past_time_feat"].ndim == 3
                assert b["past_observed_values"].shape == (8, 48)
                assert set(np.unique(b["past_observed_values"])) <= {0.0, 1.0}
                assert not np.isnan(b["past_target"]).any(), "missing values are imputed"
    finally:
        loader.close()


def test_torch_from_numpy_on_a_batch_without_warnings():
    torch = pytest.importorskip("torch")
    import warnings
    loader = TrainLoader(_series(10, 200), freq="h", context_length=24, prediction_length=6,
                         batch_size=4, num_batches_per_epoch=1, workers=1)
    b = next(iter(loader))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = torch.from_numpy(b["past_target"])
    assert tuple(t.shape) == (4, 24)
    loader.close()
