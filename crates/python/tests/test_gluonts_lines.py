"""The workers' native reading of plain JSON lines gives FileDataset's entries exactly."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

pytest.importorskip("gluonts")
pd = pytest.importorskip("pandas")

from gluonts.dataset import loader as gl  # noqa: E402
from gluonts.dataset.common import ProcessDataEntry  # noqa: E402

import gluonts_helpers as h  # noqa: E402
from shmpipe._native import parse_plain_line  # noqa: E402
from shmpipe.gluonts import TrainDataLoader, ValidationDataLoader  # noqa: E402
from shmpipe.gluonts._lines import plain_reader  # noqa: E402
from test_gluonts import assert_same_batches, stack_numpy  # noqa: E402

PROCESS = ProcessDataEntry("h", one_dim_target=True)


def assert_same_entry(got: dict, want: dict, line: bytes) -> None:
    assert list(got) == list(want), line
    for k, w in want.items():
        g = got[k]
        assert type(g) is type(w), (k, line)
        if isinstance(w, np.ndarray):
            assert (g.dtype, g.shape) == (w.dtype, w.shape), (k, line)
            # bit for bit: the sign of zero and NaN's place included
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32), err_msg=line)
        else:
            assert g == w, (k, line)


def check(line: str | bytes, plain: bool = True) -> None:
    b = line.encode() if isinstance(line, str) else line
    read = plain_reader([PROCESS])
    got = read(b, 0)
    if not plain:
        assert got is None, b
        return
    assert got is not None, b
    assert_same_entry(got, PROCESS(json.loads(b)), b)


def f32_midpoints(rng, n):
    """Decimal texts at and around the midpoints between neighbouring float32s (where
    rounding a float64 to float32 changes direction), the hardest numbers to read."""
    out = []
    for x in rng.standard_normal(n).astype(np.float32) * 10.0 ** rng.integers(-30, 30, n):
        y = np.nextafter(x, np.float32(np.inf))
        mid = (float(x) + float(y)) / 2
        out += [repr(mid), repr(float(np.nextafter(mid, np.inf))),
                repr(float(np.nextafter(mid, -np.inf)))]
    return out


def test_plain_lines_give_json_loads_then_process_data_entry_bit_for_bit():
    rng = np.random.default_rng(19)
    full = [repr(float(v)) for v in rng.normal(0, 1e3, 400)]
    bits = [repr(struct.unpack("<d", struct.pack("<Q", int(u)))[0])
            for u in rng.integers(0, 2**63, 300, dtype=np.uint64)]
    bits = [b for b in bits if abs(float(b)) < 3.4e38]  # beyond float32: refused
    tricky = ["0", "-0", "0.0", "-0.0", "-0e0", "1", "-1", "3e0", "1E5", "1e-5", "2.5e+3",
              "5e-324", "1e-46", "-1e-50", "1.4e-45", "3.4028235e38", "999999999999999", "-123456789012345", "16777217",
              "0.30000000000000004", "1234567.8901234567", "0.1000000000000000055511151231257827",
              "9.999999999999999e22", "1e22", "1e23", "123.456e-20", "7e-310"]
    numbers = full + bits + tricky + f32_midpoints(rng, 300)
    for k in range(0, len(numbers), 50):
        chunk = numbers[k:k + 50]
        vals = ", ".join(chunk[:5] + ["null"] + chunk[5:])
        check('{"start": "2021-01-01 00:00:00", "item_id": "s%d", "target": [%s]}\n' % (k, vals))
    for n in numbers:  # one number per line too: a failure names it
        check('{"start": "2021-01-01", "target": [%s]}' % n)


def test_key_orders_spacing_and_strings_as_json_loads_reads_them():
    for line in ['{"target": [1, 2], "start": "2021-01-01 05:00"}',
                 '{"item_id": "a", "target": [], "start": "2021-01-01"}',
                 ' {  "start" :"2021-01-01","target":[ 1 ,null,  2 ] ,"item_id":"x y"}\r\n',
                 '{"start": "2021-01-01", "target": [1.5], "item_id": ""}',
                 json.dumps({"start": "2021-01-01", "item_id": "é-ü", "target": [1]},
                            ensure_ascii=False),
                 '{"start": "2021-03-28 02:00:00", "target": [0.25, null, null]}']:
        check(line)


def test_other_lines_go_through_json_loads():
    for line in ['{"start": "2021-01-01", "target": [1], "feat_static_cat": [0]}',
                 '{"start": "2021-01-01", "target": [1], "item_id": 7}',
                 '{"start": "2021-01-01", "target": [1], "item_id": null}',
                 '{"start": "2021-01-01", "target": [[1, 2]]}',
                 '{"start": "2021-01-01", "target": ["NaN", 1]}',
                 '{"start": "2021-01-01", "target": [NaN, 1]}',
                 '{"start": "2021-01-01", "target": [1e400]}',
                 '{"start": "2021-01-01", "target": [-1e39]}',
                 '{"start": "2021-01-01", "target": [3.4028236e38]}',
                 '{"start": "2021-01-01", "target": [1234567890123456]}',
                 '{"start": "2021-01-01", "target": [true]}',
                 '{"start": "2021-01-01", "target": [1], "target": [2]}',
                 json.dumps({"start": "2021-01-01", "item_id": "é", "target": [1]}),
                 '{"start": "2021-01-01", "target": [01]}',
                 '{"start": "2021-01-01", "target": [1,]}',
                 '{"start": "2021-01-01"}',
                 '\ufeff{"start": "2021-01-01", "target": [1]}']:
        check(line, plain=False)
        assert parse_plain_line(line.encode()) is None


def test_only_file_datasets_own_processing_is_replaced():
    assert plain_reader([ProcessDataEntry("h", one_dim_target=False)]) is None
    assert plain_reader([ProcessDataEntry("h", use_timestamp=True)]) is None
    assert plain_reader([PROCESS, PROCESS]) is None
    assert plain_reader([lambda d: d]) is None


@pytest.mark.parametrize("features", [False, True])
def test_a_user_chain_over_a_file_dataset_gives_gluonts_batches(tmp_path, features):
    # features: every line has static and dynamic features, none is plain (json.loads);
    # otherwise a few are made not plain (an integer item_id) among plain ones.
    recs = h.records(11, 300, nan=0.05, min_len=100, features=features)
    for r in recs[::4]:
        r["item_id"] = 40 + len(r["target"])
    ds = h.file_dataset(tmp_path, recs)
    chain = h.LogScale() + h.deepar_chain(context=48, pred=12, past=60, dynamic=features,
                                          sampler=h.samplers(12)["validation"])
    dl = ValidationDataLoader(ds, transform=chain, batch_size=4, stack_fn=stack_numpy)
    assert not dl.fast_path
    want = list(gl.ValidationDataLoader(ds, transform=chain, batch_size=4, stack_fn=stack_numpy))
    assert_same_batches(list(dl), want)


def test_the_worker_step_reads_plain_lines_natively_unless_fast_path_is_off(tmp_path):
    from shmpipe.gluonts._source import plan
    from shmpipe.gluonts._step import TransformStep

    path = tmp_path / "one.json"
    path.write_bytes(b'{"start": "2021-01-01", "target": [1, null]}\n')
    source, fns, stages, cached = plan(h.file_dataset(tmp_path, h.records(3, 20)))
    for native in (True, False):
        step = TransformStep(source.kind, fns, stages, seed=0, batch_size=2,
                             batch_in_worker=True, native=native, files=[str(path)])
        e = step._entry({"i": 0, "f": 0, "a": 0, "n": path.stat().st_size})
        assert str(e["start"]) == "2021-01-01 00:00" and e["target"].dtype == np.float32
        assert bool(step._plain) == native


def test_lines_kept_by_a_worker_are_read_again_as_new(tmp_path):
    # Every training pass reads each line again; a worker keeps the entries it parsed and
    # must hand out fresh ones: a step changing the target in place must not see its own
    # change of the previous pass.
    recs = h.records(3, 30, nan=0.1)
    ds = h.file_dataset(tmp_path, recs)
    chain = h.AddOneInPlace() + h.splitter(h.samplers(5)["validation"], past=8, future=5,
                                           dummy=0.0)
    with TrainDataLoader(ds, transform=chain, batch_size=3, stack_fn=stack_numpy,
                         num_batches_per_epoch=4, num_workers=1, seed=0) as dl:
        got = list(dl)
        assert dl._step._plain is None  # the parent's copy; the worker's is its own
    want = list(gl.TrainDataLoader(ds, transform=chain, batch_size=3, stack_fn=stack_numpy,
                                   num_batches_per_epoch=4))
    assert_same_batches(got, want)
    read = plain_reader([PROCESS])
    line = (tmp_path / "data.json").read_bytes().splitlines()[0]
    first = read(line, 0)
    first["target"] += 5
    again = read.kept(0)
    assert_same_entry(again, PROCESS(json.loads(line)), line)
    assert again["target"] is not read.kept(0)["target"]
