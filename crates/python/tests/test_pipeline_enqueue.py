"""The seed's interface of shmpipe.Pipeline: start/enqueue/dequeue/close_input, workers=0,
persistent workers across epochs, and seeds that do not depend on the worker count.

The fault tests (Ctrl-C, a SIGKILLed worker, a killed parent) of these modes are in
test_pipeline.py, beside those of iteration.
"""

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import shmpipe
from procs import gone as _gone
from pipeline_steps import (Pairs, add_1, double, fail_on_7, fan, items, noisy, noisy_split,
                            slow, slow_tag_pid, tag_pid)

HERE = os.path.dirname(os.path.abspath(__file__))


def _memfds():
    """Our process's anonymous shared memory: open memfds and mappings of one."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "memfd:shmpipe" in target:
            fds.add(fd)
    with open("/proc/self/maps") as f:
        maps = sum("memfd:shmpipe" in line for line in f)
    return fds, maps


def _children():
    kids = set()
    for t in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{t}/children") as f:
            kids.update(int(x) for x in f.read().split())
    return kids


# ----- enqueue / dequeue

def test_the_seed_example_enqueue_3_dequeue_5():
    p = shmpipe.Pipeline([add_1, add_1], workers=4)
    p.start()
    p.enqueue(3)
    assert p.dequeue() == 5
    p.close_input()
    assert p.dequeue() is None, "end of stream"
    assert p.dequeue() is None, "and it stays there"
    p.close()


def test_round_trip_of_dicts_in_order_with_exact_end():
    with shmpipe.Pipeline([double, fan], workers=2, ordered=True) as p:
        for it in items(150):
            p.enqueue(it)
        p.close_input()
        out = list(iter(p.dequeue, None))
        assert p.pending == 0
    expected = [(i, j) for i in range(150) for j in range(i % 3)]
    assert [(o["n"], o["sub"]) for o in out] == expected
    assert all(np.all(o["x"] == 2 * o["n"]) and o["x"].dtype == np.float32 for o in out)


def test_unordered_enqueue_gets_every_output_and_finish_outputs_once():
    with shmpipe.Pipeline([Pairs], workers=3) as p:
        p.enqueue_many(items(101))
        p.close_input()
        out = sorted(o["n"] for o in p)  # iterating an enqueue pipeline: dequeue to the end
    assert out == list(range(101))


def test_one_at_a_time_round_trips_do_not_wait_for_a_batch():
    with shmpipe.Pipeline([add_1], workers=2) as p:
        t0 = time.monotonic()
        for i in range(50):
            p.enqueue(i)
            assert p.dequeue(timeout=10) == i + 1
            assert p.pending == 0
        # A round trip is not held back until a batch fills up (nor by a timer).
        assert time.monotonic() - t0 < 10


def test_values_of_any_kind_and_dicts_are_items():
    with shmpipe.Pipeline([add_1], workers=1, ordered=True) as p:
        p.enqueue(1.5)
        p.enqueue(np.arange(3, dtype=np.float32))
        p.enqueue("a")  # str + 1 fails: below
        assert p.dequeue() == 2.5
        a = p.dequeue()
        assert a.dtype == np.float32 and a.tolist() == [1, 2, 3]
        with pytest.raises(shmpipe.StepError) as ei:
            p.dequeue()
    assert ei.value.step == "add_1" and "TypeError" in ei.value.message


def test_dequeue_timeout_raises_timeout_error_and_the_pipeline_runs_on():
    with shmpipe.Pipeline([slow], workers=1) as p:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="timeout="):
            p.dequeue(timeout=0.2)
        assert 0.15 < time.monotonic() - t0 < 2
        p.enqueue({"n": 1})
        assert p.dequeue(timeout=10)["n"] == 1


def test_one_thread_enqueuing_far_more_than_the_bound_does_not_deadlock():
    # max_in_flight bounds what the worker processes hold; a thread that never dequeues
    # while enqueuing gets its earlier outputs kept in this process instead of a hang.
    with shmpipe.Pipeline([double], workers=2, max_in_flight=8) as p:
        p.enqueue_many(items(3000, width=64))
        p.close_input()
        out = sorted(o["n"] for o in p)
    assert out == list(range(3000))


def test_enqueue_blocks_at_the_bound_while_another_thread_dequeues():
    bound = 8
    with shmpipe.Pipeline([double], workers=2, max_in_flight=bound) as p:
        p.enqueue({"n": -1, "x": np.zeros(2)})
        took = []

        def consumer():
            took.append(p.dequeue(timeout=10))  # this thread dequeues, then stalls

        t = threading.Thread(target=consumer)
        t.start()
        t.join()
        assert took[0]["n"] == -1
        n = 0
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="max_in_flight=8"):
            while True:
                p.enqueue({"n": n, "x": np.zeros(2)}, timeout=0.3)
                n += 1
        assert n == bound, "exactly max_in_flight inputs wait in the processes"
        assert time.monotonic() - t0 < 5
        # The consumer resumes: room again, nothing lost.
        got = [p.dequeue(timeout=10)["n"] for _ in range(bound)]
        p.enqueue({"n": 99, "x": np.zeros(2)}, timeout=5)
        p.close_input()
        got += [o["n"] for o in p]
    assert sorted(got) == list(range(bound)) + [99]


def test_a_feeder_thread_and_a_consumer_keep_every_output_in_order():
    # Both threads start the pipeline lazily, and until the consumer's first dequeue the
    # feeder takes outputs off the pipeline itself (nobody else dequeues yet).
    for _ in range(4):
        with shmpipe.Pipeline([double], workers=2, ordered=True, max_in_flight=4) as p:
            def feed():
                p.enqueue_many({"n": i, "x": np.zeros(2)} for i in range(200))
                p.close_input()

            t = threading.Thread(target=feed)
            t.start()
            got = [o["n"] for o in p]
            t.join()
        assert got == list(range(200))


def test_a_word_about_close_input_only_when_a_dequeue_waits_for_nothing():
    code = textwrap.dedent("""
        import sys, time
        sys.path.insert(0, sys.argv[1])
        import shmpipe
        from pipeline_steps import double, items
        kw = dict(workers=1, warn_idle=0.5)
        with shmpipe.Pipeline(items(10), steps=[double], persistent_workers=True, **kw) as p:
            list(p)
            time.sleep(1.0)  # between epochs
            list(p)
        with shmpipe.Pipeline([double], **kw) as p:
            p.enqueue(items(1)[0])
            time.sleep(1.0)  # nobody dequeues
            p.dequeue()
            print("QUIET SO FAR", file=sys.stderr, flush=True)
            try:
                p.dequeue(timeout=1.5)  # waits, and nothing was enqueued
            except TimeoutError:
                pass
    """)
    r = subprocess.run([sys.executable, "-c", code, HERE], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    before, after = r.stderr.split("QUIET SO FAR")
    assert "close_input" not in before, before
    assert "close_input()" in after and "dequeue" in after, after


def test_misuse_is_refused_in_python_terms():
    p = shmpipe.Pipeline([add_1], workers=1)
    p.enqueue(1)  # starts the pipeline
    p.close_input()
    with pytest.raises(ValueError, match="close_input"):
        p.enqueue(2)
    assert p.dequeue() == 2 and p.dequeue() is None
    p.close()
    with pytest.raises(ValueError, match="closed"):
        p.dequeue()
    with pytest.raises(ValueError, match="enqueue.*source"):
        shmpipe.Pipeline(items(3), steps=[double]).enqueue({"n": 1})
    with pytest.raises(ValueError, match="max_in_flight"):
        shmpipe.Pipeline([add_1], max_in_flight=0)


def test_a_step_error_from_dequeue_names_step_worker_and_input_and_sticks():
    p = shmpipe.Pipeline([double, fail_on_7], workers=2)
    p.enqueue_many(items(20))
    with pytest.raises(shmpipe.StepError) as ei:
        while p.dequeue(timeout=10) is not None:
            pass
    e = ei.value
    assert e.step == "fail_on_7" and e.worker in (0, 1) and e.record == 7
    assert e.input.startswith("enqueued input 7"), e.input
    assert "ZeroDivisionError: seven is right out" in e.message
    with pytest.raises(shmpipe.StepError):
        p.dequeue()  # never a clean end after a failure
    with pytest.raises(shmpipe.StepError):
        p.enqueue({"n": 1})
    assert all(_gone(pid) for pid in p.pids)
    p.close()


def test_context_manager_leaves_no_process_and_no_memfd():
    gc.collect()
    before = _memfds()
    with shmpipe.Pipeline([double], workers=2) as p:
        p.start()
        pids = p.pids
        assert len(pids) == 2 and not any(_gone(x) for x in pids)
        p.enqueue({"n": 0, "x": np.zeros(1 << 16, np.float32)})
        assert p.dequeue(timeout=10)["n"] == 0
        assert _memfds()[1] > before[1], "the channels are memfd mappings"
    assert all(_gone(x) for x in pids)
    gc.collect()
    assert _memfds() == before
    # An exception in the block stops the processes too.
    with pytest.raises(RuntimeError):
        with shmpipe.Pipeline([double], workers=1) as p:
            pids = p.start().pids
            raise RuntimeError("user code failed")
    assert all(_gone(x) for x in pids)
    gc.collect()
    assert _memfds() == before


# ----- workers=0

def test_workers_0_runs_in_this_process_with_the_same_outputs_and_errors():
    kids = _children()
    with shmpipe.Pipeline([add_1, add_1], workers=0) as p:
        p.enqueue(3)
        assert p.dequeue() == 5
        assert p.pids == [] and _children() == kids
    got = list(shmpipe.Pipeline(items(40), steps=[tag_pid, double, fan], workers=0, ordered=True))
    want = list(shmpipe.Pipeline(items(40), steps=[tag_pid, double, fan], workers=2,
                                 ordered=True))
    assert {o["pid"] for o in got} == {os.getpid()}
    assert len(got) == len(want) == sum(i % 3 for i in range(40))
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        assert a["n"] == b["n"] and a["sub"] == b["sub"]
        assert a["x"].dtype == b["x"].dtype and np.array_equal(a["x"], b["x"])
    with pytest.raises(shmpipe.StepError) as ei:
        list(shmpipe.Pipeline(items(20), steps=[double, fail_on_7], workers=0))
    e = ei.value
    assert (e.step, e.worker, e.record) == ("fail_on_7", None, 7), "no worker: this process"
    assert e.input.startswith("item 7 fed by this process"), e.input
    assert "ZeroDivisionError: seven is right out" in e.message
    assert isinstance(e.__cause__, ZeroDivisionError), "the step's own exception, for pdb.pm()"


def test_workers_0_dequeue_times_out_and_runs_on():
    with shmpipe.Pipeline([add_1], workers=0) as p:
        for timeout in (0, 0.1):
            t0 = time.monotonic()
            with pytest.raises(TimeoutError, match="timeout="):
                p.dequeue(timeout=timeout)
            assert time.monotonic() - t0 < 2
        p.enqueue(1)
        assert p.dequeue(timeout=0) == 2
        assert p.pending == 0


def test_workers_0_stops_at_a_breakpoint_in_a_step():
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        import shmpipe
        from pipeline_steps import debug_me
        with shmpipe.Pipeline([debug_me], workers=0) as p:
            p.enqueue({"n": 41})
            print("out", p.dequeue()["seen"], flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", code, HERE], input="p item['n'] + 1\nc\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(Pdb)" in r.stdout and "42" in r.stdout, r.stdout
    assert r.stdout.rstrip().endswith("out 1")


def test_workers_0_with_a_step_of_the_main_script_does_not_run_the_script_again(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os
        import numpy as np
        import shmpipe
        print("imported", __name__, os.getpid(), flush=True)

        def square(item):
            item["x"] = item["x"] ** 2
            return item

        if __name__ == "__main__":
            data = [{"x": np.full(3, float(i))} for i in range(10)]
            here = [int(o["x"][0]) for o in shmpipe.Pipeline(data, steps=[square], workers=0)]
            there = [int(o["x"][0]) for o in shmpipe.Pipeline(data, steps=[square], workers=2,
                                                                ordered=True)]
            assert here == there == [i * i for i in range(10)], (here, there)
            print("main", os.getpid(), flush=True)
    """))
    # Named with a `..`: the path the parent pickles is not its `__file__` as written.
    path = os.path.join(str(tmp_path), "..", tmp_path.name, "job.py")
    r = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    me = r.stdout.split("main ")[1].split()[0]
    assert f"imported __mp_main__ {me}" not in r.stdout, "the parent ran its script twice"


