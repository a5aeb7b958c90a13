"""What shmpipe adds under torch's DataLoader: batches as zero-copy views of pool blocks whose
lease the tensors keep, a channel that grows for big batches, no /dev/shm use, the dataset
shared once (mapped, not copied) into every worker."""

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_datasets as tds  # noqa: E402
from procs import mapping_of  # noqa: E402
from shmpipe.torch import DataLoader, SharedArrayList  # noqa: E402
from shmpipe.torch import _iter  # noqa: E402




def in_channel(addr: int) -> bool:
    """Whether ``addr`` lies in a mapping of a shmpipe channel (an anonymous memfd)."""
    line = mapping_of(addr)
    return "memfd:shmpipe" in line and "shmpipe:torch-dataset" not in line


def held(it) -> int:
    return sum(ch.rx.held_blocks for ch in it._chans if ch.rx is not None)


def test_batches_are_views_of_the_workers_pool_blocks():
    it = iter(DataLoader(tds.Rows(64), batch_size=16, num_workers=2))
    x, idx = next(it)
    assert in_channel(x.data_ptr()) and in_channel(idx.data_ptr())
    assert x.data_ptr() != idx.data_ptr()
    assert torch.equal(x[:, 0], torch.arange(16, dtype=torch.float32) * 16)
    it._shutdown_workers()


def test_a_tensor_keeps_its_block_until_it_is_garbage():
    it = iter(DataLoader(tds.Rows(64), batch_size=8, num_workers=1, prefetch_factor=1))
    x, _ = next(it)
    view = x[2:4]           # a view of the batch keeps the block too
    del x
    gc.collect()
    assert held(it) == 1
    assert in_channel(view.data_ptr())
    before = view.clone()
    for _ in range(3):      # the worker keeps writing other blocks meanwhile
        next(it)
    gc.collect()
    assert torch.equal(view, before)
    del view
    gc.collect()
    assert held(it) == 0
    it._shutdown_workers()


def test_keeping_every_batch_copies_beyond_the_hold_limit_instead_of_stalling():
    ds = tds.Rows(400)
    kept = list(DataLoader(ds, batch_size=2, num_workers=2, timeout=60))
    assert len(kept) == 200
    x = torch.cat([b[0] for b in kept])
    assert torch.equal(x, torch.from_numpy(ds.x))
    in_blocks = sum(in_channel(b[0].data_ptr()) for b in kept)
    assert 0 < in_blocks <= 2 * _iter.HOLD


def test_big_batches_grow_the_channel():
    out = [b for b in DataLoader(tds.Growing(), batch_size=4, num_workers=1)]
    assert [b.shape for b in out] == [(4, 1000 * 4 ** k) for k in range(4)]
    for k, b in enumerate(out):
        assert torch.equal(b[:, 0], torch.arange(4 * k, 4 * k + 4, dtype=torch.float32))
        assert bool((b == b[:, :1]).all())


SMALL_SHM = """
import os, sys
sys.path.insert(0, {here!r})
import torch_datasets as tds
from shmpipe.torch import DataLoader
if __name__ == "__main__":
    n = 0
    for b in DataLoader(tds.Big(192, 1 << 20), batch_size=64, num_workers=2):
        assert b.shape == (64, 1 << 18) and float(b[63, -1]) == n * 64 + 63
        assert os.listdir("/dev/shm") == [], os.listdir("/dev/shm")
        n += 1
    print("batches", n)
"""


def test_64_mb_batches_run_to_the_end_under_a_64_mb_dev_shm(tmp_path):
    """Docker's default /dev/shm: torch's loader dies with "Bus error" on batches this size
    (pytorch#5040); shmpipe's channels are memfds, which that mount does not bound."""
    script = tmp_path / "small_shm.py"
    script.write_text(SMALL_SHM.format(here=os.path.dirname(os.path.abspath(__file__))))
    argv = tds.private_dev_shm([sys.executable, str(script)])
    if argv is None:
        pytest.skip("needs a private mount namespace (unshare -m, as root)")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "batches 3" in r.stdout, r.stdout + r.stderr


def test_the_dataset_is_mapped_in_workers_not_copied():
    out = list(DataLoader(tds.Holds(), batch_size=None, num_workers=2,
                          sampler=range(0, 5000, 499)))
    assert len(out) == 11
    for s in out:
        assert s["big_shared"] == 1 and s["tensor_shared"] == 1 and s["item_shared"] == 1
        assert s["kind"] == "SharedArrayList"
        assert s["big_sum"] == 45.0 and s["tensor_last"] == (1 << 18) - 1
    ds = tds.Holds()
    for s in out:
        assert torch.equal(s["item"], torch.from_numpy(ds.items[s["i"]]))


def test_lists_of_arrays_of_several_shapes_are_packed_too():
    ds = tds.Holds(vary=True)
    out = list(DataLoader(ds, batch_size=None, num_workers=1, sampler=[0, 1, 2, 3, 4, 4999]))
    for s in out:
        assert s["kind"] == "SharedArrayList" and s["item_shared"] == 1
        assert torch.equal(s["item"], torch.from_numpy(ds.items[s["i"]]))


def test_small_lists_stay_lists():
    out = list(DataLoader(tds.Holds(n_list=100), batch_size=None, num_workers=1,
                          sampler=[0, 99]))
    assert [s["kind"] for s in out] == ["list", "list"]


