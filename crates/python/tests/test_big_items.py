"""Items of any size through Python pipelines and the time-series loaders (issue 18): arrays
far larger than a pool block, long real-length series, a single 200,000-point series."""

import numpy as np
import pytest

import shmpipe
from big_steps import grow, scale
from series_files import write_hourly_series
from shmpipe.timeseries import TestLoader, TrainLoader, ValidationLoader


def test_arrays_far_larger_than_a_block_cross_both_ways():
    sizes = [16, 300_000, 3_000_000, 1_000, 1_500_000]
    src = [{"n": i, "x": np.arange(n, dtype=np.float32)} for i, n in enumerate(sizes)]
    out = list(shmpipe.Pipeline(src, steps=[scale, grow], workers=2, ordered=True))
    assert [o["n"] for o in out] == list(range(len(sizes)))
    for o, n in zip(out, sizes):
        np.testing.assert_array_equal(o["x"], np.arange(n, dtype=np.float32) * 2)
        assert o["big"].shape == (6_000_000,) and o["big"][-1] == o["n"]


def test_an_explicitly_limited_channel_says_so_in_python_terms():
    src = [{"n": i} for i in range(2)]
    with pytest.raises(shmpipe.PipelineError) as e:
        list(shmpipe.Pipeline(src, steps=[grow], workers=1, channel=(0, 8, 1 << 20, 0)))
    msg = str(e.value)
    assert "channel=" in msg and "large_pool" in msg, msg
    assert "lost a peer" not in msg and "ChannelGeometry" not in msg, msg


KW = dict(freq="H", context_length=168, prediction_length=24)


@pytest.mark.parametrize("shape", ["many", "one"])
def test_loaders_on_long_series_and_one_very_long_series(tmp_path, shape):
    path = str(tmp_path / "data.jsonl")
    if shape == "many":
        n = 40
        write_hourly_series(path, n, 500, 5000)
    else:
        n = 1
        write_hourly_series(path, n, 200_000, 200_000)  # ~3.8 MB: one line far over a pool block
    train = TrainLoader(path, batch_size=8, workers=2, num_batches_per_epoch=3, **KW)
    try:
        batches = list(train)
        assert len(batches) == 3
        for b in batches:
            assert b["past_target"].shape == (8, 168) and b["future_target"].shape == (8, 24)
            assert not np.isnan(b["past_target"]).any()
    finally:
        train.close()
    for Loader in (ValidationLoader, TestLoader):
        rows = [b["past_target"] for b in Loader(path, batch_size=32, workers=2, **KW)]
        assert sum(r.shape[0] for r in rows) == n, Loader.__name__
        assert all(r.shape[1] == 168 and r.dtype == np.float32 for r in rows)


def _windows(path, workers, seed):
    """Every training window of one shuffled pass, as TrainLoader draws them (the same step and
    arguments, one epoch; a worker's last partial batch comes out at the end)."""
    args = dict(KW, batch_size=8, num_instances=2.0, fused=True, data_path=path)
    src = shmpipe.NamedSource("gluonts_lines", {"path": path})
    rows = []
    for b in shmpipe.Pipeline(src, steps=[("gluonts_train", args)], workers=workers,
                              seed=seed, epochs=1, shuffle=True):
        rows += [p.tobytes() + f.tobytes() for p, f in zip(b["past_target"], b["future_target"])]
    return sorted(rows)


def test_one_seed_gives_the_same_training_windows_for_1_and_2_workers(tmp_path):
    path = str(tmp_path / "data.jsonl")
    write_hourly_series(path, 30, 500, 5000)
    one = _windows(path, 1, seed=3)
    assert len(one) > 30, len(one)
    assert _windows(path, 2, seed=3) == one
    assert _windows(path, 1, seed=4) != one, "another seed, other windows"


def test_a_named_channel_block_limit_names_the_python_parameter(chan_name):
    tx = shmpipe.Sender.create(chan_name, block_size=1 << 20)
    with pytest.raises(ValueError) as e:
        tx.send({"x": np.zeros(1 << 19, dtype=np.float32)})  # 2 MiB
    msg = str(e.value)
    assert "block_size=" in msg and "2097152" in msg, msg
    assert "ChannelConfig" not in msg and "::" not in msg, msg
    with pytest.raises(ValueError, match="block_size="):
        tx.loan((1 << 19,), np.float32)
