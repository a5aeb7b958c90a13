"""Reproducers found by trying shmpipe as a new user would (trial-18, 2026-12-04)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shmpipe

WORKERS0_BIG = textwrap.dedent(
    """
    import numpy as np, shmpipe

    def ident(item):
        return item

    if __name__ == "__main__":
        big = np.arange(16 * 1024 * 1024 // 8, dtype=np.float64)   # 16 MiB: 15.9 MiB works
        out = list(shmpipe.Pipeline([{"x": big}], steps=[ident], workers=0))
        assert np.array_equal(out[0]["x"], big)
        print("done", flush=True)
    """
)


def test_trial_workers0_iterates_an_item_of_16_mib(tmp_path, kill_on_exit):
    # Seen: the parent spins at 100% CPU in next_in_epoch() for ever and ignores SIGINT
    # (workers=2, enqueue/dequeue with workers=0 and 15.9 MiB all finish in < 1 s).
    script = tmp_path / "big0.py"
    script.write_text(WORKERS0_BIG)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    kill_on_exit.append(p)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("workers=0 with a 16 MiB item did not finish in 60 s (hang)")
    assert p.returncode == 0, err
    assert "done" in out


def test_trial_busy_error_after_close_does_not_say_close_it(chan_name):
    # By design (shm-ring channel/claim.rs) a Receiver that closed ended the stream and the
    # channel takes no other. The error then says "another Receiver (pid <our own pid>) is
    # attached to this channel: ... close() that one first": advice that cannot help.
    tx = shmpipe.Sender.create(chan_name)
    try:
        rx = shmpipe.Receiver.open(chan_name, timeout=2)
        rx.close()
        del rx
        with pytest.raises(Exception) as ei:
            shmpipe.Receiver.open(chan_name, timeout=2)
        msg = str(ei.value)
        assert "close() that one first" not in msg, msg
        assert "closed" in msg, msg
    finally:
        tx.close()


def _write_series(path, n_series=20, n=2000):
    import json

    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for i in range(n_series):
            t = rng.normal(size=n).round(3).tolist()
            f.write(json.dumps({"start": "2020-01-01 00:00", "target": t,
                                "item_id": f"s{i}"}) + "\n")


def test_trial_train_loader_item_ids_are_a_list(tmp_path):
    # Seen: batch["item_ids"] == '["s23","s117","s187","s45"]', a JSON string.
    from shmpipe.timeseries import TrainLoader

    path = tmp_path / "ts.jsonl"
    _write_series(path)
    loader = TrainLoader(str(path), freq="H", context_length=24, prediction_length=6,
                         batch_size=4, workers=1, num_batches_per_epoch=1)
    try:
        batch = next(iter(loader))
    finally:
        loader.close()
    assert isinstance(batch["item_ids"], list), repr(batch["item_ids"])
    assert len(batch["item_ids"]) == 4


def test_trial_train_loader_is_a_context_manager(tmp_path):
    # Pipeline and shmpipe.gluonts' loaders are; shmpipe.timeseries.TrainLoader raises
    # TypeError: 'TrainLoader' object does not support the context manager protocol.
    from shmpipe.timeseries import TrainLoader

    path = tmp_path / "ts.jsonl"
    _write_series(path)
    with TrainLoader(str(path), freq="H", context_length=24, prediction_length=6,
                     batch_size=4, workers=1, num_batches_per_epoch=2) as loader:
        assert sum(1 for _ in loader) == 2
