"""The torch examples run: a training loop (examples/torch_train.py), and torchrun
--nproc_per_node=2 (gloo, CPU) DDP training where each rank's shmpipe.torch.DataLoader reads
its own shard (examples/torch_ddp.py)."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import torch_datasets as tds  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
EXAMPLE = os.path.join(EXAMPLES, "torch_ddp.py")


def test_the_training_example_learns():
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "torch_train.py"),
                        "--samples", "2048", "--epochs", "2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("epoch 1:") and float(last.split("accuracy ")[1].split(",")[0]) > 0.9


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("ddp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node=2", EXAMPLE, "--out", str(out)]
    # In a private, empty /dev/shm where possible: then "nothing was put there" is exact.
    private = tds.private_dev_shm(cmd)
    before = [] if private else sorted(os.listdir("/dev/shm"))
    r = subprocess.run(private or cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    reports = [json.loads((out / f"rank{i}.json").read_text()) for i in range(2)]
    return reports, before


def test_each_rank_reads_a_disjoint_shard_with_equal_steps(ranks):
    (r0, r1), _ = ranks
    assert (r0["rank"], r1["rank"], r0["world"]) == (0, 1, 2)
    assert r0["steps"] == r1["steps"] == [32, 32]        # 4096 / 2 ranks / 64 per batch
    for epoch in range(2):
        a = r0["seen"][epoch * 2048:(epoch + 1) * 2048]
        b = r1["seen"][epoch * 2048:(epoch + 1) * 2048]
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(4096))
    assert r0["seen"][:2048] != r0["seen"][2048:]          # set_epoch reshuffles
    assert r0["iter_steps"] == r1["iter_steps"] == [32]
    assert not set(r0["iter_seen"]) & set(r1["iter_seen"])
    assert sorted(r0["iter_seen"] + r1["iter_seen"]) == list(range(4096))


def test_ddp_trains_and_keeps_the_replicas_equal(ranks):
    (r0, r1), _ = ranks
    assert r0["last_loss"] < r0["first_loss"] / 10
    assert r0["weight"] == pytest.approx(r1["weight"])


def test_ranks_share_no_process_channel_or_name(ranks):
    (r0, r1), before = ranks
    assert len(r0["worker_pids"]) == len(r1["worker_pids"]) == 2
    assert not set(r0["worker_pids"]) & set(r1["worker_pids"])
    assert r0["memfds"] and r1["memfds"] and not set(r0["memfds"]) & set(r1["memfds"])
    assert r0["dev_shm"] == r1["dev_shm"] == before


def test_lightning_trains_with_it_and_can_swap_in_a_distributed_sampler():
    L = pytest.importorskip("lightning")
    from lightning.pytorch.utilities.data import _update_dataloader

    from shmpipe.torch import DataLoader
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
    ds = torch.utils.data.TensorDataset(x, x.sum(1))
    dl = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2, persistent_workers=True)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(tds.lightning_module(), dl)
    assert float(trainer.callback_metrics["loss"]) < 0.05
    # What Lightning does under DDP: the same loader rebuilt around a DistributedSampler.
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=1, shuffle=False)
    rebuilt = _update_dataloader(dl, sampler)
    assert type(rebuilt) is DataLoader and rebuilt.num_workers == 2
    assert torch.equal(torch.cat([b[1] for b in rebuilt]), ds.tensors[1][1::2])
