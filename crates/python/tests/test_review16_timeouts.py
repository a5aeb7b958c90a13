"""Issue 16 review (review-16): a finite but huge timeout is a valid "wait a long time", never
a Rust panic (`Duration::from_secs_f64` and `Instant + Duration` panic on overflow).

Seen failing at 0e049fd (PanicException "cannot convert float seconds to Duration" and
"overflow when adding duration to instant"); main's `crate::timeout` (ring-claim) fixed all
but `warn_idle=float('inf')`: the spec travels as JSON, `json.dumps` writes `Infinity`, and
serde_json refuses it ("ValueError: expected value at line 1 column 402")."""

import numpy as np
import pytest

import shmpipe

HUGE = [1e300, 1e19, 2.0**64]


@pytest.mark.parametrize("t", HUGE)
def test_review16_recv_with_a_huge_finite_timeout_returns_the_waiting_message(t):
    tx = shmpipe.Sender.anonymous(blocks=2, block_size=4096)
    rx = shmpipe.Receiver.from_fd(tx.fileno())
    try:
        tx.send({"x": np.arange(4, dtype=np.float32)})
        m = rx.recv(timeout=t)
        assert m["x"].tolist() == [0, 1, 2, 3]
    finally:
        rx.close()
        tx.close()


@pytest.mark.parametrize("t", HUGE)
def test_review16_send_and_loan_with_a_huge_finite_timeout(t):
    tx = shmpipe.Sender.anonymous(blocks=2, block_size=4096)
    rx = shmpipe.Receiver.from_fd(tx.fileno())
    try:
        a = tx.loan((256,), np.float32, timeout=t)
        a[:] = 1
        tx.send({"x": a}, timeout=t)
        assert rx.recv(timeout=5)["x"].sum() == 256
    finally:
        rx.close()
        tx.close()


def _double(item):
    item["n"] = item["n"] * 2
    return item


@pytest.mark.parametrize("t", HUGE)
def test_review16_pipeline_enqueue_dequeue_with_a_huge_finite_timeout(t):
    p = shmpipe.Pipeline(None, [_double], workers=0)
    try:
        p.enqueue({"n": 2}, timeout=t)
        assert p.dequeue(timeout=t)["n"] == 4
    finally:
        p.close()


@pytest.mark.parametrize("w", [float("inf"), 1e300])
def test_review16_pipeline_warn_idle_never_panics(w):
    """warn_idle= "never warn" (inf) or a huge number: runs, or a ValueError naming it."""
    try:
        p = shmpipe.Pipeline([{"n": 1}], [_double], workers=0, warn_idle=w)
    except ValueError as e:
        assert "warn_idle" in str(e)
        return
    try:
        assert [o["n"] for o in p] == [2]
    finally:
        p.close()
