"""Distributed data-parallel training (DDP, gloo, CPU) with shmpipe.torch.DataLoader.

Run it with torchrun, one process per rank:

    torchrun --standalone --nproc_per_node=2 crates/python/examples/torch_ddp.py

Each rank builds its own DataLoader with its own workers and reads its own shard, in two
ways: a map-style dataset through ``DistributedSampler`` (which reads the rank from the
process group), and an iterable dataset that shards itself by ``RANK`` / ``WORLD_SIZE`` and
by ``get_worker_info()``. Ranks share nothing through shmpipe: each has its own fork server,
workers and anonymous channels (memfds), so there is no name to collide and no memory in
common. On several machines, start torchrun (or one ``srun`` task per GPU under SLURM) on
every node: each rank's loader is local to its node; nothing crosses hosts except what torch
itself sends (gradients over gloo/NCCL).

``--out DIR`` writes what each rank saw to ``DIR/rank<N>.json`` (the test of this example
reads it).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, IterableDataset, get_worker_info
from torch.utils.data.distributed import DistributedSampler

from shmpipe.torch import DataLoader

N, FEATURES = 4096, 16


class Regression(Dataset):
    """y = x . w + noise; sample i is (x_i, y_i, i)."""

    def __init__(self, n: int = N):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=g)
        w = torch.linspace(-1, 1, FEATURES)
        self.y = self.x @ w + 0.01 * torch.randn(n, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class RankShards(IterableDataset):
    """The same samples as an iterable dataset: rank r of R, worker w of W, reads every
    (R*W)-th sample from r*W + w."""

    def __init__(self, data: Regression):
        self.data = data

    def __iter__(self):
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info else (0, 1)
        for i in range(rank * workers + wid, len(self.data), world * workers):
            yield self.data[i]


def memfds() -> list[int]:
    """Inodes of the shmpipe channels this process has mapped."""
    inodes = set()
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:shmpipe" in line and "torch-dataset" not in line:
                inodes.add(int(line.split()[4]))
    return sorted(inodes)


def train(loader, model, opt, epochs, sampler=None):
    steps, seen, losses = [], [], []
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        n = 0
        for x, y, idx in loader:
            loss = nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.extend(idx.tolist())
            losses.append(loss.item())
            n += 1
        steps.append(n)
    return steps, seen, losses


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(FEATURES, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = Regression()

    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers, persistent_workers=True)
    steps, seen, losses = train(loader, model, opt, args.epochs, sampler)
    channels = memfds()
    pids = [w.pid for w in loader._iterator._workers]

    stream = DataLoader(RankShards(data), batch_size=args.batch_size, num_workers=args.workers)
    it_steps, it_seen, it_losses = train(stream, model, opt, 1)

    print(f"rank {rank}/{world}: {steps} steps per epoch, loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}; iterable shard: {it_steps[0]} steps, loss {it_losses[-1]:.4f}")
    if args.out:
        report = {"rank": rank, "world": world, "steps": steps, "seen": seen,
                  "first_loss": losses[0], "last_loss": losses[-1], "iter_steps": it_steps,
                  "iter_seen": it_seen, "worker_pids": pids, "memfds": channels,
                  "weight": model.module.weight.detach().flatten().tolist(),
                  "dev_shm": sorted(os.listdir("/dev/shm"))}
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
