"""Channels against threads and careless code (issue 16): a loan racing close(), views of a
sent loan, a buffer resized during a send, from_fd on our own descriptor, errors in Python."""

import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest

import shmpipe


def _pair(**kw):
    """An anonymous channel and its receiver in this process."""
    tx, handle = shmpipe.pipe(**kw)
    rx = handle.open()
    handle.close()
    return tx, rx


def _child(code: str, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter: a crash there is a failed assertion here."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


# --- hole 1: a loan in one thread racing close() in another -------------------------------

RACE = """
    import random, sys, threading, time
    import numpy as np, shmpipe
    trials = int(sys.argv[1])
    late = 0
    for trial in range(trials):
        tx = shmpipe.Sender.anonymous(blocks=64, block_size=1 << 16)
        got, started = [], threading.Event()
        def loaner():
            started.set()
            try:
                for _ in range(48):  # fewer than the blocks: it never waits for one
                    got.append(tx.loan((1024,), np.float32))
            except ValueError:
                pass  # closed
        t = threading.Thread(target=loaner)
        t.start()
        started.wait()
        time.sleep(random.random() * 0.001)
        tx.close()
        t.join()
        for a in got:
            a[:] = 1.0
            try:
                tx.send({"x": a})  # refused: the channel is closed
                raise SystemExit("a send after close() went through")
            except ValueError:
                pass
            late += 1
            assert float(a.sum()) == 1024.0  # used to read unmapped memory: SIGSEGV
        got.clear()
    print("ok", trials, late)
"""


def test_a_loan_racing_close_in_another_thread_never_unmaps_its_array():
    r = _child(RACE, "400")  # >= 200 (issue 16); 400 crashed 10 runs of 10 before the fix
    assert r.returncode == 0, f"exit {r.returncode} (-11 is SIGSEGV): {r.stderr[-2000:]}"
    assert r.stdout.split()[:2] == ["ok", "400"], r.stdout


def test_arrays_of_a_closed_sender_stay_readable_until_the_last_view_is_gone():
    tx, rx = _pair(blocks=2)
    sent = tx.loan((1 << 12,), np.float32)
    sent[:] = 2.0
    tx.send({"x": sent})
    unsent = tx.loan((1 << 12,), np.float32)  # every block out: no room for any keep-alive
    unsent[:] = 3.0
    tx.close()
    with pytest.raises(ValueError, match="closed"):
        tx.send({"x": unsent})
    gc.collect()
    assert float(sent.sum()) == 2.0 * (1 << 12) and float(unsent.sum()) == 3.0 * (1 << 12)
    assert float(rx.recv(timeout=5)["x"].sum()) == 2.0 * (1 << 12)
    with pytest.raises(shmpipe.Disconnected):
        rx.recv(timeout=5)


# --- hole 7: views of a sent loan ---------------------------------------------------------

def test_no_view_of_a_sent_loan_ever_shows_a_later_loan():
    torch = pytest.importorskip("torch")
    tx, rx = _pair(blocks=2, block_size=1 << 16)
    buf = tx.loan((1024,), np.float32)
    buf[:] = 1.0
    views = {
        "slice": buf[10:20],
        "view of a view": buf[::2][1:5],
        "reshape": buf.reshape(32, 32),
        "asarray": np.asarray(buf),
        "memoryview": memoryview(buf),
        "dlpack": np.from_dlpack(buf),
        "torch": torch.from_numpy(buf),
    }
    tx.send({"x": buf})
    del buf
    rx.recv(timeout=5)  # dropped at once: the consumer is done, its block goes back
    gc.collect()
    for i in range(4):  # more loans than blocks: any block that can be reused is
        b = tx.loan((1024,), np.float32)
        b[:] = 7.0 + i
        tx.send({"x": b})
        del b
        assert float(rx.recv(timeout=5)["x"][0]) == 7.0 + i
        gc.collect()
    for what, v in views.items():
        a = np.asarray(v)
        assert (a == 1.0).all(), f"the {what} of a sent loan shows a later loan: {a[:4]}"
    del views, v, a
    gc.collect()
    assert tx.free_blocks() == 2, "the block comes back once the last view is gone"


def test_views_made_from_a_sent_loan_are_read_only():
    tx, rx = _pair(blocks=2)
    buf = tx.loan((16, 16), np.float64)  # 2 KiB: a pool block (above the 1 KiB threshold)
    buf[:] = 1
    tx.send({"x": buf})
    for what, v in {"the array": buf, "a slice": buf[1:], "asarray": np.asarray(buf),
                    "a transpose": buf.T}.items():
        assert not v.flags.writeable, what
        with pytest.raises(ValueError):
            v[0] = 5
    assert memoryview(buf).readonly
    assert float(rx.recv(timeout=5)["x"].sum()) == 256


def test_holding_every_block_in_loan_arrays_is_a_clear_error_not_a_hang():
    tx, rx = _pair(blocks=1, block_size=1 << 12)
    buf = tx.loan((512,), np.float32)  # 2 KiB: a pool block (above the 1 KiB threshold)
    buf[:] = 1
    tx.send({"x": buf})
    rx.recv(timeout=5)  # dropped at once: the block goes back
    gc.collect()
    t0 = time.monotonic()
    with pytest.raises(shmpipe.PoolExhausted, match=r"blocks=1.*(del|drop)"):
        tx.loan((512,), np.float32)  # the only block is `buf`'s: waiting would be forever
    assert time.monotonic() - t0 < 2
    del buf
    gc.collect()
    assert tx.loan((512,), np.float32, timeout=1).shape == (512,)


# --- send with the GIL released while another thread resizes the array -------------------

RESIZE = """
    import os, threading, time
    import numpy as np, shmpipe
    tx, h = shmpipe.pipe(blocks=1, block_size=8 << 20, threshold=1 << 16)
    rx = h.open()
    tx.send({"x": np.ones(1 << 20, np.float32)})   # takes the only block
    a = np.full(1 << 20, 2.0, np.float32)          # 4 MiB: its own mmap in malloc
    err = []
    def send():
        try:
            tx.send({"x": a}, timeout=20)          # waits for the block, GIL released
        except Exception as e:
            err.append(e)
    t = threading.Thread(target=send)
    t.start()
    time.sleep(0.3)
    try:
        a.resize(1 << 10, refcheck=False)          # shrinks (and unmaps) the old buffer
        a[:] = 3.0
    except ValueError as e:
        print("resize refused", e)
    rx.recv(timeout=5)                             # dropped: the block comes back, the send goes on
    t.join(30)
    assert not err, err
    x = rx.recv(timeout=5)["x"]
    assert x.size in (1 << 20, 1 << 10), x.shape
    assert np.isin(x[:: 4096], [2.0, 3.0]).all(), x[:: 4096][:8]
    print("ok")
"""


def test_an_array_resized_by_another_thread_during_a_send_is_never_read_after_free():
    # A fixed mmap threshold: glibc gives the 4 MiB buffer its own mapping, which the shrink
    # unmaps (with the default, growing threshold it may come from the heap and stay mapped).
    r = _child(RESIZE, MALLOC_MMAP_THRESHOLD_="65536")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), \
        f"exit {r.returncode} (-11 is SIGSEGV): {r.stdout[-500:]} {r.stderr[-2000:]}"


