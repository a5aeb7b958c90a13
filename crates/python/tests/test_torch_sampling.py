"""The trainer's shuffled batches without torch's list of every index (shmpipe.torch._sampling):
the same batches, drawn from the generator at the same moments, as torch's BatchSampler over
its RandomSampler; other samplers keep their own code."""

import tracemalloc

import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

from shmpipe.torch import DataLoader, _sampling  # noqa: E402


def gen(seed=7):
    return torch.Generator().manual_seed(seed)


# (dataset length, num_samples, batch size, drop_last): rounds that end inside a batch, on a
# batch's end, several rounds, fewer samples than the dataset, batches larger than a round.
CASES = [(50, None, 7, False), (50, None, 7, True), (48, None, 8, False), (48, None, 8, True),
         (10, 23, 3, False), (10, 23, 3, True), (10, 20, 3, False), (10, 20, 3, True),
         (10, 20, 5, False), (10, 4, 3, False), (10, 4, 3, True), (5, 17, 40, False),
         (5, 17, 40, True), (1, 3, 2, False)]


def batch_sampler(n, num_samples, size, drop_last, generator):
    s = tud.RandomSampler(range(n), num_samples=num_samples, generator=generator)
    return tud.BatchSampler(s, size, drop_last)


@pytest.mark.parametrize("case", CASES)
def test_same_batches_and_generator_state_after_every_batch(case):
    ours_g, theirs_g = gen(), gen()
    ours = _sampling.lean_batches(batch_sampler(*case, ours_g))
    theirs = iter(batch_sampler(*case, theirs_g))
    assert _sampling.applies(batch_sampler(*case, gen()))
    while True:
        a, b = next(ours, None), next(theirs, None)
        assert a == b
        assert all(type(i) is int for i in a or [])
        assert torch.equal(ours_g.get_state(), theirs_g.get_state())
        if a is None:
            break


@pytest.mark.parametrize("case", CASES[:6])
def test_without_a_generator_the_global_one_seeds_it_at_the_first_batch(case):
    torch.manual_seed(3)
    ours = _sampling.lean_batches(batch_sampler(*case, None))
    before = torch.get_rng_state()
    a = [next(ours)]
    a_state = torch.get_rng_state()
    a += list(ours)
    torch.manual_seed(3)
    theirs = iter(batch_sampler(*case, None))
    assert torch.equal(before, torch.get_rng_state())       # nothing drawn before the first
    b = [next(theirs)]
    assert torch.equal(a_state, torch.get_rng_state())
    b += list(theirs)
    assert a == b


def test_other_samplers_are_left_to_their_own_code():
    class MyBatches(tud.BatchSampler):
        pass

    class MyRandom(tud.RandomSampler):
        pass

    assert not _sampling.applies(MyBatches(tud.RandomSampler(range(5)), 2, False))
    assert not _sampling.applies(tud.BatchSampler(MyRandom(range(5)), 2, False))
    assert not _sampling.applies(
        tud.BatchSampler(tud.RandomSampler(range(5), replacement=True), 2, False))
    assert not _sampling.applies(tud.BatchSampler(tud.SequentialSampler(range(5)), 2, False))
    assert not _sampling.applies(tud.RandomSampler(range(5)))
    assert not _sampling.applies([[0, 1], [2]])


def test_a_shuffled_epoch_holds_no_python_int_per_sample():
    """torch's RandomSampler makes a list of every index at the first batch (1M ints: ~40 MB
    of Python objects); the lean iteration holds the permutation as one tensor."""
    n = 1_000_000
    lean = _sampling.lean_batches(batch_sampler(n, None, 256, False, gen()))
    tracemalloc.start()
    try:
        next(lean)
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 1_000_000, f"{held} bytes of Python objects after the first batch"


def test_the_loader_shuffles_like_torch_over_several_rounds_with_workers():
    ds = tud.TensorDataset(torch.arange(30))
    for drop_last in (False, True):
        g_ours, g_theirs = gen(5), gen(5)
        ours = DataLoader(ds, num_workers=2, batch_size=4, drop_last=drop_last,
                          sampler=tud.RandomSampler(ds, num_samples=70, generator=g_ours))
        theirs = tud.DataLoader(ds, num_workers=0, batch_size=4, drop_last=drop_last,
                                sampler=tud.RandomSampler(ds, num_samples=70,
                                                          generator=g_theirs))
        for _ in range(2):
            a, b = list(ours), list(theirs)
            assert len(a) == len(b)
            assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b))
        assert torch.equal(g_ours.get_state(), g_theirs.get_state())


def test_a_loader_with_workers_iterates_shuffle_true_the_lean_way():
    ds = tud.TensorDataset(torch.arange(30))
    loader = DataLoader(ds, num_workers=1, batch_size=4, shuffle=True)
    it = iter(loader)
    assert it._sampler_iter.gi_code is _sampling.lean_batches.__code__
    assert len(list(it)) == 8


@pytest.mark.parametrize("drop_last", [False, True])
def test_large_rounds_come_from_their_own_mapping_with_torchs_values(drop_last):
    n = _sampling.OWN_MAPPING + 5
    for num_samples in (None, 2 * n + 3):
        ours_g, theirs_g = gen(2), gen(2)
        ours = _sampling.lean_batches(batch_sampler(n, num_samples, 1000, drop_last, ours_g))
        theirs = iter(batch_sampler(n, num_samples, 1000, drop_last, theirs_g))
        assert list(ours) == list(theirs)
        assert torch.equal(ours_g.get_state(), theirs_g.get_state())
