"""shmpipe.Pipeline from Python: Python and Rust steps in worker processes."""

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest

import shmpipe
from procs import gone as _gone
from pipeline_steps import Pairs, double, fail_on_7, fan, items, slow, tag_pid

HERE = os.path.dirname(os.path.abspath(__file__))


def shm_entries(needle):
    return [n for n in os.listdir("/dev/shm") if needle in n]


def test_flat_map_exact_end_of_stream_ordered():
    p = shmpipe.Pipeline(items(200), steps=[double, fan], workers=2, ordered=True)
    out = list(p)
    expected = [(i, j) for i in range(200) for j in range(i % 3)]
    assert [(o["n"], o["sub"]) for o in out] == expected
    assert all(np.all(o["x"] == 2 * o["n"]) and o["x"].dtype == np.float32 for o in out)


def test_unordered_gives_the_same_multiset_and_uses_every_worker():
    out = list(shmpipe.Pipeline(items(40), steps=[slow, tag_pid], workers=2, emitters=1,
                                batch_bytes=64))
    assert sorted(o["n"] for o in out) == list(range(40))
    assert len({o["pid"] for o in out}) == 2


def test_stateful_class_step_with_finish():
    out = list(shmpipe.Pipeline(items(5), steps=[Pairs], workers=1, ordered=True))
    assert [o["n"] for o in out] == [0, 1, 2, 3, 4]


def test_seeded_shuffle_is_reproducible_and_epochs_repeat():
    def run(seed):
        p = shmpipe.Pipeline(items(100), steps=[double], workers=1, shuffle=True, seed=seed,
                             epochs=2, ordered=True)
        return [o["n"] for o in p]
    a, b, c = run(1), run(1), run(2)
    assert a == b and a != c
    assert sorted(a) == sorted(list(range(100)) * 2)
    assert a[:100] != list(range(100))


def test_sharding_from_rank_and_world_size(monkeypatch):
    seen = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        part = sorted(o["n"] for o in shmpipe.Pipeline(items(30), steps=[double], workers=1,
                                                       shard="env"))
        assert part
        seen += part
    assert sorted(seen) == list(range(30))
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="RANK"):
        shmpipe.Pipeline(items(3), steps=[double], shard="env")


def test_a_step_exception_is_reraised_with_step_worker_input_and_traceback():
    p = shmpipe.Pipeline(items(20), steps=[double, fail_on_7], workers=2)
    with pytest.raises(shmpipe.StepError) as ei:
        list(p)
    e = ei.value
    assert e.step == "fail_on_7"
    assert e.worker in (0, 1)
    assert e.record == 7 and e.input.startswith("item 7 fed by this process"), e.input
    assert "ZeroDivisionError: seven is right out" in e.message
    assert "pipeline_steps.py" in e.message and "in fail_on_7" in e.message
    assert all(_gone(pid) for pid in p.pids)


def test_lambdas_and_nested_functions_are_refused_at_construction():
    with pytest.raises(ValueError, match="lambda.*top level of a module"):
        shmpipe.Pipeline(items(3), steps=[lambda d: d])

    def nested(d):
        return d
    with pytest.raises(ValueError, match="inside a function"):
        shmpipe.Pipeline(items(3), steps=[nested])
    with pytest.raises(ValueError, match="no built-in step"):
        shmpipe.Pipeline(items(3), steps=["no_such_step"])


def test_a_sigkilled_worker_raises_within_a_second():
    p = shmpipe.Pipeline(items(1000), steps=[slow], workers=2, batch_bytes=256)
    it = iter(p)
    next(it)
    pid = p.pids[-1]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(shmpipe.WorkerDied) as ei:
        for _ in it:
            pass
    assert time.monotonic() - t0 < 1.0
    assert "signal 9" in str(ei.value)


def test_a_sigkilled_worker_raises_from_dequeue_within_a_second():
    with shmpipe.Pipeline([slow], workers=2, batch_bytes=256, max_in_flight=1000) as p:
        p.enqueue_many(items(1000))
        p.dequeue()
        t0 = time.monotonic()
        os.kill(p.pids[-1], signal.SIGKILL)
        with pytest.raises(shmpipe.WorkerDied) as ei:
            while p.dequeue() is not None:
                pass
        assert time.monotonic() - t0 < 1.0
        assert "signal 9" in str(ei.value)
        with pytest.raises(shmpipe.WorkerDied):
            p.enqueue({"n": 0})  # the failure sticks
        assert all(_gone(x) for x in p.pids)