def test_writes_to_the_shared_dataset_stay_in_the_worker():
    ds = tds.Writes()
    assert list(DataLoader(ds, batch_size=None, num_workers=1)) == list(range(1, 9))
    assert list(DataLoader(ds, batch_size=None, num_workers=1)) == list(range(1, 9))
    assert ds.x.sum() == 0


SHAPES = {
    "one 2-d shape": lambda i: (2, 3),
    "varying": lambda i: (i % 3 + 1,),
    "varying 2-d": lambda i: (i % 2 + 1, 2),
    "0-d": lambda i: (),
}


@pytest.mark.parametrize("shapes", list(SHAPES))
def test_shared_array_list_behaves_as_a_sequence(shapes):
    from shmpipe.torch import _share
    arrays = [np.full(SHAPES[shapes](i), i, np.int32) for i in range(5000)]
    fd = _share.share({"a": arrays, "t": tuple(torch.from_numpy(a) for a in arrays)})
    got = _share.load(fd)
    for key, kind in (("a", np.ndarray), ("t", torch.Tensor)):
        seq = got[key]
        assert isinstance(seq, SharedArrayList) and len(seq) == 5000
        assert isinstance(seq[7], kind) and seq[-1].tolist() == arrays[-1].tolist()
        assert [x.tolist() for x in seq[10:13]] == [a.tolist() for a in arrays[10:13]]
        assert all(x.shape == a.shape and x.tolist() == a.tolist() for x, a in zip(seq, arrays))
        with pytest.raises(IndexError):
            seq[5000]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_a_shared_tensor_is_a_whole_tensor_as_in_torchs_worker_not_a_view(dtype):
    """torch's forked worker indexes the trainer's own tensor (no ``_base``); a shared one
    was a view of a byte tensor through a dtype change, whose every index recorded a replay
    function (2-5% slower per ``x[i]``) and showed a ``_base`` torch's has not."""
    from shmpipe.torch import _share
    t = torch.arange(24).reshape(2, 3, 4).to(dtype)
    for src in (t, t[:, 1], torch.empty(0, 3, dtype=dtype)):
        got = _share.load(_share.share(src))
        assert not got._is_view() and got._base is None
        assert got.dtype == src.dtype and got.shape == src.shape
        # A whole tensor stays whole; a strided view keeps its strides, as in torch's fork
        # (test_torch_share.py covers views sharing one region).
        assert got.stride() == src.stride()
        assert torch.equal(got, src)
    x = _share.load(_share.share(t.clone().requires_grad_(dtype is torch.float32)))
    assert x.requires_grad == (dtype is torch.float32) and x.is_leaf


def test_a_dataset_holding_a_0_d_tensor_is_still_shared():
    """A 0-d tensor (a scale, a mean) made sharing fail ("cannot view Float as Byte") and the
    whole dataset was pickled into every worker instead: its arrays copied, not mapped."""
    from shmpipe.torch import _share
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.uint8):
        x = torch.tensor(3, dtype=dtype)
        got = _share.load(_share.share(x))
        assert got.shape == () and got.dtype == dtype and got.item() == 3
    out = list(DataLoader(tds.Holds(n_list=5000, scale=torch.tensor(0.5)), batch_size=None,
                          num_workers=1, sampler=[0, 4999]))
    assert [(s["big_shared"], s["item_shared"], s["scale"]) for s in out] == [(1, 1, 0.5)] * 2


def test_a_shared_dataset_must_be_sealed():
    from shmpipe.torch import _share
    fd = os.memfd_create("unsealed", os.MFD_ALLOW_SEALING)
    os.write(fd, b"\0" * 64)
    with pytest.raises(_share.CorruptDataset, match="not sealed"):
        _share.load(fd)


def test_corrupt_references_from_a_worker_are_errors_not_reads_outside_the_block():
    from shmpipe.torch import _wire
    block = np.zeros(1 << 12, np.uint8)
    arena = _wire.Arena(block)
    t = arena.tensor((4, 4), torch.float32)
    off, n = _wire.encode({"t": t}, arena)
    assert _wire.decode(block, off, n, copy=False)["t"].shape == (4, 4)
    with pytest.raises(_wire.CorruptBatch):
        _wire.decode(block, len(block) - 2, 10, copy=False)
    # Rewrite the reference's storage offset to point past the block.
    data = bytes(block[off:off + n])
    ref = _wire._HEAD_T.pack(0, 2, False, 0)
    bad = _wire._HEAD_T.pack(0, 2, False, 1 << 10)
    assert ref in data
    block[off:off + n] = np.frombuffer(data.replace(ref, bad), np.uint8)
    with pytest.raises(_wire.CorruptBatch, match="outside the block"):
        _wire.decode(block, off, n, copy=False)


def test_tensor_dataset_batches_are_gathered_in_one_step_per_tensor():
    x, y = torch.randn(100, 3), torch.arange(100)
    ds = torch.utils.data.TensorDataset(x, y)
    g = torch.Generator().manual_seed(1)
    out = list(DataLoader(ds, batch_size=8, shuffle=True, generator=g, num_workers=2,
                          worker_init_fn=tds.forbid_tensor_dataset_getitem))
    order = torch.cat([b[1] for b in out])
    assert sorted(order.tolist()) == list(range(100))
    assert torch.equal(torch.cat([b[0] for b in out]), x[order])
    assert isinstance(out[0], list)
    # Without automatic batching, samples are fetched one by one (and here refused).
    with pytest.raises(AssertionError, match="__getitem__ was called"):
        next(iter(DataLoader(ds, batch_size=None, num_workers=1,
                             worker_init_fn=tds.forbid_tensor_dataset_getitem)))
