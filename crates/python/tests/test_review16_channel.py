"""Issue 16 review (review-16): the Python channel's batch receive keeps its bound."""

import numpy as np

import shmpipe


def test_review16_recv_many_stops_at_about_max_records_not_max_messages():
    """`recv_many(max_records=5)` documents "up to about max_records (whole messages: the last
    one may go over)": a first message of 50 records already goes over, so that is all. It
    passes `max_records` to shm-ring as a number of *messages*, so it returns 5 messages of
    50 records: 250."""
    tx = shmpipe.Sender.anonymous(slots=1024, blocks=4, block_size=1 << 20)
    rx = shmpipe.Receiver.from_fd(tx.fileno())
    try:
        for i in range(10):
            tx.send_many({"x": np.full((50, 4), i, np.float32)}, timeout=5)
        r = rx.recv_many(max_records=5, timeout=5)
        assert len(r) == 50, f"recv_many(max_records=5) returned {len(r)} records"
    finally:
        rx.close()
        tx.close()


def test_review16_a_loan_whose_shape_overflows_is_a_value_error():
    """`Sender.loan` multiplies the shape in Python's binding with `product()` before shm-ring
    checks it: a debug build (maturin develop) panics ("attempt to multiply with overflow");
    a release build wraps and relies on shm-ring's own check."""
    tx = shmpipe.Sender.anonymous(blocks=2, block_size=4096)
    try:
        for shape in [(2**63 + 256, 2), (2**32, 2**32 + 128)]:
            try:
                tx.loan(shape, np.float32, timeout=0.1)
            except ValueError:
                continue
            raise AssertionError(f"loan{shape} did not raise ValueError")
    finally:
        tx.close()


def test_review16_recv_many_counts_records_across_messages_of_any_size():
    """One-record messages: exactly max_records; mixed sizes: stops at the first message that
    reaches the bound; the rest stays for the next call, in order."""
    tx = shmpipe.Sender.anonymous(slots=1024, blocks=4, block_size=1 << 20)
    rx = shmpipe.Receiver.from_fd(tx.fileno())
    try:
        for i in range(20):
            tx.send({"x": np.full(4, i, np.float32)}, timeout=5)
        r = rx.recv_many(max_records=7, timeout=5)
        assert r["x"][:, 0].tolist() == list(range(7))
        r = rx.recv_many(max_records=100, timeout=5)
        assert r["x"][:, 0].tolist() == list(range(7, 20))
        for i, n in enumerate([3, 1, 30, 2]):
            tx.send_many({"x": np.full((n, 4), i, np.float32)}, timeout=5)
        r = rx.recv_many(max_records=5, timeout=5)
        assert r["x"][:, 0].tolist() == [0] * 3 + [1] + [2] * 30
        assert rx.recv_many(max_records=5, timeout=5)["x"][:, 0].tolist() == [3, 3]
    finally:
        rx.close()
        tx.close()
