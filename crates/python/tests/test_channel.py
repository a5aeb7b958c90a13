"""Channels between Python processes: dtypes, zero-copy loans, leases, errors, signals."""

import gc
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref

import numpy as np
import pytest

import shmpipe

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
          np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [16, 100_000])
def test_every_dtype_round_trips(chan_name, dtype, n):
    tx = shmpipe.Sender.create(chan_name, threshold=1024)
    rx = shmpipe.Receiver.open(chan_name)
    rng = np.random.default_rng(n)
    x = (rng.random(n) * 100).astype(dtype).reshape(-1, 4)
    tx.send({"x": x}, meta={"id": 7, "f": 0.5, "s": "é"})
    m = rx.recv(timeout=5)
    assert m["x"].dtype == np.dtype(dtype)
    assert m["x"].shape == x.shape
    np.testing.assert_array_equal(m["x"], x)
    assert m.meta == {"id": 7, "f": 0.5, "s": "é"}
    # Writable (torch.from_numpy warns on read-only arrays): the block is the receiver's own.
    assert m["x"].flags.writeable


def test_an_array_larger_than_a_block_is_a_clear_error(chan_name):
    tx = shmpipe.Sender.create(chan_name, block_size=1 << 16)
    with pytest.raises(ValueError, match="65536"):
        tx.send({"x": np.zeros(1 << 15, dtype=np.float32)})
    with pytest.raises(ValueError, match="65536"):
        tx.loan((1 << 15,), np.float32)


def test_non_contiguous_and_lists_are_sent(chan_name):
    tx = shmpipe.Sender.create(chan_name)
    rx = shmpipe.Receiver.open(chan_name)
    a = np.arange(20, dtype=np.float64).reshape(4, 5)
    tx.send({"t": a.T, "l": [1, 2, 3]})
    m = rx.recv(timeout=5)
    np.testing.assert_array_equal(m["t"], a.T)
    np.testing.assert_array_equal(m["l"], [1, 2, 3])


def test_loan_is_zero_copy_and_the_block_returns_when_the_last_view_is_gone(chan_name):
    tx = shmpipe.Sender.create(chan_name, blocks=2)
    rx = shmpipe.Receiver.open(chan_name)
    buf = tx.loan((1000, 3), np.float32)
    assert buf.flags.writeable
    buf[:] = 3.0
    assert tx.free_blocks() == 1
    tx.send({"x": buf})
    assert not buf.flags.writeable, "a sent loan can no longer be written"
    m = rx.recv(timeout=5)
    x = m["x"]
    assert x.sum() == 9000.0
    assert rx.held_blocks == 1
    lease = x.base
    assert isinstance(lease, shmpipe.Lease)
    alive = weakref.ref(lease)
    sub = x[10:20]  # a view of the view keeps the block too
    del m, x, lease
    gc.collect()
    assert alive() is not None and rx.held_blocks == 1
    assert tx.free_blocks() == 1, "the block is not back while a view lives"
    del sub
    gc.collect()
    assert alive() is None
    assert rx.held_blocks == 0
    assert tx.free_blocks() == 1, "the producer's sent array still holds the block"
    del buf
    gc.collect()
    assert tx.free_blocks() == 2


def test_large_arrays_go_zero_copy_without_a_loan(chan_name):
    tx = shmpipe.Sender.create(chan_name, blocks=4)
    rx = shmpipe.Receiver.open(chan_name)
    x = np.ones(1 << 18, dtype=np.float32)  # 1 MiB
    tx.send({"x": x})
    m = rx.recv(timeout=5)
    assert m.arrays["x"].base.blocks == 1
    assert tx.stats().zero_copy_arrays == 1


def test_hoarding_every_block_is_a_clear_error_not_a_hang(chan_name):
    tx = shmpipe.Sender.create(chan_name, blocks=3, block_size=1 << 16)
    rx = shmpipe.Receiver.open(chan_name)
    kept = []
    for _ in range(3):
        b = tx.loan((200,), np.float64)  # 1.6 kB: a pool block (above the 1 KiB threshold)
        b[:] = 1
        tx.send({"x": b})
        del b
        kept.append(rx.recv(timeout=5))
    t0 = time.monotonic()
    with pytest.raises(shmpipe.PoolExhausted, match=r"all 3 blocks.*blocks=N"):
        rx.recv()  # no timeout: would hang forever without the check
    assert time.monotonic() - t0 < 2
    with pytest.raises(TimeoutError):
        tx.loan((200,), np.float64, timeout=0.1)
    kept.clear()
    gc.collect()
    assert tx.loan((200,), np.float64, timeout=1).shape == (200,)


def test_timeout_and_clean_close(chan_name):
    tx = shmpipe.Sender.create(chan_name)
    rx = shmpipe.Receiver.open(chan_name)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 1.0
    tx.send({"a": np.zeros(3)})
    tx.close()
    assert rx.recv(timeout=5)["a"].shape == (3,)
    with pytest.raises(shmpipe.Disconnected):
        rx.recv(timeout=5)
    with pytest.raises(shmpipe.Disconnected):
        rx.try_recv()


def _child_consumer(handle, q):
    rx = handle.open()
    total = 0.0
    for m in rx:
        total += float(m["x"].sum())
    q.put(total)


def test_anonymous_pipe_with_a_spawn_child():
    ctx = mp.get_context("spawn")
    tx, handle = shmpipe.pipe(blocks=4)
    q = ctx.Queue()
    p = ctx.Process(target=_child_consumer, args=(handle, q))
    p.start()
    try:
        for i in range(50):
            b = tx.loan((1 << 16,), np.float32)
            b[:] = i
            tx.send({"x": b})
        tx.close()
        assert q.get(timeout=30) == sum(i * (1 << 16) for i in range(50))
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
    assert p.exitcode == 0


