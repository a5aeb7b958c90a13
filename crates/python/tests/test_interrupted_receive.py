"""A signal handler that raises (Ctrl-C's KeyboardInterrupt, a SIGALRM time budget) while a
receive is under way never loses what the receive took: a message taken in the same wait as
the signal is kept for the next receive, and a pipeline stops (as Ctrl-C stops it).

Each test trips a signal while the main thread is inside the receive (seen from another
thread: the main thread's innermost frame is the call's own), then makes the message arrive:
the receive takes it with the signal already pending."""

import _thread
import signal
import sys
import threading

import numpy as np
import pytest

import shmpipe
from pipeline_steps import add_1


class Interrupted(Exception):
    pass


def _raise(*_):
    raise Interrupted


@pytest.fixture
def raising_sigusr1():
    old = signal.signal(signal.SIGUSR1, _raise)
    yield
    signal.signal(signal.SIGUSR1, old)


def trip_inside(call, then):
    """``call()`` in this (main) thread; once it is under way, another thread trips SIGUSR1
    (its Python handler runs in this thread, at its next check) and then runs ``then()``."""
    main = threading.get_ident()
    done = threading.Event()

    def other():
        # While this thread holds the GIL, a main thread whose innermost frame is `call`'s has
        # passed the frame's entry check (signals are handled there first, then the GIL is
        # given up) or waits inside the binding: its next check comes after the receive.
        while getattr(sys._current_frames().get(main), "f_code", None) is not call.__code__:
            if done.wait(0.001):
                return
        _thread.interrupt_main(signal.SIGUSR1)
        then()

    th = threading.Thread(target=other)
    th.start()
    try:
        return call()
    finally:
        done.set()
        th.join()


def _pair():
    tx, _ = shmpipe.pipe()
    return tx, shmpipe.Receiver.from_fd(tx.fileno())


@pytest.mark.parametrize("how", ["recv", "next"])
def test_a_message_taken_as_a_handler_raises_is_kept_for_the_next_recv(raising_sigusr1, how):
    tx, rx = _pair()
    call = (lambda: rx.recv(timeout=30)) if how == "recv" else (lambda: next(rx))
    with pytest.raises(Interrupted):
        trip_inside(call, lambda: tx.send({"x": np.arange(3)}, meta={"i": 1}))
    tx.send({"x": np.arange(4)}, meta={"i": 2})
    got = [rx.try_recv(), rx.try_recv()]
    assert [m.meta["i"] if m is not None else None for m in got] == [1, 2]
    np.testing.assert_array_equal(got[0]["x"], np.arange(3))
    assert rx.try_recv() is None


def test_records_taken_as_a_handler_raises_are_kept_for_the_next_recv_many(raising_sigusr1):
    tx, rx = _pair()
    x = np.arange(8).reshape(4, 2)
    with pytest.raises(Interrupted):
        trip_inside(lambda: rx.recv_many(timeout=30), lambda: tx.send_many({"x": x[:3]}))
    tx.send_many({"x": x[3:]})
    got = [rx.recv_many(timeout=0), rx.recv_many(timeout=0)]
    assert [len(r) for r in got] == [3, 1]
    np.testing.assert_array_equal(np.concatenate([r["x"] for r in got]), x)


def test_a_pipeline_output_taken_as_a_handler_raises_is_not_silently_lost(raising_sigusr1):
    p = shmpipe.Pipeline([add_1], workers=1)
    p.start()
    try:
        p.enqueue(1)
        assert p.dequeue(timeout=60) == 2         # the worker is up
        run = p._enqueue_run()      # the binding's PipelineRun (Pipeline.dequeue calls it)
        with pytest.raises(Interrupted):
            trip_inside(lambda: run.dequeue(30), lambda: p.enqueue(2))
        # The interrupt stops the pipeline, as it does in a wait without an output; it never
        # goes on without the output (a caller counting outputs would wait for ever).
        with pytest.raises(ValueError, match="closed"):
            p.dequeue(timeout=0)
    finally:
        p.close()
