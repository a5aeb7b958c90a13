"""How a batch's tensors cross the pool block (shmpipe.torch._wire): geometry (strides,
expand()ed and overlapping views), every strided dtype, aliasing, and the bounds a worker's
references are held to."""

import io
import pickle
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_datasets as tds  # noqa: E402
from shmpipe.torch import DataLoader  # noqa: E402
from shmpipe.torch import _wire  # noqa: E402

ODD_DTYPES = [d for d in (getattr(torch, n, None) for n in (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    "complex32", "bits8", "bits16", "int4", "uint4", "float4_e2m1fn_x2")) if d is not None]


def roundtrip(obj, copy=False, size=1 << 16):
    block = np.zeros(size, np.uint8)
    arena = _wire.Arena(block)
    off, n = _wire.encode(obj, arena)
    return _wire.decode(block, off, n, copy=copy), arena.used


def raw(t):
    """The bytes of each element of ``t`` (any dtype), as integers of its size."""
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(bits).tolist()


@pytest.mark.parametrize("copy", [False, True])
def test_expanded_tensors_travel_once_and_keep_stride_0(copy):
    mask = torch.tril(torch.ones(64, 64))
    batch = mask.expand(32, 64, 64)
    (got,), used = roundtrip((batch,), copy=copy)
    assert got.stride() == (0, 64, 1)
    assert got.untyped_storage().nbytes() == 64 * 64 * 4
    assert used < 2 * 64 * 64 * 4          # not 32 copies of the mask
    assert torch.equal(got, batch)


@pytest.mark.parametrize("copy", [False, True])
def test_permuted_and_overlapping_views_keep_their_strides(copy):
    base = torch.arange(24.0).view(2, 3, 4)
    t = base.permute(2, 0, 1)
    windows = torch.arange(10.0).as_strided((4, 4), (2, 1))    # overlapping windows
    (a, w), _ = roundtrip((t, windows), copy=copy)
    assert a.stride() == t.stride() and torch.equal(a, t)
    assert w.stride() == (2, 1) and torch.equal(w, windows)
    assert w.untyped_storage().nbytes() == 10 * 4


def test_a_sparse_view_sends_its_elements_not_its_storage():
    big = torch.arange(1000.0 * 1000).view(1000, 1000)
    col = big[:, 3]
    (got,), used = roundtrip((col,), size=1 << 20)
    assert torch.equal(got, col)
    assert used < 1000 * 4 + 4096


def test_expanded_batches_from_a_loader_keep_stride_0():
    dl = DataLoader(tds.Counting(8), batch_size=4, num_workers=1,
                    collate_fn=tds.collate_with_expanded_mask)
    for x, mask in dl:
        assert mask.shape == (4, 256, 256) and mask.stride() == (0, 256, 1)
        assert mask.untyped_storage().nbytes() == 256 * 256 * 4
        assert torch.equal(mask[3], torch.tril(torch.ones(256, 256)))


@pytest.mark.parametrize("dt", ODD_DTYPES, ids=str)
@pytest.mark.parametrize("copy", [False, True])
def test_every_strided_dtype_travels_as_its_bytes(dt, copy):
    size = torch.empty((), dtype=dt).element_size()
    u8 = torch.arange(6 * 4 * size, dtype=torch.uint8) % 251
    t = torch.empty(0, dtype=dt).set_(u8.untyped_storage(), 0, (6, 4), (4, 1))
    col = t[:, 1]                                   # a strided view as well
    (a, b), _ = roundtrip((t, col), copy=copy)
    assert a.dtype == dt and b.dtype == dt
    assert a.shape == (6, 4) and b.shape == (6,)
    assert raw(a) == raw(t) and raw(b) == raw(col)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "complex32"])
def test_float8_and_complex32_batches_arrive_as_from_torchs_loader(name):
    dt = getattr(torch, name, None)
    if dt is None:
        pytest.skip(f"no torch.{name}")
    ds = tds.OfDtype(name)
    ours = list(DataLoader(ds, batch_size=2, num_workers=1, timeout=30))
    theirs = list(torch.utils.data.DataLoader(ds, batch_size=2))
    assert [b.dtype for b in ours] == [dt, dt]
    assert [raw(b) for b in ours] == [raw(b) for b in theirs]


@pytest.mark.parametrize("shape,stride", [((2**62,), (0,)), ((2**40,), (0,)),
                                          ((2**40, 2**40), (0, 0)),
                                          ((2**31, 2**31, 4), (0, 0, 1))])
@pytest.mark.parametrize("copy", [False, True])
def test_references_with_absurd_element_counts_are_corrupt_batches(shape, stride, copy):
    nd = len(shape)
    pid = b"T" + _wire._HEAD_T.pack(0, nd, False, 0) + struct.pack(f"<{2 * nd}q", *shape, *stride)

    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return pid if obj == "X" else None

    f = io.BytesIO()
    P(f, protocol=5).dump(["X"])
    data = f.getvalue()
    block = np.zeros(4096, np.uint8)
    block[1024:1024 + len(data)] = np.frombuffer(data, np.uint8)
    with pytest.raises(_wire.CorruptBatch, match="elements"):
        _wire.decode(block, 1024, len(data), copy=copy)


def test_a_tensor_sent_twice_arrives_once():
    t = torch.arange(1000.0)
    a = np.arange(10)
    (x, y, u, v), used = roundtrip((t, t, a, a))
    assert x is y and u is v
    assert used < 2 * 1000 * 4


def test_unbatched_samples_keep_their_strides():
    ours = list(DataLoader(tds.Transposed(), batch_size=None, num_workers=1))
    theirs = list(torch.utils.data.DataLoader(tds.Transposed(), batch_size=None))
    assert [t.stride() for t in ours] == [t.stride() for t in theirs] == [(1, 4)] * 2
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