def test_a_sigkilled_worker_raises_from_a_waiting_enqueue_within_a_second():
    with shmpipe.Pipeline([slow], workers=2, max_in_flight=4) as p:
        def register():
            with pytest.raises(TimeoutError):
                p.dequeue(timeout=0.01)  # this thread dequeues (and then never again)
        t = threading.Thread(target=register)
        t.start()
        t.join()
        p.enqueue_many(items(4))  # full: the next enqueue waits for the other thread
        pid = p.pids[-1]
        killed = []
        killer = threading.Timer(0.3, lambda: (killed.append(time.monotonic()),
                                               os.kill(pid, signal.SIGKILL)))
        killer.start()
        try:
            with pytest.raises(shmpipe.WorkerDied):
                p.enqueue({"n": 4, "x": np.zeros(4, np.float32)})
        finally:
            killer.join()
        assert time.monotonic() - killed[0] < 1.0


# How a parent process of the fault tests starts its pipeline (then it prints its pids).
START = {
    "iterate": """
        p = shmpipe.Pipeline(items(2000), steps=[slow], workers=2, emitters=1, batch_bytes=256)
        it = iter(p)
        next(it)
    """,
    "enqueue": """
        p = shmpipe.Pipeline([slow], workers=2, batch_bytes=256, max_in_flight=2000)
        p.enqueue_many(items(2000))
        p.dequeue()
    """,
    "workers0": """
        p = shmpipe.Pipeline([slow], workers=0)
        p.enqueue_many(items(2000))
        p.dequeue()
    """,
}


def _children_of(pid):
    kids = []
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/children") as f:
            kids += [int(x) for x in f.read().split()]
    return kids


