"""The batch form (send_many / recv_many), bool loans, and sends that have to wait."""

import threading

import numpy as np
import pytest

import shmpipe


def _pair(**kw):
    tx, handle = shmpipe.pipe(**kw)
    rx = handle.open()
    handle.close()
    return tx, rx


@pytest.mark.parametrize("shape", [(3, 4), (64, 32)])
def test_a_bool_loan_starts_false_and_arrives_as_bool(shape):
    tx, rx = _pair()
    b = tx.loan(shape, bool)
    assert b.dtype == np.bool_ and b.flags.writeable and not b.any()
    b[1, ::2] = True
    tx.send({"mask": b})
    m = rx.recv(timeout=5)
    assert m["mask"].dtype == np.bool_
    np.testing.assert_array_equal(m["mask"], b)
    assert tx.stats().zero_copy_arrays == (1 if b.nbytes >= 1024 else 0), "zero-copy from the threshold on"


def test_a_loan_below_the_threshold_is_an_ordinary_array_that_send_copies():
    tx, rx = _pair(blocks=2)
    b = tx.loan((16,), np.float32)  # 64 bytes: below the 1 KiB threshold
    assert tx.free_blocks() == 2, "no pool block for a small loan"
    assert b.base is None and b.flags.owndata and not b.any()
    b[:] = 3
    tx.send({"x": b})
    b[:] = 5  # the message has its own copy
    tx.send({"x": b})
    assert rx.recv(timeout=5)["x"].sum() == 48 and rx.recv(timeout=5)["x"].sum() == 80
    s = tx.stats()
    assert (s.zero_copy_arrays, s.copied_arrays) == (0, 2), "copied, not zero-copy"


def test_send_many_arrives_as_one_message_of_records_and_recv_many_stacks_them():
    tx, rx = _pair()
    n = 1000
    x = np.arange(n * 16, dtype=np.float32).reshape(n, 16)
    ids = list(range(n))
    names = [f"r{i}" for i in range(n)]
    assert tx.send_many({"x": x}, meta={"id": ids, "name": names}) == n
    got = rx.recv_many(timeout=5)
    assert len(got) == n
    np.testing.assert_array_equal(got["x"], x)
    assert got["x"].flags.writeable and got["x"].flags.c_contiguous
    assert got.meta["id"] == ids and got["name"] == names
    assert set(got.keys()) == {"x", "id", "name"}
    # The same records read one message at a time: a message of many records.
    tx.send_many({"x": x[:5]}, meta={"id": ids[:5]})
    m = rx.recv(timeout=5)
    assert len(m.records) == 5
    assert [r.meta["id"] for r in m.records] == ids[:5]
    np.testing.assert_array_equal(m.records[3]["x"], x[3])


def test_a_batch_larger_than_a_message_is_cut_and_comes_back_in_order():
    tx, rx = _pair(blocks=4, block_size=4096)
    n = 5000  # 5000 x ~100 bytes: many messages of at most a block
    x = np.arange(n * 16, dtype=np.float32).reshape(n, 16)
    sent = []
    t = threading.Thread(target=lambda: sent.append(tx.send_many({"x": x}, timeout=30)))
    t.start()
    rows = []
    while sum(len(r) for r in rows) < n:
        rows.append(rx.recv_many(max_records=700, timeout=10)["x"])
    t.join(30)
    assert sent == [n]
    np.testing.assert_array_equal(np.concatenate(rows), x)
    assert max(len(r) for r in rows) <= 700 + 4096 // 64, "about max_records, whole messages"


def test_rows_that_go_zero_copy_are_batched_within_the_pool():
    tx, rx = _pair(blocks=4, block_size=1 << 16, threshold=1024)
    x = np.random.default_rng(0).random((10, 1000))  # 8 kB rows: a block each
    t = threading.Thread(target=lambda: tx.send_many({"x": x}, timeout=30))
    t.start()
    rows = []
    while sum(len(r) for r in rows) < 10:
        rows.append(rx.recv_many(timeout=10)["x"])
    t.join(30)
    np.testing.assert_array_equal(np.concatenate(rows), x)


def test_records_that_differ_come_back_as_lists():
    tx, rx = _pair()
    tx.send({"x": np.ones(3, np.float32)}, meta={"k": 1})
    tx.send({"x": np.ones(5, np.float32), "y": np.zeros(2, np.int8)})
    tx.send({"x": np.ones((1, 2), np.float64)}, meta={"k": "two"})
    got = rx.recv_many(timeout=5)
    assert len(got) == 3
    assert [a.shape for a in got["x"]] == [(3,), (5,), (1, 2)]
    assert got["y"][0] is None and got["y"][2] is None
    np.testing.assert_array_equal(got["y"][1], [0, 0])
    assert got.meta["k"] == [1, None, "two"]


def test_send_many_refuses_columns_of_different_lengths():
    tx, rx = _pair()
    with pytest.raises(ValueError, match="same length"):
        tx.send_many({"x": np.zeros((3, 2)), "y": np.zeros((4, 2))})
    with pytest.raises(ValueError, match="same length"):
        tx.send_many({"x": np.zeros((3, 2))}, meta={"id": [1, 2]})
    assert tx.send_many({"x": np.zeros((0, 2))}) == 0
    with pytest.raises(TimeoutError, match="timeout="):
        rx.recv_many(timeout=0.05)


def test_recv_many_ends_with_disconnected():
    tx, rx = _pair()
    tx.send_many({"x": np.zeros((2, 2))})
    tx.close()
    assert len(rx.recv_many(timeout=5)) == 2
    with pytest.raises(shmpipe.Disconnected):
        rx.recv_many(timeout=5)


@pytest.mark.parametrize("with_loan", [False, True])
def test_a_send_that_waits_for_room_delivers_everything_in_order(with_loan):
    tx, rx = _pair(slots=8, blocks=4, block_size=1 << 16, threshold=1 << 12)
    n = 200
    got = []

    def consume():
        for _ in range(n):
            m = rx.recv(timeout=20)
            got.append((int(m.meta["i"]), float(m["small"][0]), float(m["big"][-1])))

    t = threading.Thread(target=consume)
    t.start()
    for i in range(n):
        big = np.full(4096, i, np.float32)  # 16 kB: zero-copy (a block) at this threshold
        if with_loan:
            b = tx.loan((4096,), np.float32)
            b[:] = big
            big = b
        tx.send({"small": np.full(4, i, np.float32), "big": big}, meta={"i": i}, timeout=20)
        del big
    t.join(30)
    assert got == [(i, float(i), float(i)) for i in range(n)]
