"""A GluonTS-style training loop: shmpipe.timeseries.TrainLoader feeds a numpy model.

The DeepAR-style transformation chain runs in Rust in the worker processes; batches arrive
with GluonTS's field names and layouts (``past_target`` (batch, T), ``past_time_feat``
(batch, T, C), ...). The model is a linear forecaster of the next ``prediction_length``
points from the (mean-scaled) context, trained by SGD: numpy is enough to show the loop.

    python crates/python/examples/gluonts_training_loop.py
"""

import json
import os
import tempfile

import numpy as np

from shmpipe.timeseries import TrainLoader, ValidationLoader

CONTEXT, PRED = 48, 12


def make_dataset(path, n=200, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            length = int(rng.integers(200, 600))
            t = np.arange(length)
            y = 10 + 3 * np.sin(2 * np.pi * t / 24 + rng.random()) + rng.normal(0, 0.3, length)
            target = [None if rng.random() < 0.02 else round(float(v), 3) for v in y]
            f.write(json.dumps({"start": "2021-01-01 00:00:00", "item_id": str(i),
                                "target": target}) + "\n")


def forward(w, b, batch):
    past = batch["past_target"]  # (batch, CONTEXT)
    scale = np.abs(past).mean(axis=1, keepdims=True) + 1.0
    return (past / scale) @ w + b, scale


if __name__ == "__main__":
    path = os.path.join(tempfile.mkdtemp(), "train.jsonl")
    make_dataset(path)
    w = np.zeros((CONTEXT, PRED), np.float32)
    b = np.zeros(PRED, np.float32)
    loader = TrainLoader(path, freq="h", context_length=CONTEXT, prediction_length=PRED,
                         batch_size=32, num_batches_per_epoch=50, workers=2)
    for epoch in range(5):
        losses = []
        for batch in loader:  # 50 batches per epoch, from one endless shuffled stream
            pred, scale = forward(w, b, batch)
            err = pred - batch["future_target"] / scale
            losses.append(float((err ** 2).mean()))
            grad = 2 * err / err.size
            w -= 0.05 * (batch["past_target"] / scale).T @ grad
            b -= 0.05 * grad.sum(axis=0)
        print(f"epoch {epoch}: mse {np.mean(losses):.4f}")
    loader.close()
    val = ValidationLoader(path, freq="h", context_length=CONTEXT, prediction_length=PRED,
                           batch_size=64)
    mse = []
    for v in val:
        pred, scale = forward(w, b, v)
        mse.append(float(((pred * scale - v["future_target"]) ** 2).mean()))
    print(f"validation mse {np.mean(mse):.3f} over {len(mse)} batches")
    val.close()
