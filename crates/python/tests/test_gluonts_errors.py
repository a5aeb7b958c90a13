"""shmpipe.gluonts's loaders where GluonTS's own raise, and their lifetime (trial and attacker
review 19): no training window at all, bad JSON lines, wrong arguments, ``close``/``with``.

Every loader here that could hang runs in a child interpreter with a bounded wait
(``procs.run_python``): a hang fails the test instead of stopping the run.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

pytest.importorskip("gluonts")
pytest.importorskip("pandas")

from gluonts.dataset import loader as gl  # noqa: E402
from gluonts.itertools import rows_to_columns  # noqa: E402

import gluonts_helpers as h  # noqa: E402
from procs import children, run_python  # noqa: E402
from shmpipe.gluonts import InferenceDataLoader, TrainDataLoader, ValidationDataLoader  # noqa: E402


def stack_numpy(rows):
    return {k: np.stack(v) if isinstance(v[0], np.ndarray) else list(v)
            for k, v in rows_to_columns(rows).items()}




# -- 1. no training window can be made ----------------------------------------------------------

NO_WINDOWS = """
import json, sys, time
import numpy as np
from gluonts.dataset.common import ListDataset
from gluonts.dataset.loader import TrainDataLoader as GTrain
from gluonts_helpers import deepar_chain, LogScale
from test_gluonts_errors import stack_numpy
from shmpipe.gluonts import TrainDataLoader

