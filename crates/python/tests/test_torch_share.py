"""The dataset shared once with the workers (``_share.py``): aliasing kept (each buffer written
once, views stay views), memmaps reopened from their file, non-contiguous arrays and ndarray
subclasses out of band, lists of arrays behaving as lists, the share reused across epochs
while the dataset is unchanged. Sizes are the memfd's (``fstat``), never timings."""

import os
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_share_datasets as sds  # noqa: E402
from shmpipe.torch import DataLoader, _share  # noqa: E402

MiB = 1 << 20


def share_load(obj):
    fd = _share.share(obj)
    size = os.fstat(fd).st_size
    return _share.load(fd), size


# -- 1. aliasing ------------------------------------------------------------------------

def test_a_long_list_of_references_to_a_few_arrays_is_written_once():
    series = [np.full(64 * 1024, k, np.float32) for k in range(50)]       # 50 x 256 KiB
    win = [series[i % 50] for i in range(5000)]
    got, size = share_load({"win": win, "again": win})
    assert size < 14 * MiB, f"memfd of {size / MiB:.0f} MiB for 12.5 MiB of arrays"
    w = got["win"]
    assert got["again"] is w and len(w) == 5000
    assert float(w[4999][0]) == 49.0 and float(w[51][0]) == 1.0
    assert np.shares_memory(w[1], w[51])


def test_overlapping_tensor_views_share_one_storage():
    base = torch.arange(1 << 20, dtype=torch.float32)                   # 4 MiB
    views = [base[i * 2048: i * 2048 + (1 << 19)] for i in range(256)]   # 2 MiB each
    strided = base.view(1024, 1024)[:, ::2].t()
    got, size = share_load((base, views, strided))
    assert size < 5 * MiB, f"memfd of {size / MiB:.0f} MiB for a 4 MiB tensor"
    gbase, gviews, gstrided = got
    assert all(torch.equal(g, v) for g, v in zip(gviews, views))
    assert gstrided.stride() == strided.stride() and torch.equal(gstrided, strided)
    store = gbase.untyped_storage().data_ptr()
    assert all(v.untyped_storage().data_ptr() == store for v in gviews + [gstrided])
    gviews[1][0] = -1.0                          # views of one buffer, as after a fork
    assert gbase[2048] == -1.0 and gviews[0][2048] == -1.0


def test_overlapping_numpy_views_and_a_tensor_over_the_same_array_share_it():
    a = np.arange(1 << 20, dtype=np.float64)                             # 8 MiB
    t = torch.from_numpy(a)
    views = [a[i * 4096: i * 4096 + (1 << 18)] for i in range(200)]
    got, size = share_load((views, a, t))
    assert size < 9 * MiB, f"memfd of {size / MiB:.0f} MiB for an 8 MiB array"
    gviews, ga, gt = got
    assert all(np.array_equal(g, v) for g, v in zip(gviews, views))
    gviews[0][4096] = -5.0
    assert ga[4096] == -5.0 and gviews[1][0] == -5.0 and gt[4096] == -5.0


# -- 2. memmaps, non-contiguous arrays, subclasses ----------------------------------------

def test_a_memmap_is_reopened_from_its_file_not_copied(tmp_path):
    path = tmp_path / "big.bin"
    np.arange(4 * MiB, dtype=np.float32).tofile(path)                   # 16 MiB
    mm = np.memmap(path, dtype=np.float32, mode="r", shape=(MiB, 4))
    rows = mm[10:, 1:3]
    got, size = share_load({"mm": mm, "rows": rows})
    assert size < MiB, f"memfd of {size / MiB:.0f} MiB for a memmap"
    g = got["mm"]
    assert isinstance(g, np.memmap) and g.shape == mm.shape and np.array_equal(g[-3:], mm[-3:])
    assert str(path) in sds.mapping_of(sds.addr(g)) and not g.flags.writeable
    gr = got["rows"]
    assert gr.strides == rows.strides and np.array_equal(gr, rows)
    assert str(path) in sds.mapping_of(sds.addr(gr))


def test_non_contiguous_arrays_and_subclasses_are_mapped_views():
    table = np.ones((1 << 16, 33), np.float32)                           # 8.25 MiB
    feats = table[:, :-1]
    m = np.ones((512, 512)).view(sds.Tagged)
    got, size = share_load({"feats": feats, "m": m, "table": table})
    assert size < 11 * MiB
    g = got["feats"]
    assert g.strides == feats.strides and sds.in_dataset_memfd(g)
    assert np.shares_memory(g, got["table"])
    assert type(got["m"]) is sds.Tagged and sds.in_dataset_memfd(got["m"])


def test_memmap_dataset_in_a_worker_maps_the_file(tmp_path):
    path = tmp_path / "ds.bin"
    np.arange(MiB, dtype=np.float32).tofile(path)
    mm = np.memmap(path, dtype=np.float32, mode="r")
    out = list(DataLoader(MmapDS(mm), batch_size=None, num_workers=1))
    assert [tuple(x) for x in out] == [(str(path), 0.0), (str(path), 1.0)]


class MmapDS(torch.utils.data.Dataset):
    def __init__(self, a):
        self.a = a

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return (sds.mapping_of(sds.addr(self.a)).split()[-1], float(self.a[i]))


# -- 3. lists of arrays --------------------------------------------------------------------

def test_structured_dtypes_keep_their_fields():
    rows = [np.array([(float(i), i)], dtype=sds.REC) for i in range(5000)]
    got, _ = share_load(rows)
    assert got[17]["price"][0] == 17.0 and got[17].dtype == sds.REC


