"""Training a small classifier with shmpipe.torch.DataLoader instead of torch's.

    python crates/python/examples/torch_train.py

The only change from a plain PyTorch script is the import of ``DataLoader``. The dataset
decodes and augments images in ``__getitem__`` (in the workers); batches arrive as tensors
over shmpipe's shared memory, with nothing written to ``/dev/shm``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from shmpipe.torch import DataLoader      # instead of: from torch.utils.data import DataLoader


class Shapes(Dataset):
    """1x32x32 images of a square (label 0) or a cross (label 1), noisy and randomly shifted."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)              # sample i is the same in every epoch
        img = rng.normal(0, 0.3, (32, 32)).astype(np.float32)
        label = i % 2
        r, c = rng.integers(8, 24, 2)
        if label == 0:
            img[r - 5:r + 5, c - 5:c + 5] += 1.0
        else:
            img[r - 1:r + 1, c - 7:c + 7] += 1.0
            img[r - 7:r + 7, c - 1:c + 1] += 1.0
        if torch.rand(()) < 0.5:                    # augmentation with the worker's seeded RNG
            img = img[:, ::-1].copy()
        return img[None], label


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 5), nn.ReLU(), nn.MaxPool2d(4), nn.Flatten(),
                          nn.Linear(8 * 7 * 7, 2))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = DataLoader(Shapes(args.samples), batch_size=64, shuffle=True, num_workers=2,
                        persistent_workers=True, generator=torch.Generator().manual_seed(0))
    for epoch in range(args.epochs):
        t0, correct, seen = time.perf_counter(), 0, 0
        for x, y in loader:                          # x: (64, 1, 32, 32) float32, y: (64,)
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            correct += int((out.argmax(1) == y).sum())
            seen += len(y)
        print(f"epoch {epoch}: loss {loss.item():.3f}, accuracy {correct / seen:.3f}, "
              f"{seen / (time.perf_counter() - t0):,.0f} samples/s")


if __name__ == "__main__":
    main()