# ----- persistent workers

def test_persistent_workers_serve_every_epoch_complete_and_exact():
    p = shmpipe.Pipeline(items(60), steps=[slow_tag_pid, double], workers=2,
                         persistent_workers=True, batch_bytes=256)
    pids = None
    for epoch in range(3):
        out = list(p)
        assert sorted(o["n"] for o in out) == list(range(60)), epoch
        assert all(np.all(o["x"] == 2 * o["n"]) for o in out)
        if pids is None:
            pids = p.pids
        assert p.pids == pids and not any(_gone(x) for x in pids), "not respawned"
        assert {o["pid"] for o in out} <= set(pids)
    p.close()
    assert all(_gone(x) for x in pids)


def test_start_makes_a_source_pipeline_persistent_and_an_epoch_may_be_left_early():
    with shmpipe.Pipeline(items(40), steps=[double], workers=2).start() as p:
        pids = p.pids
        for o in p:
            if o["n"] >= 0:
                break  # the rest of this epoch is dropped when the next one starts
        assert sorted(o["n"] for o in p) == list(range(40))
        assert sorted(o["n"] for o in p) == list(range(40))
        assert p.pids == pids


def test_persistent_epochs_equal_one_run_over_the_same_epochs():
    kw = dict(steps=[double], workers=2, shuffle=True, seed=5, ordered=True)
    whole = [o["n"] for o in shmpipe.Pipeline(items(50), epochs=3, **kw)]
    with shmpipe.Pipeline(items(50), persistent_workers=True, **kw) as p:
        per_epoch = [[o["n"] for o in p] for _ in range(3)]
    assert sum(per_epoch, []) == whole
    assert per_epoch[0] != per_epoch[1], "each epoch has its own permutation"


