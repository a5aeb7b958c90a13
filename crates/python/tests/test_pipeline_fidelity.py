"""Items come back from worker processes as they went in: shapes (0-d included), dtypes,
Python scalar types, None, bytes, nested dicts, lists and tuples; what cannot travel is
refused with a message naming the key and the fix."""

import math

import numpy as np
import pytest

import shmpipe
from fidelity_steps import same, sign, signature, to_set


def assert_same(a, b, where="item"):
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, dict):
        assert list(a) == list(b) or set(a) == set(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype, where
        assert a == b or (a != a and b != b), where
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


def rich(i):
    """Everything an item may hold, varied with i."""
    big = np.arange(40_000, dtype=np.float32) + i  # 160 KB: crosses zero-copy
    return {
        "n": i,
        "x": np.full(5, i, np.float32),
        "zero_d": np.array(i * 1.5, np.float64),
        "zero_d_bool": np.array(i % 2 == 0),
        "mask": np.arange(6).reshape(2, 3) % (i + 2) == 0,
        "empty": np.zeros((3, 0, 2), np.int16),
        "strided": np.arange(20, dtype=np.int64)[::3],
        "fortran": np.asfortranarray(np.arange(6, dtype=np.uint8).reshape(2, 3)),
        "big": big,
        "f16": np.array([0.5, i], np.float16),
        "np_f32": np.float32(i + 0.25),
        "np_i64": np.int64(-i),
        "np_bool": np.bool_(i % 3 == 0),
        "flag": i % 2 == 1,
        "none": None,
        "huge": 2 ** 70 + i,
        "neg": -(2 ** 63),
        "pi": 3.5 + i,
        "nan": float("nan"),
        "inf": -math.inf,
        "text": f"héllo {i}",
        "long_text": "é" * 40_000,  # 80 KB of UTF-8: over a metadata string's limit
        "raw": bytes(range(i, i + 5)),
        "nested": {"id": f"s{i}", "tags": ["a", None, 3, 2.5, True],
                   "arrays": [np.arange(3), np.ones((2, 2), bool)],
                   "deeper": {"pair": (1, "b"), "empty": {}, "nothing": []}},
        "a/0": "a key that looks like a nested field's path",
        "__shmpipe_py__": "a key named like the item's description field",
        "k" * 300: np.arange(2),  # a key longer than a field name may be
    }


@pytest.mark.parametrize("workers", [1, 2])
def test_rich_items_round_trip_through_workers(workers):
    src = [rich(i) for i in range(12)]
    out = list(shmpipe.Pipeline(src, steps=[same], workers=workers, ordered=True))
    assert len(out) == len(src)
    for want, got in zip(src, out):
        assert_same(want, got)


def test_the_worker_sees_the_same_types_as_the_parent():
    src = [rich(i) for i in range(4)]
    out = list(shmpipe.Pipeline(src, steps=[sign], workers=2, ordered=True))
    for want, got in zip(src, out):
        assert got["sig"] == signature(want)
        assert_same(want, got["item"])


def test_items_that_are_not_dicts_travel_as_themselves():
    src = [3, 2.5, "text", np.arange(4, dtype=np.int8), np.float32(1.5), np.array(True),
           {"d": 1}, 2 ** 80, b"bytes"]
    out = list(shmpipe.Pipeline(src, steps=[same], workers=2, ordered=True))
    assert len(out) == len(src)
    for want, got in zip(src, out):
        assert_same(want, got)


def test_large_arrays_in_nested_items_still_cross_zero_copy():
    src = [{"deep": [{"x": np.full(1 << 16, i, np.float32)}]} for i in range(6)]
    # The first three received are read in place (a consumer pins at most part of a
    # worker's pool: outputs received while it holds more, e.g. prefetched ones, are copied).
    n = 0
    for i, o in enumerate(shmpipe.Pipeline(src, steps=[same], workers=1, ordered=True)):
        x = o["deep"][0]["x"]
        assert x[0] == i and x.flags.writeable and x.shape == (1 << 16,)
        if i < 3:
            assert isinstance(x.base, shmpipe._native.ItemLease), "read in place"
        n += 1
    assert n == len(src)


@pytest.mark.parametrize("value, needle", [
    (np.array([1 + 2j]), "complex128 cannot cross processes: split it into real and imaginary"),
    (np.array(["a", "b"]), "keep strings as str values"),
    (np.array([object()]), "dtype object cannot cross processes"),
    ({1, 2}, "a builtins.set cannot cross processes"),
    ({"inner": {3: "x"}}, "key 3 is a int: keys"),
    ([np.datetime64("2020-01-01")], "datetime64"),
])
def test_what_cannot_travel_is_refused_at_the_source_with_key_and_fix(value, needle):
    src = [{"n": 0, "v": 1}, {"n": 1, "v": value}]
    with pytest.raises(TypeError) as ei:
        list(shmpipe.Pipeline(src, steps=[same], workers=1))
    msg = str(ei.value)
    assert msg.startswith("source item 1: item['v']"), msg
    assert needle in msg, msg
    assert "items hold numpy arrays" in msg or "keys" in msg, msg


def test_a_step_output_that_cannot_travel_is_a_step_error_saying_so():
    with pytest.raises(shmpipe.StepError) as ei:
        list(shmpipe.Pipeline([{"n": 1}], steps=[to_set], workers=1))
    e = ei.value
    assert e.step == "to_set"
    assert "the step's output cannot cross processes" in e.message
    assert "item['s']: a builtins.set cannot cross processes" in e.message


def test_non_str_keys_are_refused():
    with pytest.raises(TypeError, match=r"source item 0: item key 1 is a int: item keys are str"):
        list(shmpipe.Pipeline([{1: np.zeros(2)}], steps=[same], workers=1))


def test_items_larger_than_an_explicit_small_channel_block_travel():
    # Before the bigitems branch this raised a PipelineError naming channel=(...) in Python
    # terms (crates/python/src/pipeline_errors.rs, python_terms); items of any size now travel in the
    # pipeline's large size class, whatever the channel.
    src = [{"x": np.full(100_000, i, np.float32)} for i in range(3)]
    out = list(shmpipe.Pipeline(src, steps=[same], workers=1, channel=(0, 4, 64 << 10),
                                ordered=True))
    assert [float(o["x"][0]) for o in out] == [0.0, 1.0, 2.0]
    assert all(o["x"].shape == (100_000,) and o["x"].dtype == np.float32 for o in out)
