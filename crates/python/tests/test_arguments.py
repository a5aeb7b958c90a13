"""Arguments a new user gets wrong (issue 18's trial): refused at once, by the call that took
them, with an error that names the Python parameter and says what to pass."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shmpipe
from pipeline_steps import double, fail_on_7


def items(n):
    return [{"n": i, "x": np.full(3, float(i), dtype=np.float32)} for i in range(n)]


@pytest.mark.parametrize("make", ["create", "anonymous"])
@pytest.mark.parametrize("kw, param", [({"blocks": 0}, "blocks="),
                                       ({"slots": 3}, "slots="),
                                       ({"block_size": 10}, "block_size=")])
def test_a_sender_refuses_a_pool_it_cannot_use(chan_name, make, kw, param):
    with pytest.raises(ValueError, match=param) as ei:
        if make == "create":
            shmpipe.Sender.create(chan_name, **kw)
        else:
            shmpipe.Sender.anonymous(**kw)
    assert "::" not in str(ei.value) and "ChannelConfig" not in str(ei.value)


def test_recv_many_refuses_zero_records_instead_of_waiting_for_ever():
    tx, handle = shmpipe.pipe()
    with tx, handle.open() as rx:
        with pytest.raises(ValueError, match="max_records="):
            rx.recv_many(max_records=0, timeout=5)


@pytest.mark.parametrize("kw, param", [({"workers": "2"}, "workers="),
                                       ({"workers": 1.5}, "workers="),
                                       ({"emitters": 0}, "emitters="),
                                       ({"prefetch": 0}, "prefetch="),
                                       ({"batch_bytes": 0}, "batch_bytes="),
                                       ({"shuffle_buffer": 0}, "shuffle_buffer="),
                                       ({"epochs": 0}, "epochs="),
                                       ({"seed": -1}, "seed=")])
def test_a_pipeline_refuses_bad_numbers_naming_the_parameter(kw, param):
    with pytest.raises((ValueError, TypeError), match=param):
        shmpipe.Pipeline(items(3), steps=[double], **kw)


@pytest.mark.parametrize("channel", [(1, 1, 10), (3, 8, 1 << 20), (0, 8, 10),
                                     (0, 8, 1 << 20, 12345), (0, 8), "big"])
def test_a_bad_channel_geometry_is_refused_at_construction_naming_channel(channel):
    with pytest.raises((ValueError, TypeError), match=r"channel=") as ei:
        shmpipe.Pipeline(items(3), steps=[double], channel=channel)
    assert "::" not in str(ei.value)


def test_a_good_channel_geometry_runs():
    out = list(shmpipe.Pipeline(items(5), steps=[double], workers=1, channel=(0, 4, 1 << 16)))
    assert sorted(o["n"] for o in out) == list(range(5))


def test_a_missing_jsonl_file_is_refused_at_construction(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="source=") as ei:
        shmpipe.Pipeline(str(missing), steps=[double])
    assert str(missing) in str(ei.value)


@pytest.mark.parametrize("kw, param", [({"batch_size": 0}, "batch_size="),
                                       ({"context_length": 0}, "context_length="),
                                       ({"prediction_length": 0}, "prediction_length="),
                                       ({"workers": -1}, "workers=")])
def test_loaders_refuse_bad_sizes_at_construction(tmp_path, kw, param):
    from shmpipe.timeseries import TrainLoader

    path = tmp_path / "ts.jsonl"
    path.write_text('{"start": "2020-01-01 00:00", "target": [1, 2, 3, 4, 5, 6, 7, 8]}\n')
    args = dict(freq="H", context_length=4, prediction_length=2, batch_size=2, workers=1)
    args.update(kw)
    with pytest.raises(ValueError, match=param):
        TrainLoader(str(path), **args)


def test_loaders_refuse_a_missing_file_at_construction_naming_data(tmp_path):
    from shmpipe.timeseries import TestLoader, TrainLoader, ValidationLoader

    missing = tmp_path / "nope.jsonl"
    for cls in (TrainLoader, ValidationLoader, TestLoader):
        with pytest.raises(FileNotFoundError, match="data=") as ei:
            cls(str(missing), freq="H", context_length=4, prediction_length=2)
        assert str(missing) in str(ei.value)


MAIN_GUARDED_STEP = textwrap.dedent(
    """
    import shmpipe

    if __name__ == "__main__":
        def step(item):
            return item
        try:
            shmpipe.Pipeline([{"n": 1}], steps=[step], workers=1)
        except ValueError as e:
            print("refused:", e)
    """
)


def test_a_step_defined_under_the_main_guard_is_refused_at_construction(tmp_path):
    script = tmp_path / "guarded.py"
    script.write_text(MAIN_GUARDED_STEP)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert "refused:" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert 'if __name__ == "__main__"' in r.stdout
    assert "top level" in r.stdout


def test_a_step_error_of_an_in_memory_source_names_the_item_not_an_emitter():
    with pytest.raises(shmpipe.StepError) as ei:
        list(shmpipe.Pipeline(items(10), steps=[fail_on_7], workers=1, ordered=True))
    e = ei.value
    assert "emitter" not in str(e) and "emitter" not in e.input, str(e)
    assert "item 7 fed by this process" in str(e), str(e)
    assert e.step == "fail_on_7" and e.worker == 0


def test_a_step_error_of_workers_0_says_this_process():
    with pytest.raises(shmpipe.StepError) as ei:
        list(shmpipe.Pipeline(items(10), steps=[fail_on_7], workers=0))
    e = ei.value
    assert e.worker is None, e.worker
    assert "worker 0" not in str(e) and "this process" in str(e), str(e)
    assert "emitter" not in str(e)
    assert "item 7 fed by this process" in str(e), str(e)


def test_a_step_error_of_enqueue_names_the_enqueued_input():
    with shmpipe.Pipeline([fail_on_7], workers=1) as p:
        for i in range(8):
            p.enqueue({"n": i})
        p.close_input()
        with pytest.raises(shmpipe.StepError) as ei:
            while p.dequeue(timeout=30) is not None:
                pass
    e = ei.value
    assert "emitter" not in str(e), str(e)
    assert "enqueued input 7" in str(e), str(e)


def test_the_step_name_is_a_field_and_the_message_is_the_traceback_alone():
    with pytest.raises(shmpipe.StepError) as ei:
        list(shmpipe.Pipeline(items(10), steps=[double, fail_on_7], workers=1))
    e = ei.value
    assert (e.step, e.record) == ("fail_on_7", 7)
    assert e.message.startswith("Traceback"), e.message