def test_a_shared_list_behaves_as_a_list():
    arrays = [np.full(3, i, np.int64) for i in range(5000)]
    got, _ = share_load(arrays)
    assert isinstance(got, list) and len(got) == 5000
    assert sds.in_dataset_memfd(got[3])
    assert got == got and got[2:4][1].tolist() == [3, 3, 3]
    got[0] = np.zeros(1)
    got.append(np.ones(2))
    random.Random(0).shuffle(got)
    assert len(got) == 5001 and sum(len(x) for x in got) == 3 * 4999 + 3
    t, _ = share_load(tuple(arrays))
    assert isinstance(t, tuple)
    with pytest.raises(TypeError):
        t[0] = 1


@pytest.mark.parametrize("cls", [sds.Structured, sds.LazyCache, sds.Shuffled])
def test_workers_see_lists_of_arrays_as_torch_does(cls):
    kw = {"worker_init_fn": sds.shuffle_init} if cls is sds.Shuffled else {}
    ref = list(torch.utils.data.DataLoader(cls(), batch_size=4, num_workers=1, **kw))[:3]
    got = list(DataLoader(cls(), batch_size=4, num_workers=1, **kw))[:3]
    assert len(ref) == len(got) and repr(ref) == repr(got)


# -- 4. epochs -----------------------------------------------------------------------------

def test_epochs_reuse_the_share_while_the_dataset_is_unchanged():
    ds = sds.Inode()
    loader = DataLoader(ds, batch_size=None, num_workers=1)
    e1, e2 = list(loader), list(loader)
    assert e1 == e2 and e1[0][1] == 1.0
    ds.a[0] = 7.0                               # changed in place: the next epoch sees it
    e3 = list(loader)
    assert e3[0][1] == 7.0 and e3[0][0] != e1[0][0]
    e4 = list(loader)
    assert e4 == e3


def test_a_dataset_without_arrays_is_shared_too():
    fd = _share.share({"a": [1, 2], "b": "x"})
    assert _share.load(fd) == {"a": [1, 2], "b": "x"}


def test_a_replaced_memmap_file_is_an_error_not_other_data(tmp_path):
    path = tmp_path / "x.bin"
    np.arange(1024, dtype=np.float32).tofile(path)
    fd = _share.share(np.memmap(path, dtype=np.float32, mode="r"))
    os.rename(path, tmp_path / "old.bin")
    np.zeros(1024, np.float32).tofile(path)
    with pytest.raises(_share.CorruptDataset, match="replaced"):
        _share.load(fd)


def test_a_loader_with_a_cached_share_still_copies_and_pickles():
    import copy
    import pickle
    loader = DataLoader(sds.Inode(), batch_size=None, num_workers=1)
    list(loader)
    assert loader._shmpipe_shared is not None
    assert copy.deepcopy(loader)._shmpipe_shared is None
    assert pickle.loads(pickle.dumps(loader))._shmpipe_shared is None


def test_two_lists_of_the_same_arrays_share_their_bytes():
    arrays = [np.full(256, i, np.float64) for i in range(5000)]           # 10 MiB
    views = [a[1:] for a in arrays]
    got, size = share_load({"all": arrays, "train": arrays[:4500], "first": arrays[0],
                            "views": views})
    assert size < 12 * MiB, f"memfd of {size / MiB:.0f} MiB for 10 MiB of arrays"
    assert np.shares_memory(got["all"][3], got["train"][3])
    assert np.shares_memory(got["first"], got["all"][0])
    assert float(got["views"][4999][0]) == 4999.0 and got["views"][7].shape == (255,)


def test_a_long_list_of_owned_arrays_of_one_shape_costs_its_bytes_and_no_table():
    arrays = [np.full(16, i, np.float32) for i in range(100_000)]         # 6.1 MiB
    data = 100_000 * 64
    got, size = share_load({"x": arrays})
    # header, pickle, meta and page rounding: no entry per array (a table would be 2.3 MiB)
    assert size - data < 64 << 10, f"memfd of {size} bytes for {data} bytes of arrays"
    x = got["x"]
    assert len(x) == 100_000 and float(x[99_999][15]) == 99_999.0 and x[5].shape == (16,)
    assert x[7].flags.c_contiguous and sds.in_dataset_memfd(x[7])
    t, size = share_load(tuple(np.full((2, 3), i, np.int32) for i in range(50_000)))
    assert size - 50_000 * 24 < 64 << 10 and isinstance(t, tuple) and t[-1][1, 2] == 49_999


def test_arrays_of_an_evenly_packed_list_keep_their_aliases():
    arrays = [np.full(8, i, np.float64) for i in range(5000)]
    got, size = share_load({"first": arrays[0], "all": arrays, "again": tuple(arrays),
                            "last": arrays[-1], "tail": arrays[-1][4:],
                            "dups": [arrays[1]] * 2 + arrays[2:4096]})
    assert size < 5000 * 64 + (256 << 10), f"memfd of {size} bytes for 320 kB of arrays"
    a = got["all"]
    assert np.shares_memory(got["first"], a[0]) and np.shares_memory(got["again"][9], a[9])
    assert np.shares_memory(got["last"], a[-1]) and np.shares_memory(got["tail"], a[-1])
    assert np.shares_memory(got["dups"][0], got["dups"][1])
    assert np.shares_memory(got["dups"][2], a[2]) and float(got["tail"][0]) == 4999.0