@pytest.mark.parametrize("mode", ["iterate", "enqueue", "workers0"])
def test_killing_the_parent_leaves_no_process_and_no_segment(mode):
    code = textwrap.dedent("""
        import sys, time
        sys.path.insert(0, sys.argv[1])
        import shmpipe
        from pipeline_steps import items, slow
    """) + textwrap.dedent(START[mode]) + textwrap.dedent("""
        print(*p.pids, flush=True)
        time.sleep(60)
    """)
    before = set(shm_entries("shmpipe"))
    parent = subprocess.Popen([sys.executable, "-c", code, HERE], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line, "the parent did not start its pipeline"
        pids = [int(x) for x in line.split()]
        # An in-memory source is fed by the parent itself: no emitter.
        assert len(pids) == {"iterate": 2, "enqueue": 2, "workers0": 0}[mode]
        assert sorted(_children_of(parent.pid)) == sorted(pids), "no other process"
        # Pipelines name nothing: their channels are anonymous memfds.
        assert set(shm_entries("shmpipe")) <= before
        parent.kill()
        parent.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5 and not all(_gone(p) for p in pids):
            time.sleep(0.02)
        assert all(_gone(p) for p in pids), "children outlived their parent"
        assert set(shm_entries("shmpipe")) <= before, "shared memory left in /dev/shm"
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("mode", ["iterate", "dequeue", "workers0"])
def test_ctrl_c_stops_a_pipeline_with_keyboard_interrupt(mode):
    wait = {
        # Iterating, while the workers run a 50 ms step.
        "iterate": """
            p = shmpipe.Pipeline(items(2000), steps=[slow], workers=1, batch_bytes=256)
            it = iter(p)
            next(it)
            wait = lambda: [None for _ in it]
        """,
        # Waiting in dequeue for an input nobody enqueues.
        "dequeue": """
            p = shmpipe.Pipeline([slow], workers=1)
            p.enqueue({"n": 0})
            p.dequeue()
            wait = p.dequeue
        """,
        # In a 30 s step, in this process.
        "workers0": """
            p = shmpipe.Pipeline([sleepy], workers=0)
            p.enqueue({"n": 0})
            wait = p.dequeue
        """,
    }[mode]
    code = textwrap.dedent("""
        import os, sys, time
        sys.path.insert(0, sys.argv[1])
        import shmpipe
        from pipeline_steps import items, sleepy, slow
    """) + textwrap.dedent(wait) + textwrap.dedent("""
        pids = p.pids
        try:
            # Inside the try: the signal may arrive as soon as "running" is out.
            print("running", flush=True)
            wait()
        except KeyboardInterrupt:
            t = time.monotonic()
            time.sleep(0.5)
            left = [x for x in pids if os.path.exists(f"/proc/{x}")]
            try:
                p.dequeue(timeout=0)
                after = "nothing"
            except BaseException as e:
                after = type(e).__name__
            print("interrupted", t, len(left), after, flush=True)
        except BaseException as e:
            print("raised", type(e).__name__, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, HERE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "running"
        if mode != "iterate":
            time.sleep(0.3)  # the helper is in its wait by now, not between two calls
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        line = proc.stdout.readline().split()
        assert line and line[0] == "interrupted", line
        assert float(line[1]) - t0 < 0.2
        if mode != "iterate":
            # (Iterating, the interrupt may also land between two outputs, in the caller's
            # code: then the generator, held by `it`, stops the workers when it is closed.)
            assert line[2] == "0", "the interrupted wait stopped the workers"
            assert line[3] == "ValueError", "closed (not failed: no sticky KeyboardInterrupt)"
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_consumer_arrays_are_views_that_hold_their_block():
    big = [{"n": i, "x": np.full(1 << 16, i, np.float32)} for i in range(20)]
    p = shmpipe.Pipeline(big, steps=[double], workers=1, ordered=True)
    it = iter(p)
    first = next(it)
    x = first["x"]
    assert x.flags.writeable and x[0] == 0
    lease = x.base
    assert isinstance(lease, shmpipe._native.ItemLease), "read in place in shared memory"
    alive = weakref.ref(lease)
    rest = [int(o["x"][0]) for o in it]
    assert rest == [2 * i for i in range(1, 20)]
    del first, lease
    gc.collect()
    assert alive() is not None, "the view holds the block"
    del x
    gc.collect()
    assert alive() is None


def test_jsonl_source_with_python_steps(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(f'{{"n": {i}, "x": [{i}, {i}]}}\n' for i in range(50)))
    out = list(shmpipe.Pipeline(str(path), steps=[fan], workers=2, emitters=2))
    assert len(out) == sum(i % 3 for i in range(50))


def test_a_function_of_the_main_script_runs_in_the_workers(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import shmpipe

        def square(item):
            item["x"] = item["x"] ** 2
            return item

        if __name__ == "__main__":
            data = [{"x": np.full(3, float(i))} for i in range(10)]
            out = list(shmpipe.Pipeline(data, steps=[square], workers=2, ordered=True))
            print(",".join(str(int(o["x"][0])) for o in out))
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == ",".join(str(i * i) for i in range(10))


def test_a_function_of_an_interactive_session_is_refused_at_construction():
    # `python -c` has no main file, like a notebook or the REPL.
    code = textwrap.dedent("""
        import shmpipe
        def step(item):
            return item
        try:
            shmpipe.Pipeline([{"n": 1}], steps=[step])
        except ValueError as e:
            print(e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "notebook or an interactive session" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "top level of a module" in r.stdout


def test_prints_of_a_step_are_not_lost():
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        import shmpipe
        from pipeline_steps import items, shout
        list(shmpipe.Pipeline(items(3), steps=[shout], workers=1))
    """)
    r = subprocess.run([sys.executable, "-c", code, HERE], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(r.stdout.split("\n"))[-3:] == ["step saw 0", "step saw 1", "step saw 2"]


def test_float16_bool_and_uint64_arrays_cross_unchanged():
    # Issue 9: pipelines used to carry only f32/f64/int/uint arrays (bool became uint8,
    # float16 was refused).
    from pipeline_steps import count_true
    src = [{"n": i,
            "h": np.arange(i, i + 5, dtype=np.float16) / 4,
            "mask": np.arange(6) % (i + 2) == 0,
            "u": np.array([2**64 - 1 - i], dtype=np.uint64)} for i in range(20)]
    out = sorted(shmpipe.Pipeline(src, steps=[count_true], workers=2), key=lambda d: d["n"])
    assert len(out) == 20
    for want, got in zip(src, out):
        for k in ("h", "mask", "u"):
            assert got[k].dtype == want[k].dtype, k
            np.testing.assert_array_equal(got[k], want[k])
        assert got["trues"] == int(want["mask"].sum())
