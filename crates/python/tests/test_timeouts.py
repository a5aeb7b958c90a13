"""Seconds given to the bindings (``timeout=``, ``warn_idle=``): infinity and values beyond the
clock's range mean "no limit"; NaN and negative values are a ValueError naming the parameter.
None of them may panic in the Rust conversion (``Duration::from_secs_f64``, ``Instant + d``)."""

import math

import numpy as np
import pytest

import shmpipe
from pipeline_steps import add_1

NO_LIMIT = [math.inf, 1e300, 1e18]
BAD = [math.nan, -1.0, -math.inf]


@pytest.mark.parametrize("t", NO_LIMIT)
def test_no_limit_timeouts_of_a_channel_wait_as_long_as_needed(chan_name, t):
    tx = shmpipe.Sender.create(chan_name)
    rx = shmpipe.Receiver.open(chan_name, timeout=t)
    assert tx.wait_for_consumer(timeout=t) > 0
    tx.send({"x": np.arange(4, dtype=np.float32)}, timeout=t)
    buf = tx.loan((4,), np.float32, timeout=t)
    buf[:] = 7
    tx.send({"y": buf}, timeout=t)
    assert rx.recv(timeout=t)["x"].sum() == 6
    assert rx.recv(timeout=t)["y"].sum() == 28


@pytest.mark.parametrize("t", BAD)
def test_nan_and_negative_timeouts_of_a_channel_name_the_parameter(chan_name, t):
    tx = shmpipe.Sender.create(chan_name)
    with pytest.raises(ValueError, match="timeout="):
        shmpipe.Receiver.open(chan_name, timeout=t)
    rx = shmpipe.Receiver.open(chan_name)
    for call in (lambda: rx.recv(timeout=t),
                 lambda: tx.wait_for_consumer(timeout=t),
                 lambda: tx.send({"x": np.zeros(4)}, timeout=t),
                 lambda: tx.loan((4,), np.float32, timeout=t)):
        with pytest.raises(ValueError, match="timeout="):
            call()


@pytest.mark.parametrize("t", NO_LIMIT)
def test_no_limit_timeouts_of_a_pipeline_wait_as_long_as_needed(t):
    with shmpipe.Pipeline([add_1], workers=0) as p:
        p.enqueue(3, timeout=t)
        assert p.dequeue(timeout=t) == 4


def test_a_warn_idle_beyond_the_clock_is_no_limit():
    with shmpipe.Pipeline([add_1], workers=0, warn_idle=1e300) as p:
        p.enqueue(3)
        assert p.dequeue(timeout=5) == 4


@pytest.mark.parametrize("t", BAD)
def test_nan_and_negative_timeouts_of_a_pipeline_name_the_parameter(t):
    with shmpipe.Pipeline([add_1], workers=0) as p:
        with pytest.raises(ValueError, match="timeout="):
            p.enqueue(3, timeout=t)
        with pytest.raises(ValueError, match="timeout="):
            p.dequeue(timeout=t)


@pytest.mark.parametrize("w", BAD)
def test_nan_and_negative_warn_idle_name_the_parameter_at_construction(w):
    with pytest.raises(ValueError, match="warn_idle="):
        shmpipe.Pipeline([add_1], workers=0, warn_idle=w)


@pytest.mark.parametrize("w", [math.inf, None])
def test_warn_idle_inf_or_none_is_never(w):
    """JSON has no infinity: `float('inf')` used to fail the spec's parsing at the start."""
    with shmpipe.Pipeline([add_1], workers=0, warn_idle=w) as p:
        p.enqueue(3)
        assert p.dequeue(timeout=5) == 4


def test_receiver_open_of_a_missing_name_with_a_bad_timeout_names_it(chan_name):
    """Before main's timeout helper, `Receiver.open(timeout=nan or -1)` meant "no wait"."""
    for t in BAD:
        with pytest.raises(ValueError, match="timeout="):
            shmpipe.Receiver.open(chan_name, timeout=t)