def test_close_with_every_block_in_flight_and_a_loan_array_alive_ends_the_stream():
    # All blocks are in flight (nobody has read yet) and the last loan's array is still
    # referenced: close() must still end the stream for the consumer (it used to wait for the
    # array to die, so a consumer started afterwards waited forever).
    ctx = mp.get_context("spawn")
    tx, handle = shmpipe.pipe(blocks=2)
    q = ctx.Queue()
    for i in range(2):
        b = tx.loan((1 << 10,), np.float32)
        b[:] = i + 1
        tx.send({"x": b})
    tx.close()
    assert b[0] == 2.0  # the sent loan's array stays readable after the close
    p = ctx.Process(target=_child_consumer, args=(handle, q))
    p.start()
    try:
        assert q.get(timeout=20) == (1 + 2) * (1 << 10)
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
    assert p.exitcode == 0


def _run(code, *args):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_interrupts_a_blocked_recv_within_200ms(chan_name, kill_on_exit):
    tx = shmpipe.Sender.create(chan_name)
    p = _run("""
        import sys, time, shmpipe
        rx = shmpipe.Receiver.open(sys.argv[1], timeout=10)
        print("ready", flush=True)
        try:
            rx.recv()
        except KeyboardInterrupt:
            print("interrupted", time.monotonic(), flush=True)
    """, chan_name)
    kill_on_exit.append(p)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.3)  # let it block in recv
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    line = p.stdout.readline().split()
    assert line and line[0] == "interrupted", p.stderr.read()
    assert float(line[1]) - t0 < 0.2
    assert p.wait(10) == 0
    del tx


def test_a_killed_producer_raises_peer_died(chan_name, kill_on_exit):
    p = _run("""
        import sys, time, numpy as np, shmpipe
        tx = shmpipe.Sender.create(sys.argv[1])
        tx.send({"x": np.ones(4)})
        print("sent", flush=True)
        time.sleep(60)
    """, chan_name)
    kill_on_exit.append(p)
    assert p.stdout.readline().strip() == "sent", p.stderr.read()
    rx = shmpipe.Receiver.open(chan_name, timeout=5)
    assert rx.recv(timeout=5)["x"].sum() == 4
    p.kill()
    p.wait()
    t0 = time.monotonic()
    with pytest.raises(shmpipe.PeerDied):
        rx.recv(timeout=10)
    assert time.monotonic() - t0 < 1.0


def test_garbage_in_shared_memory_raises_corrupt_message(chan_name):
    tx = shmpipe.Sender.create(chan_name, slots=64)
    rx = shmpipe.Receiver.open(chan_name)
    tx.send({"x": np.arange(4, dtype=np.int32)})
    # Scribble over the descriptor ring (after the headers) like a hostile producer would,
    # through the channel's memfd (named `shmpipe:<name>`) reached by /proc.
    def link(fd):
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    mem = next(
        f"/proc/self/fd/{fd}"
        for fd in os.listdir("/proc/self/fd")
        if link(fd).startswith(f"/memfd:shmpipe:{chan_name} ")
    )
    with open(mem, "r+b") as f:
        f.seek(768)
        f.write(b"\xff" * 256)
    with pytest.raises(shmpipe.CorruptMessage):
        rx.recv(timeout=2)


def test_gil_is_released_while_blocked(chan_name):
    import threading
    tx = shmpipe.Sender.create(chan_name)
    rx = shmpipe.Receiver.open(chan_name)
    got = []
    t = threading.Thread(target=lambda: got.append(rx.recv(timeout=10)))
    t.start()
    # This thread keeps running Python code while the other one is blocked in recv.
    n = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.3:
        n += 1
    assert n > 10_000
    tx.send({"x": np.ones(2)})
    t.join(10)
    assert got and got[0]["x"].sum() == 2


def test_interop_torch_dlpack_and_asarray(chan_name):
    tx = shmpipe.Sender.create(chan_name)
    rx = shmpipe.Receiver.open(chan_name)
    b = tx.loan((256, 256), np.float32)
    b[:] = 1.5
    tx.send({"x": b})
    del b  # the producer's array would hold the block too
    m = rx.recv(timeout=5)
    x = m["x"]
    assert np.asarray(x) is x or np.shares_memory(np.asarray(x), x)
    assert np.shares_memory(np.asarray(m["x"]), x)
    d = np.from_dlpack(x)
    assert np.shares_memory(d, x)
    torch = pytest.importorskip("torch")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = torch.from_numpy(x)
    assert t.data_ptr() == x.ctypes.data
    lease = weakref.ref(x.base)
    del m, x, d
    gc.collect()
    assert lease() is not None, "the tensor holds the block"
    assert tx.free_blocks() == 15
    del t
    gc.collect()
    assert lease() is None and tx.free_blocks() == 16


def test_a_sent_loan_stays_readable_after_the_sender_closes(chan_name):
    # Run in a child: before the fix this read unmapped memory (SIGSEGV).
    code = """
import gc, sys, numpy as np, shmpipe
tx = shmpipe.Sender.create(sys.argv[1])
rx = shmpipe.Receiver.open(sys.argv[1])
buf = tx.loan((1 << 16,), np.float32)
buf[:] = 2
tx.send({"x": buf})
tx.close()
m = rx.recv(timeout=5)
assert float(buf.sum()) == 2 * (1 << 16)  # the producer's own array of the sent block
try:
    rx.recv(timeout=5)
    raise SystemExit("no disconnect")
except shmpipe.Disconnected:
    pass  # closed at once; the pool stays mapped for `buf`
del m
gc.collect()
assert float(buf.sum()) == 2 * (1 << 16)
del buf
gc.collect()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code, chan_name], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])