if __name__ == "__main__":
    chain = deepar_chain(context=24, pred=6)
    if {user!r}:
        chain = LogScale() + chain
    data = ListDataset([{{"start": "2024-01-01", "target": np.ones(4), "item_id": f"s{{i}}"}}
                        for i in range(3)], freq="h")
    kw = dict(transform=chain, batch_size=4, stack_fn=stack_numpy, num_batches_per_epoch=2)
    out = {{}}
    for who in ("gluonts", "shmpipe"):
        l = GTrain(data, **kw) if who == "gluonts" else TrainDataLoader(
            data, num_workers=2, seed=0, fast_path={fast!r}, **kw)
        try:
            out[who] = ["ok", len(list(l))]
        except BaseException as e:
            out[who] = [type(e).__module__ + "." + type(e).__qualname__, str(e)]
        finally:
            if who == "shmpipe":
                l.close()
    print("RESULT", json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("fast,user", [(True, False), (False, False), (True, True)],
                         ids=["deepar-fast", "deepar-python", "user-chain"])
def test_no_training_window_raises_as_gluonts_does(fast, user):
    # Every series shorter than the splitter needs: GluonTS's loader raises (the
    # InstanceSplitter's idle check) at once; shmpipe's looped for ever.
    rc, out = run_python(NO_WINDOWS.format(fast=fast, user=user), limit=120)
    assert rc == 0, out[-3000:]
    res = json.loads(out.split("RESULT ", 1)[1])
    assert res["gluonts"][0] == "builtins.Exception", res
    assert res["shmpipe"][0] == "builtins.Exception", res
    assert "looped over 100 inputs without returning any output" in res["shmpipe"][1]
    assert "InstanceSplitter" in res["shmpipe"][1]
    assert "no training window" in res["shmpipe"][1]


def test_sparse_windows_do_not_raise():
    # One series in 60 long enough (GluonTS's check counts idle inputs in a row, < 100 here):
    # batches come, from the long series only, however the workers share the entries.
    recs = h.records(120, 4)
    for i in range(0, 120, 60):
        recs[i] = h.records(1, 200, seed=i)[0] | {"item_id": f"long{i}"}
    # One window per long series, none of the others (GluonTS's random sampler could give
    # a long series none).
    kw = dict(transform=h.deepar_chain(context=24, pred=6, sampler=h.samplers(6)["validation"]),
              batch_size=4, stack_fn=stack_numpy, num_batches_per_epoch=3)
    assert len(list(gl.TrainDataLoader(h.list_dataset(recs), **kw))) == 3
    with TrainDataLoader(h.list_dataset(recs), num_workers=2, seed=0, fast_path=False,
                         **kw) as l:
        got = list(l)
    assert len(got) == 3
    assert {i for b in got for i in b["item_id"]} <= {"long0", "long60"}


def keep(entry) -> bool:
    """A FilterTransformation's condition: drops the entries whose item_id starts with x."""
    return not entry["item_id"].startswith("x")


def test_a_filter_before_the_splitter_does_not_raise_where_gluonts_does_not():
    # Entries alternate: dropped by the filter, too short; a long one every 150. Each
    # FlatMap counts its own inputs: the filter's count restarts at every entry it keeps,
    # the splitter sees 75 in a row without a window: GluonTS never raises (149 entries in
    # a row make no window though).
    from gluonts.transform import FilterTransformation

    recs = []
    for i in range(300):
        r = h.records(1, 200 if i % 150 == 149 else 4, seed=i)[0]
        r["item_id"] = f"L{i}" if i % 150 == 149 else (f"x{i}" if i % 2 else f"s{i}")
        recs.append(r)
    chain = FilterTransformation(keep) + h.deepar_chain(
        context=24, pred=6, sampler=h.samplers(6)["validation"])
    kw = dict(transform=chain, batch_size=2, stack_fn=stack_numpy, num_batches_per_epoch=2)
    assert len(list(gl.TrainDataLoader(h.list_dataset(recs), **kw))) == 2
    with TrainDataLoader(h.list_dataset(recs), num_workers=2, seed=0, **kw) as l:
        got = list(l)
    assert len(got) == 2
    assert {i for b in got for i in b["item_id"]} == {"L149", "L299"}


ESTIMATOR = """
import numpy as np, torch
from gluonts.dataset.common import ListDataset
from gluonts.torch.model.deepar import DeepAREstimator
from shmpipe.gluonts import use_shmpipe

if __name__ == "__main__":
    torch.set_num_threads(1)
    data = ListDataset([{{"start": "2024-01-01", "target": np.ones(4), "item_id": f"s{{i}}"}}
                        for i in range(3)], freq="h")
    est = DeepAREstimator(freq="h", prediction_length=6, context_length=12, num_layers=1,
                          hidden_size=4, batch_size=4, num_batches_per_epoch=2,
                          trainer_kwargs=dict(max_epochs=1, logger=False, accelerator="cpu",
                                              enable_progress_bar=False,
                                              enable_model_summary=False,
                                              default_root_dir={tmp!r}))
    use_shmpipe(est, num_workers=2, seed=0)
    try:
        est.train(data)
        print("RESULT trained")
    except Exception as e:
        print("RESULT", type(e).__name__, str(e).splitlines()[0])
"""


def test_deepar_estimator_on_too_short_series_raises(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("lightning")
    rc, out = run_python(ESTIMATOR.format(tmp=str(tmp_path)), limit=240)
    assert rc == 0, out[-3000:]
    assert "RESULT Exception Reached maximum number of idle transformation calls" in out, \
        out[-3000:]


# -- 2. close() and with on all three loaders -------------------------------------------------

LOADERS = [(TrainDataLoader, "train", {"num_batches_per_epoch": 2}),
           (ValidationDataLoader, "validation", {}),
           (InferenceDataLoader, "test", {})]


@pytest.mark.parametrize("Loader,split,extra", LOADERS, ids=[c[1] for c in LOADERS])
@pytest.mark.parametrize("fast", [True, False])
def test_close_and_with_stop_the_workers(tmp_path, Loader, split, extra, fast):
    ds = h.file_dataset(tmp_path, h.records(300, 60))
    chain = h.deepar_chain(context=12, pred=6, sampler=h.samplers(6)[split])
    before = children()

    def make():
        return Loader(ds, transform=chain, batch_size=2, stack_fn=stack_numpy, num_workers=2,
                      seed=0, fast_path=fast, **extra)

    loader = make()
    it = iter(loader)
    next(it)
    loader.close()
    loader.close()  # idempotent
    assert not children() - before
    assert next(iter(loader)), "a later iteration starts again"
    loader.close()
    with make() as loader2:
        next(iter(loader2))
    assert not children() - before
    assert not [n for n in os.listdir("/dev/shm") if "shmpipe" in n]


# -- 3. error texts ---------------------------------------------------------------------------

@pytest.mark.parametrize("Loader", [TrainDataLoader, ValidationDataLoader, InferenceDataLoader])
def test_a_missing_argument_names_the_loader(Loader):
    with pytest.raises(TypeError, match=rf"^{Loader.__name__}\b.*'stack_fn'"):
        Loader(h.list_dataset(h.records(2, 30)), transform=h.deepar_chain(), batch_size=2)
    with pytest.raises(TypeError) as gluonts_own:
        getattr(gl, Loader.__name__)(h.list_dataset(h.records(2, 30)),
                                     transform=h.deepar_chain(), batch_size=2)
    assert "'stack_fn'" in str(gluonts_own.value)


def test_why_not_fast_names_the_step_and_what_differs():
    ds = h.list_dataset(h.records(3, 60))
    kw = dict(batch_size=2, stack_fn=stack_numpy, num_workers=1, seed=0)
    l = ValidationDataLoader(ds, transform=h.LogScale() + h.deepar_chain(
        sampler=h.samplers(6)["validation"]), **kw)
    assert not l.fast_path
    assert "step 1" in l.why_not_fast and "LogScale" in l.why_not_fast, l.why_not_fast
    assert "AsNumpyArray" in l.why_not_fast, l.why_not_fast
    chain = h.deepar_chain(sampler=h.samplers(6)["validation"])
    chain.transformations[2].pred_length = 5  # AddTimeFeatures
    l = ValidationDataLoader(ds, transform=chain, **kw)
    assert not l.fast_path
    assert "AddTimeFeatures" in l.why_not_fast and "pred_length" in l.why_not_fast, \
        l.why_not_fast


JSON_WARNING = """
import warnings
from gluonts.dataset.common import FileDataset
import gluonts_helpers as h
from test_gluonts_errors import stack_numpy
from shmpipe.gluonts import ValidationDataLoader
import gluonts.json

if __name__ == "__main__":
    import pathlib
    d = pathlib.Path({tmp!r})
    ds = h.file_dataset(d, h.records(6, 60))
    chain = h.LogScale() + h.deepar_chain(sampler=h.samplers(6)["validation"])
    print("VARIANT", gluonts.json.variant, flush=True)
    with ValidationDataLoader(ds, transform=chain, batch_size=2, stack_fn=stack_numpy,
                              num_workers=2) as l:
        print("BATCHES", len(list(l)), flush=True)
"""


def test_gluonts_json_warning_is_printed_once(tmp_path):
    rc, out = run_python(JSON_WARNING.format(tmp=str(tmp_path)), limit=120,
                         env={"PYTHONWARNINGS": "default"})
    assert rc == 0, out[-3000:]
    assert "BATCHES 3" in out
    n = out.count("Using `json`-module")
    if "VARIANT json" in out:
        assert n == 1, out
    else:
        assert n == 0, out


# -- 4. bad JSON lines ------------------------------------------------------------------------

BAD = {
    "not json": "this is not json\n",
    "no start": json.dumps({"target": [1.0] * 100}) + "\n",
    "bad start": json.dumps({"start": "yesterday-ish", "target": [1.0] * 100}) + "\n",
    "target strings": json.dumps({"start": "2021-01-01 00:00:00", "target": ["a", "b"] * 50})
    + "\n",
    "target 2-D": json.dumps({"start": "2021-01-01 00:00:00", "target": [[1.0] * 100]}) + "\n",
    # GluonTS: OverflowError (float32 of the int); the Rust reader takes it: the error is the
    # truncated line after it, unless the lines before the Rust reader's are read again.
    "huge int": json.dumps({"start": "2021-01-01 00:00:00", "target": [10**400] * 60}) + "\n"
    + '{"start": "2021-01-01 00:00:00", "tar\n',
}


def _outcome(make):
    loader = None
    try:
        loader = make()
        return type(loader).__name__, sum(1 for _ in loader), None
    except Exception as e:  # noqa: BLE001 - the type is the point
        return type(e), str(e), e
    finally:
        if loader is not None and hasattr(loader, "close"):
            loader.close()


@pytest.mark.parametrize("where", ["early", "late"])
@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("user", [False, True], ids=["deepar", "user-chain"])
def test_a_bad_json_line_raises_what_gluonts_raises(tmp_path, bad, where, user):
    from gluonts.dataset.common import FileDataset

    good = [json.dumps(r) + "\n" for r in h.records(30 if where == "late" else 3, 60)]
    path = tmp_path / "data.json"
    path.write_text("".join(good) + BAD[bad] + "".join(good[:3]))
    line = len(good)
    chain = h.deepar_chain(context=12, pred=6)
    if user:
        chain = h.LogScale() + chain
    kw = dict(transform=chain, batch_size=4, stack_fn=stack_numpy, num_batches_per_epoch=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _outcome(lambda: gl.TrainDataLoader(FileDataset(path, "h"), **kw))
        got = _outcome(lambda: TrainDataLoader(FileDataset(path, "h"), num_workers=2, seed=0,
                                               **kw))
    assert isinstance(want[0], type), want
    assert got[0] is want[0], (got, want)
    text = str(got[1]) + "".join(getattr(got[2], "__notes__", []))
    assert str(path) in text, text
    assert f"{path}:{line + 1}" in text, text


# -- 5. what the README says of the fast path's validation and inference batches -------------

@pytest.mark.parametrize("Loader,split", [(ValidationDataLoader, "validation"),
                                          (InferenceDataLoader, "test")])
def test_fast_path_batches_are_gluonts_own_but_the_age_feature_within_2_ulp(tmp_path, Loader,
                                                                            split):
    # README: every value bit for bit GluonTS's, but the age feature (the last column of
    # past_time_feat / future_time_feat: log10 in f64 rounded once, numpy's float32 log10
    # is not correctly rounded), within 2 ULP.
    ds = h.file_dataset(tmp_path, h.records(12, 2000, nan=0.05))
    c = h.deepar_chain(context=24, pred=6, sampler=h.samplers(6)[split])
    with Loader(ds, transform=c, batch_size=5, stack_fn=stack_numpy, num_workers=2) as dl:
        assert dl.fast_path, dl.why_not_fast
        got = list(dl)
    want = list(getattr(gl, Loader.__name__)(ds, transform=c, batch_size=5,
                                              stack_fn=stack_numpy))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert list(g) == list(w)
        for k in w:
            if not isinstance(w[k], np.ndarray):
                assert g[k] == w[k], k
                continue
            assert (g[k].dtype, g[k].shape) == (w[k].dtype, w[k].shape), k
            if k.endswith("time_feat"):
                np.testing.assert_array_equal(g[k][..., :-1], w[k][..., :-1], err_msg=k)
                np.testing.assert_array_max_ulp(g[k][..., -1], w[k][..., -1], maxulp=2)
            else:
                np.testing.assert_array_equal(g[k], w[k], err_msg=k)
