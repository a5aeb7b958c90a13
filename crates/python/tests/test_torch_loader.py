"""shmpipe.torch.DataLoader behaves as torch.utils.data.DataLoader (its documented semantics,
checked against torch's own loader where the result is deterministic)."""

import gc
import math
import multiprocessing
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

import torch_datasets as tds  # noqa: E402
from shmpipe.torch import DataLoader, get_worker_info  # noqa: E402


def same(a, b):
    """Deep equality of two batches (tensors compared by dtype, shape and values)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert same(a, b), f"batch {i} differs:\n{a}\n{b}"


def dataset():
    g = torch.Generator().manual_seed(0)
    return tud.TensorDataset(torch.randn(50, 2, 3, generator=g), torch.arange(50))


def gen(seed=7):
    return torch.Generator().manual_seed(seed)


OPTIONS = {
    "default": dict(),
    "batch": dict(batch_size=8),
    "drop_last": dict(batch_size=8, drop_last=True),
    "shuffle_seeded": dict(batch_size=6, shuffle=True),
    "no_batching": dict(batch_size=None),
    "sampler": dict(batch_size=4, sampler=range(3, 40, 3)),
    "batch_sampler": dict(batch_sampler=[[1, 2], [3, 4, 5], [0], [49, 48, 47, 46]]),
    "collate_fn": dict(batch_size=5, collate_fn=tds.keep_structure),
    "negative_keys": dict(batch_sampler=[[-1, -2], [0, 49], [3]]),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_map_style_batches_equal_torchs(name):
    ds = dataset()
    ours = list(DataLoader(ds, num_workers=2, generator=gen(), **OPTIONS[name]))
    theirs = list(tud.DataLoader(ds, num_workers=0, generator=gen(), **OPTIONS[name]))
    assert_same(ours, theirs)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_num_workers_0_loads_in_process_as_torch_does(name):
    ds = dataset()
    ours = list(DataLoader(ds, num_workers=0, generator=gen(), **OPTIONS[name]))
    theirs = list(tud.DataLoader(ds, num_workers=0, generator=gen(), **OPTIONS[name]))
    assert_same(ours, theirs)


def test_num_workers_0_starts_no_process_and_raises_errors_unwrapped():
    before = multiprocessing.active_children()
    dl = DataLoader(tds.WhereAmI(6), batch_size=3, num_workers=0,
                    worker_init_fn=tds.must_not_run)
    rows = torch.cat(list(dl))
    assert rows[:, 0].tolist() == list(range(6))
    assert set(rows[:, 1].tolist()) == {os.getpid()} and set(rows[:, 2].tolist()) == {1}
    assert multiprocessing.active_children() == before
    with pytest.raises(ValueError, match="sample 3 is broken") as info:
        list(DataLoader(tds.Fails(6, bad=3, exc=ValueError), batch_size=2, num_workers=0))
    assert "DataLoader worker" not in str(info.value)


def test_out_of_range_keys_raise_torchs_index_error():
    for loader in (DataLoader(dataset(), batch_sampler=[[0, 50]], num_workers=1),
                   tud.DataLoader(dataset(), batch_sampler=[[0, 50]])):
        with pytest.raises(IndexError, match="index 50 is out of bounds"):
            next(iter(loader))


def test_shuffle_draws_the_generator_like_torch_across_epochs():
    ds = dataset()
    g_ours, g_theirs = gen(3), gen(3)
    ours = DataLoader(ds, batch_size=7, shuffle=True, num_workers=2, generator=g_ours)
    theirs = tud.DataLoader(ds, batch_size=7, shuffle=True, num_workers=0, generator=g_theirs)
    for _ in range(2):
        assert_same(list(ours), list(theirs))
    assert torch.equal(g_ours.get_state(), g_theirs.get_state())


def test_nested_samples_and_every_dtype_come_back_as_torch_collates_them():
    ours = list(DataLoader(tds.Mixed(), batch_size=4, num_workers=2))
    theirs = list(tud.DataLoader(tds.Mixed(), batch_size=4))
    assert_same(ours, theirs)
    assert isinstance(ours[0]["pair"], tds.Pair)
    ours = list(DataLoader(tds.Mixed(), batch_size=None, num_workers=2))
    assert_same(ours, list(tud.DataLoader(tds.Mixed(), batch_size=None)))


def test_numpy_rows_become_one_stacked_tensor():
    ours = list(DataLoader(tds.Rows(40), batch_size=16, num_workers=2))
    assert_same(ours, list(tud.DataLoader(tds.Rows(40), batch_size=16)))
    assert ours[0][0].dtype == torch.float32 and ours[0][0].shape == (16, 16)


def test_is_a_torch_dataloader_with_torchs_argument_checks():
    dl = DataLoader(dataset(), batch_size=4, num_workers=2)
    assert isinstance(dl, tud.DataLoader)
    with pytest.raises(ValueError, match="num_workers option should be non-negative"):
        DataLoader(dataset(), num_workers=-1)
    with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
        DataLoader(dataset(), sampler=range(3), shuffle=True)
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0"):
        DataLoader(dataset(), persistent_workers=True)
    with pytest.raises(ValueError, match="batch_size attribute should not be set"):
        dl.batch_size = 3


def test_len_follows_the_sampler_and_the_iterable_dataset():
    ds = dataset()
    assert len(DataLoader(ds, batch_size=7, num_workers=2)) == 8
    assert len(DataLoader(ds, batch_size=7, drop_last=True, num_workers=2)) == 7
    assert len(DataLoader(tds.Sharded(10), batch_size=3, num_workers=2)) == 4
    assert len(DataLoader(tds.Sharded(10), batch_size=3, drop_last=True, num_workers=2)) == 3


def test_iterable_dataset_each_worker_runs_its_own_copy():
    got = [int(x) for b in DataLoader(tds.Sharded(50), batch_size=4, num_workers=3) for x in b]
    assert sorted(got) == list(range(50))
    # Without sharding every worker yields everything, as with torch.
    got = [int(x) for b in DataLoader(tds.Unsharded(9), batch_size=None, num_workers=2)
           for x in [b]]
    assert sorted(got) == sorted(list(range(9)) * 2)


@pytest.mark.parametrize("prefetch", [2, 3])
def test_iterable_workers_ending_at_different_times(prefetch):
    sizes = [0, 4, 20]
    dl = DataLoader(tds.PerWorkerSizes(sizes), batch_size=7, num_workers=3,
                    prefetch_factor=prefetch)
    fetched = {tuple(t.tolist()) for t in dl}
    assert fetched == {tuple(range(4)), tuple(range(7)), tuple(range(7, 14)),
                       tuple(range(14, 20))}
    dl = DataLoader(tds.PerWorkerSizes(sizes), batch_size=7, num_workers=3, drop_last=True)
    assert {tuple(t.tolist()) for t in dl} == {tuple(range(7)), tuple(range(7, 14))}


def test_iterable_length_warning_after_len_was_asked():
    dl = DataLoader(tds.Unsharded(4), batch_size=None, num_workers=2)
    assert len(dl) == 4
    with pytest.warns(UserWarning, match="samples have been fetched"):
        assert len(list(dl)) == 8


def test_get_worker_info_inside_workers_and_worker_init_fn():
    assert get_worker_info() is None and tud.get_worker_info() is None
    dl = DataLoader(tds.WorkerInfoDataset(12), batch_size=None, num_workers=3,
                    worker_init_fn=tds.mark_dataset, generator=gen(11))
    it = iter(dl)
    rows = torch.stack(list(it))
    pids = [w.pid for w in it._workers]
    for i, wid, n, seed, same_fn, is_self, pid, marker in rows.tolist():
        assert n == 3 and same_fn == 1 and is_self == 1
        assert pid == pids[wid] and marker == 100 + wid
        assert wid == i % 3
        assert seed == it._base_seed + wid
    assert get_worker_info() is None
    assert tds.WorkerInfoDataset.marker == 0


def test_worker_seeds_equal_torchs_for_the_same_generator():
    ours = torch.stack(list(DataLoader(tds.Seeds(), batch_size=None, num_workers=2,
                                       generator=gen(5))))
    theirs = torch.stack(list(tud.DataLoader(tds.Seeds(), batch_size=None, num_workers=2,
                                             generator=gen(5),
                                             multiprocessing_context="fork")))
    assert torch.equal(ours, theirs)


def test_bound_method_worker_init_fn_shares_the_workers_dataset():
    ds = tds.QueueDataset(64)
    dl = DataLoader(ds, batch_size=8, num_workers=3, timeout=30, worker_init_fn=ds.init)
    for i, (wids, sample) in enumerate(dl):
        assert wids.tolist() == [i % 3] * 8
        assert sample.tolist() == list(range(i * 8, (i + 1) * 8))


@pytest.mark.parametrize("exc", [ValueError, KeyError, tds.DatasetError])
def test_worker_exception_keeps_type_message_and_traceback(exc):
    it = iter(DataLoader(tds.Fails(20, bad=9, exc=exc), batch_size=2, num_workers=2))
    with pytest.raises(exc) as info:
        list(it)
    text = str(info.value)
    assert "Caught " + exc.__name__ + " in DataLoader worker process 0" in text
    assert "sample 9 is broken" in text and "deep_failure" in text and "Traceback" in text


def test_errors_are_per_batch_and_iteration_continues():
    it = iter(DataLoader(tds.Fails(10, bad=3, exc=NotImplementedError), batch_size=2,
                         num_workers=2))
    got, errors = [], 0
    while True:
        try:
            got.append(next(it).tolist())
        except NotImplementedError:
            errors += 1
        except StopIteration:
            break
    assert errors == 1 and got == [[0, 1], [4, 5], [6, 7], [8, 9]]


def test_errors_in_worker_init_fn_and_in_iter():
    with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
        list(DataLoader(dataset(), num_workers=2, worker_init_fn=tds.failing_init))
    with pytest.raises(RuntimeError, match="Error in __iter__"):
        list(DataLoader(tds.FailsInIter(), num_workers=2))


def test_early_break_then_new_epochs_and_workers_exit_cleanly():
    dl = DataLoader(dataset(), batch_size=5, num_workers=2)
    it = iter(dl)
    for i, _ in enumerate(it):
        if i == 2:
            break
    workers = it._workers
    del it
    gc.collect()
    for w in workers:
        w.join(30)
        assert not w.is_alive() and w.exitcode == 0
    assert_same(list(dl), list(tud.DataLoader(dataset(), batch_size=5)))


def test_persistent_workers_survive_epochs_and_early_breaks():
    ds = tds.WorkerInfoDataset(12)
    dl = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True,
                    worker_init_fn=tds.mark_dataset)
    seen_pids = set()
    for epoch in range(4):
        out = []
        for i, row in enumerate(dl):
            out.append(int(row[0]))
            seen_pids.add(int(row[6]))
            if epoch == 1 and i == 3:
                break
        assert out == (list(range(4)) if epoch == 1 else list(range(12)))
    assert seen_pids == {w.pid for w in dl._iterator._workers}
    assert all(w.is_alive() for w in dl._iterator._workers)
    dl._iterator._shutdown_workers()


def test_persistent_iterable_dataset_restarts_each_epoch():
    dl = DataLoader(tds.Sharded(10), batch_size=3, num_workers=2, persistent_workers=True)
    for _ in range(3):
        assert sorted(int(x) for b in dl for x in b) == list(range(10))
    dl._iterator._shutdown_workers()


def test_prefetch_factor_bounds_the_tasks_in_flight():
    it = iter(DataLoader(tds.Counting(100), batch_size=2, num_workers=2, prefetch_factor=3))
    assert it._tasks_outstanding == 6 and it._send_idx == 6
    for _ in range(10):
        next(it)
        assert it._tasks_outstanding <= 6
    it._shutdown_workers()


def test_in_order_false_does_not_wait_for_a_slow_worker():
    dl = DataLoader(tds.Slow(12, delay=0.5, slow_worker=0), batch_size=2, num_workers=2,
                    in_order=False)
    got = [b.tolist() for b in dl]
    assert sorted(x for b in got for x in b) == list(range(12))
    # Worker 1's batches (2-3, 6-7, 10-11) are not held back behind worker 0's slow ones.
    assert got[0] == [2, 3]


def test_timeout_raises_torchs_error():
    dl = DataLoader(tds.Slow(4, delay=3), batch_size=2, num_workers=2, timeout=1)
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 1 seconds"):
        next(iter(dl))


def test_pin_memory_is_accepted_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out = list(DataLoader(dataset(), batch_size=10, num_workers=2, pin_memory=True))
    assert_same(out, list(tud.DataLoader(dataset(), batch_size=10)))


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_every_multiprocessing_context(method):
    ours = list(DataLoader(tds.Counting(11), batch_size=3, num_workers=3,
                           multiprocessing_context=method))
    assert [t.tolist() for t in ours] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10]]


def test_unpicklable_arguments_get_an_error_that_names_the_fix():
    dl = DataLoader(dataset(), num_workers=2, collate_fn=lambda b: b)
    with pytest.raises(TypeError, match="picklable.*multiprocessing_context='fork'"):
        next(iter(dl))
    out = list(DataLoader(tds.Counting(4), batch_size=2, num_workers=2,
                          collate_fn=lambda b: [x * 10 for x in b],
                          multiprocessing_context="fork"))
    assert out == [[0, 10], [20, 30]]


def test_dataset_holding_a_multiprocessing_value():
    ctx = multiprocessing.get_context("forkserver")
    ds = tds.WithLock(ctx)
    assert [int(x) for x in DataLoader(ds, batch_size=None, num_workers=2)] == list(range(6))
    assert ds.count.value == 6


def test_nothing_is_written_to_dev_shm():
    before = set(os.listdir("/dev/shm"))
    for _ in DataLoader(tds.Big(16, 1 << 20), batch_size=4, num_workers=2):
        assert set(os.listdir("/dev/shm")) <= before


def test_batch_size_follows_math_of_ceil():
    n = sum(1 for _ in DataLoader(tds.Counting(23), batch_size=5, num_workers=2))
    assert n == math.ceil(23 / 5)


def test_many_workers():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # torch's "excessive worker creation" warning
        out = list(DataLoader(tds.Counting(40), batch_size=4, num_workers=7))
    assert torch.equal(torch.cat(out), torch.arange(40))


def test_a_dataset_that_fails_to_load_in_a_worker_fails_every_batch():
    it = iter(DataLoader(tds.Unloadable(), batch_size=1, num_workers=1))
    for _ in range(2):
        with pytest.raises(OSError, match="cannot open the dataset's files here") as info:
            next(it)
        assert "loading the dataset" in str(info.value)


def test_tasks_queued_before_a_new_epoch_are_not_computed(tmp_path):
    log = tmp_path / "fetched"
    dl = DataLoader(tds.Logged(20, 1.0, str(log)), batch_size=None, num_workers=1,
                    prefetch_factor=4, persistent_workers=True)
    for _ in dl:
        break                       # tasks 1-4 were sent; the worker is busy with 1
    assert next(iter(dl)) == 0      # the new epoch's first batch
    fetched = [int(x) for x in log.read_text().split()]
    # torch computes (and throws away) 1, 2, 3 and 4 first; here at most the one in progress.
    assert fetched[0] == 0 and fetched.count(0) == 2 and not {2, 3, 4} & set(fetched), fetched
    dl._iterator._shutdown_workers()


def test_nested_tensors_travel_whole_and_default_collate_refuses_them_as_torch_does():
    import warnings as w
    with w.catch_warnings():
        w.simplefilter("ignore")        # "nested tensors are in prototype stage"
        ds = tds.nested_tensors(10)
        for i, b in enumerate(DataLoader(ds, batch_size=1, num_workers=2,
                                         collate_fn=tds.clone_collate)):
            assert b[0].is_nested
            assert torch.equal(b[0].to_padded_tensor(0.0), ds[i].to_padded_tensor(0.0))
        with pytest.raises(RuntimeError, match="not currently supported by the default "
                                               "collate_fn"):
            next(iter(DataLoader(ds, batch_size=1, num_workers=2)))