# --- Receiver.from_fd on a descriptor this process still uses -----------------------------

FROM_FD = """
    import gc, os
    import numpy as np, shmpipe
    tx = shmpipe.Sender.anonymous()
    fd = tx.fileno()
    rx = shmpipe.Receiver.from_fd(fd)              # the sender's own descriptor
    tx.send({"x": np.arange(4.0)})
    assert rx.recv(timeout=5)["x"].sum() == 6
    rx.close(); del rx; gc.collect()
    os.fstat(fd)                                   # still the sender's: not closed by rx
    b = tx.loan((1 << 16,), np.float32)            # the sender still uses it
    b[:] = 1
    del b, tx; gc.collect()                        # closes it once, no abort
    tx = shmpipe.Sender.anonymous()
    fd = os.dup(tx.fileno())
    rx = shmpipe.Receiver.from_fd(fd)
    os.close(fd)                                   # the caller's to close: rx has its own
    tx.send({"x": np.ones(3)})
    assert rx.recv(timeout=5)["x"].sum() == 3
    del rx, tx; gc.collect()
    print("ok")
"""


def test_from_fd_duplicates_the_descriptor_it_is_given():
    r = _child(FROM_FD)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


# --- errors speak Python ------------------------------------------------------------------

RUST_WORDS = re.compile(r"::|open_timeout|send_timeout|ChannelConfig|reclaim_stale|Receiver::"
                        r"|MessageBuilder|linger|attach_timeout")