def test_persistent_workers_read_a_jsonl_file_as_its_emitter_would(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(f'{{"n": {i}, "x": [{i}, {i}]}}\n' for i in range(50)))
    want = sorted((o["n"], o["sub"]) for o in shmpipe.Pipeline(str(path), steps=[fan], workers=2))
    assert len(want) == sum(i % 3 for i in range(50))
    with shmpipe.Pipeline(str(path), steps=[fan], workers=2, persistent_workers=True) as p:
        for _ in range(2):
            assert sorted((o["n"], o["sub"]) for o in p) == want
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        shmpipe.Pipeline(str(tmp_path / "nope.jsonl"), steps=[fan], persistent_workers=True)


# ----- seeds

def test_item_rng_gives_the_same_outputs_for_any_worker_count():
    def run(workers, ordered, seed=11, **kw):
        p = shmpipe.Pipeline(items(40), steps=[noisy_split, noisy], workers=workers,
                             shuffle=True, seed=seed, ordered=ordered, batch_bytes=256, **kw)
        return [(o["n"], o["sub"], o["r"], o["w"], o["r2"]) for o in p]

    ordered = [run(w, True) for w in (0, 1, 2, 3)]
    assert all(o == ordered[0] for o in ordered), "same order for 0..3 workers"
    assert len(ordered[0]) == 80 and len({o[2] for o in ordered[0]}) == 80
    unordered = [sorted(run(w, False)) for w in (1, 2, 3)]
    assert all(u == sorted(ordered[0]) for u in unordered), "same multiset"
    assert run(2, True, persistent_workers=True) == ordered[0]
    assert sorted(run(2, True, seed=12)) != sorted(ordered[0])


def test_item_rng_in_enqueue_mode_depends_on_seed_and_position_only():
    def run(workers):
        with shmpipe.Pipeline([noisy], workers=workers, seed=3, ordered=True) as p:
            p.enqueue_many({"n": i} for i in range(30))
            p.close_input()
            return [o["r2"] for o in p]
    a = run(1)
    assert run(3) == a and run(0) == a
    with pytest.raises(RuntimeError, match="inside a step"):
        shmpipe.item_rng()


def test_the_example_runs_as_written():
    script = os.path.join(HERE, "..", "examples", "pipeline_enqueue_dequeue.py")
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "seed 7 gives the same windows" in r.stdout
