"""What a new user's first session ran into (trial of 2026-12-04): each error names the Python
parameter and says what applies, at the call that is wrong."""

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import shmpipe
from shmpipe.timeseries import TestLoader, TrainLoader, ValidationLoader

from pipeline_steps import double, items

HERE = __import__("os").path.dirname(__import__("os").path.abspath(__file__))


def _series(n=4, length=100):
    rng = np.random.default_rng(0)
    return [{"start": "2021-01-01 00:00:00", "item_id": f"s{i}",
             "target": rng.random(length).astype(np.float32)} for i in range(n)]


LOADER_KW = dict(context_length=8, prediction_length=4, batch_size=2)


@pytest.mark.parametrize("loader", [TrainLoader, ValidationLoader, TestLoader])
def test_a_bad_freq_is_refused_at_construction_naming_freq(loader):
    with pytest.raises(ValueError, match=r'freq="hourly".*supported: .*min, h, D'):
        loader(_series(), freq="hourly", **LOADER_KW)


def test_recv_on_a_quiet_live_sender_says_no_message_came_within_timeout(chan_name):
    tx = shmpipe.Sender.create(chan_name)
    rx = shmpipe.Receiver.open(chan_name)
    try:
        for call in (lambda: rx.recv(timeout=0.3), lambda: rx.recv_many(timeout=0.3)):
            with pytest.raises(TimeoutError) as e:
                call()
            assert "no message came within timeout=0.3 s" in str(e.value)
            assert "sender is alive" in str(e.value)
            assert "peer did not answer" not in str(e.value)
    finally:
        rx.close()
        tx.close()


def test_linger_0_closes_an_unopened_named_sender_at_once(chan_name):
    tx = shmpipe.Sender.create(chan_name, linger=0)
    tx.send({"x": np.arange(4.0)})
    t = time.monotonic()
    tx.close()
    assert time.monotonic() - t < 1.0


def test_the_default_linger_lets_a_late_receiver_open(chan_name):
    tx = shmpipe.Sender.create(chan_name)
    tx.send({"x": np.arange(4.0)})
    closer = threading.Thread(target=tx.close)
    closer.start()  # blocks: nobody opened the channel yet
    try:
        time.sleep(0.5)
        assert closer.is_alive(), "close() did not linger for a receiver"
        with shmpipe.Receiver.open(chan_name, timeout=5) as rx:
            np.testing.assert_array_equal(rx.recv(timeout=5)["x"], np.arange(4.0))
    finally:
        closer.join(15)
    assert not closer.is_alive()


@pytest.mark.parametrize("linger", [-1.0, float("nan"), float("inf")])
def test_a_bad_linger_names_it(chan_name, linger):
    with pytest.raises(ValueError, match="linger="):
        shmpipe.Sender.create(chan_name, linger=linger)


def test_iterating_an_unfed_pipeline_without_a_source_says_what_to_call():
    code = textwrap.dedent("""
        import sys, threading, time
        sys.path.insert(0, sys.argv[1])
        import shmpipe
        from pipeline_steps import double, items
        with shmpipe.Pipeline([double], workers=1, warn_idle=0.5) as p:
            def feed():
                time.sleep(2.0)
                print("FED", file=sys.stderr, flush=True)
                p.enqueue(items(1)[0])
                p.close_input()
            threading.Thread(target=feed).start()
            assert len(list(p)) == 1
    """)
    r = subprocess.run([sys.executable, "-c", code, HERE], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    note = r.stderr.split("FED")[0]
    assert "iterating" in note and "enqueue(...)" in note and "close_input()" in note, note


def test_num_workers_is_an_alias_of_workers_in_pipeline():
    out = list(shmpipe.Pipeline(items(3), [double], num_workers=0))
    assert sorted(o["n"] for o in out) == [0, 1, 2]
    with pytest.raises(TypeError, match=r"workers=1 and num_workers=2"):
        shmpipe.Pipeline(items(3), [double], workers=1, num_workers=2)


def test_num_workers_is_an_alias_of_workers_in_the_timeseries_loaders():
    with TrainLoader(_series(), freq="h", num_batches_per_epoch=1, num_workers=1,
                     **LOADER_KW) as dl:
        assert dl._pipe_kw["workers"] == 1
        assert next(iter(dl))["past_target"].shape == (2, 8)
    with ValidationLoader(_series(), freq="h", num_workers=3, **LOADER_KW) as dl:
        assert dl._pipe_kw["workers"] == 3
    for loader in (TrainLoader, TestLoader):
        with pytest.raises(TypeError, match=r"workers=1 and num_workers=2"):
            loader(_series(), freq="h", workers=1, num_workers=2, **LOADER_KW)


def test_a_rank_out_of_range_names_shard_and_the_range():
    with pytest.raises(ValueError, match=r"shard=\(2, 2\).*rank.*0\.\.1"):
        shmpipe.Pipeline(items(3), [double], shard=(2, 2))