def _raise(f):
    try:
        f()
    except Exception as e:  # noqa: BLE001 - the error under test
        return e
    raise AssertionError("no error")


def test_channel_errors_name_python_parameters(chan_name):
    tx, rx = _pair(blocks=1, block_size=1 << 12, threshold=1024)
    cases = {
        "loan larger than a block": (_raise(lambda: tx.loan((1 << 12,), np.float32)),
                                     "block_size=", ValueError),
        "array larger than a block": (_raise(lambda: tx.send({"x": np.zeros(1 << 12)})),
                                      "block_size=", ValueError),
        "more arrays than blocks": (_raise(lambda: tx.send({"a": np.zeros(512),
                                                            "b": np.zeros(512)})),
                                    "blocks=", ValueError),
        "recv timeout": (_raise(lambda: rx.recv(timeout=0.01)), "timeout=", TimeoutError),
    }
    cases["a channel without a pool"] = (_raise(lambda: shmpipe.Sender.anonymous(blocks=0)),
                                         "blocks=", ValueError)
    cases["open a missing name"] = (_raise(lambda: shmpipe.Receiver.open(chan_name)),
                                    "timeout=", FileNotFoundError)
    named = shmpipe.Sender.create(chan_name)
    cases["create a taken name"] = (_raise(lambda: shmpipe.Sender.create(chan_name)), "name",
                                    FileExistsError)
    first = shmpipe.Receiver.open(chan_name)
    cases["second receiver"] = (_raise(lambda: shmpipe.Receiver.open(chan_name)), "close()",
                                shmpipe.ShmpipeError)
    with open(os.devnull, "rb") as f:
        cases["from_fd of a non-channel"] = (_raise(lambda: shmpipe.Receiver.from_fd(f.fileno())),
                                             "descriptor", shmpipe.ShmpipeError)
    for what, (e, want, kind) in cases.items():
        assert isinstance(e, kind), (what, type(e), e)
        assert want in str(e), (what, str(e))
        assert not RUST_WORDS.search(str(e)), (what, str(e))
    too_big = cases["loan larger than a block"][0]
    assert (too_big.parameter, too_big.needed, too_big.limit) == ("block_size", 1 << 14, 1 << 12)
    assert cases["more arrays than blocks"][0].parameter == "blocks"
    del first, named


def _send_loans(tx, n):
    for _ in range(n):
        tx.send({"x": tx.loan((1024,), np.float32)})  # 4 KiB: a pool block each
    gc.collect()


def test_peer_died_carries_the_pid(kill_on_exit):
    tx, handle = shmpipe.pipe()
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys, time, shmpipe
        rx = shmpipe.Receiver.from_fd(int(sys.argv[1]))
        print("attached", flush=True)
        time.sleep(60)
    """), str(handle.fileno())], pass_fds=[handle.fileno()], stdout=subprocess.PIPE, text=True)
    kill_on_exit.append(p)
    assert p.stdout.readline().strip() == "attached"
    assert tx.wait_for_consumer(10) == p.pid
    p.kill()
    p.wait()
    _send_loans(tx, 16)  # every block out, and the consumer will never give them back
    e = _raise(lambda: tx.loan((1024,), np.float32, timeout=10))
    assert isinstance(e, shmpipe.PeerDied), e
    assert e.pid == p.pid and str(p.pid) in str(e)
    assert not RUST_WORDS.search(str(e)), str(e)


def test_a_weakref_to_a_loan_dies_with_its_last_view():
    tx, rx = _pair()
    buf = tx.loan((512,), np.float32)  # a pool block
    owner = weakref.ref(buf.base)
    v = buf[1:]
    tx.send({"x": buf})
    del buf
    gc.collect()
    assert owner() is not None
    del v
    gc.collect()
    assert owner() is None
