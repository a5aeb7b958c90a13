"""GluonTS with shmpipe's loaders against GluonTS's own, same data, same run.

1. Loader throughput (windows/s) of DeepAR's training chain (the estimator's
   ``create_transformation()`` + training instance splitter, past = context + max lag),
   batch 32: GluonTS 0.17's ``TrainDataLoader`` (one process) vs ``shmpipe.gluonts.
   TrainDataLoader`` with the same chain run in Python by ``--workers`` workers
   (``fast_path=False``: the user-chain path) vs the same loader on the Rust fast path.
2. Training: ``gluonts.torch.DeepAREstimator`` (CPU, context 168, prediction 24, 2 layers
   of 40, batch 32, 100 batches per epoch, torch on one thread, ``--epochs`` epochs), with
   GluonTS's loader, with ``use_shmpipe`` (Rust fast path), and with a user's own step in
   front of DeepAR's transformation and ``use_shmpipe`` (the chain in Python workers, with
   and without the native ``AddTimeFeatures``), each from the same seed: seconds per epoch,
   the share of the epoch spent waiting for batches (time inside the loader's ``next``),
   final training loss.

Data: 2,000 hourly series of 500-5,000 points with 1% nulls, full-precision JSON lines (made once, kept
in ``--data``'s path). Prints the UTC time and the load average with every figure.

    python crates/python/bench/bench_gluonts_training.py [--epochs 3] [--workers 2]
        [--rounds 2] [--modes gluonts,shmpipe-rust,...] [--skip-loaders] [--skip-training]
        [--data /tmp/shmpipe_gluonts_long.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from datetime import datetime, timezone

import numpy as np
from gluonts.transform import MapTransformation

warnings.filterwarnings("ignore")

CONTEXT, PRED, BATCH, BATCHES = 168, 24, 32, 100


def stamp() -> str:
    la = os.getloadavg()
    return (f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC, "
            f"load {la[0]:.1f} {la[1]:.1f} {la[2]:.1f}")


def generate(path: str, n: int = 2000, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for i in range(n):
            length = int(rng.integers(500, 5001))
            level = rng.gamma(2.0, 10.0)
            t = np.arange(length)
            y = level * (1 + 0.3 * np.sin(2 * np.pi * t / 24)) + rng.normal(0, level / 5, length)
            vals = [None if m else float(v)
                    for v, m in zip(np.abs(y), rng.random(length) < 0.01)]
            f.write(json.dumps({"start": "2021-01-01 00:00:00", "item_id": f"s{i}",
                                "target": vals}) + "\n")
    os.replace(tmp, path)


class UserCheck(MapTransformation):
    """A user's own step (the Rust chain has no such thing, so the chain runs in Python):
    notes the share of observed points, leaves the target as it is (same windows, same
    loss). Defined in this script: the workers load it as multiprocessing's spawn does."""

    def map_transform(self, data, is_train):
        data["observed_share"] = float(np.mean(~np.isnan(data["target"])))
        return data


def user_estimator_class():
    from gluonts.torch.model.deepar import DeepAREstimator

    class UserDeepAR(DeepAREstimator):
        def create_transformation(self):
            return UserCheck() + super().create_transformation()

    return UserDeepAR


def estimator(epochs: int, root: str, user_step: bool = False):
    from gluonts.torch.model.deepar import DeepAREstimator

    cls = user_estimator_class() if user_step else DeepAREstimator
    return cls(
        freq="h", prediction_length=PRED, context_length=CONTEXT, num_layers=2,
        hidden_size=40, batch_size=BATCH, num_batches_per_epoch=BATCHES,
        trainer_kwargs={"max_epochs": epochs, "accelerator": "cpu", "logger": False,
                        "enable_progress_bar": False, "enable_model_summary": False,
                        "default_root_dir": root})


def training_chain(user_step: bool = False):
    """DeepAR's training transformation and splitter, as its estimator builds them (with a
    user's own step in front: ``user_step``)."""
    from gluonts.torch.model.deepar.estimator import TRAINING_INPUT_NAMES
    from gluonts.transform import SelectFields

    est = estimator(1, "/tmp")
    module = est.create_lightning_module()
    chain = (est.create_transformation() + est._create_instance_splitter(module, "training")
             + SelectFields(TRAINING_INPUT_NAMES))
    return UserCheck() + chain if user_step else chain


def rate(loader, batches: int, warm: int) -> float:
    it = iter(loader)
    for _ in range(warm):
        next(it)
    t0 = time.perf_counter()
    n = 0
    for _ in range(batches):
        n += len(next(it)["past_target"])
    return n / (time.perf_counter() - t0)


def loaders(path: str, workers: int) -> None:
    from gluonts.dataset.common import FileDataset
    from gluonts.dataset.loader import TrainDataLoader as GluonTSTrain
    from gluonts.torch.batchify import batchify

    from shmpipe.gluonts import TrainDataLoader

    ds = FileDataset(path, freq="h")
    print(f"\n1. loader throughput, batch {BATCH}, DeepAR's training chain "
          f"(past {CONTEXT}+lags), windows/s; 'user chain': a user's own step in front of it")
    base = {}
    for user in (False, True):
        np.random.seed(0)
        g = GluonTSTrain(ds, transform=training_chain(user), batch_size=BATCH,
                         stack_fn=batchify)
        base[user] = rate(g, 60, 3)
        label = "user chain" if user else "DeepAR chain"
        print(f"  GluonTS TrainDataLoader, {label:12s} (1 process):     {base[user]:7.0f}   "
              f"1.0x   [{stamp()}]")
    runs = ((True, True, "user chain, native AddTimeFeatures", 400),
            (True, False, "user chain, all GluonTS code", 200),
            (False, True, "DeepAR chain, Rust fast path", 2000))
    for user, fast, label, n in runs:
        with TrainDataLoader(ds, transform=training_chain(user), batch_size=BATCH,
                             stack_fn=batchify, num_workers=workers, fast_path=fast,
                             seed=0) as dl:
            assert dl.fast_path == (fast and not user), dl.why_not_fast
            r = rate(dl, n, 10)
        print(f"  shmpipe, {label:36s} {workers} workers: {r:7.0f} {r / base[user]:5.1f}x   "
              f"[{stamp()}]")


class Timed:
    """An iterable whose iterators count the time spent in ``next``."""

    def __init__(self, inner, clock):
        self.inner, self.clock = inner, clock

    def __iter__(self):
        it = iter(self.inner)
        while True:
            t0 = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                return
            finally:
                self.clock["wait"] += time.perf_counter() - t0
            yield b


def train_once(path: str, epochs: int, mode: str, workers: int, root: str) -> dict:
    import lightning.pytorch as pl
    import torch
    from gluonts.dataset.common import FileDataset

    from shmpipe.gluonts import use_shmpipe

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    est = estimator(epochs, root, user_step=mode.startswith("user"))
    if mode != "gluonts":
        use_shmpipe(est, num_workers=workers, fast_path=(mode != "user-gluonts-code"))
    clock = {"wait": 0.0}
    epochs_out: list = []
    make = est.create_training_data_loader

    def timed(*a, **k):
        return Timed(make(*a, **k), clock)

    est.create_training_data_loader = timed

    class EpochClock(pl.Callback):
        def on_train_epoch_start(self, trainer, module):
            self.t0, self.w0 = time.perf_counter(), clock["wait"]

        def on_train_epoch_end(self, trainer, module):
            dt = time.perf_counter() - self.t0
            epochs_out.append((dt, (clock["wait"] - self.w0) / dt,
                               float(trainer.callback_metrics["train_loss"])))

    est.trainer_kwargs["callbacks"] = [EpochClock()]
    est.train_model(FileDataset(path, freq="h"))
    return {"epochs": epochs_out}


# GluonTS's loader; shmpipe's on the Rust fast path (DeepAR's chain); shmpipe's with a user's
# step in front of DeepAR's chain (Python workers, native AddTimeFeatures); the same with
# every step GluonTS's own code (fast_path=False: the seed's proposal as it stands).
MODES = ("gluonts", "shmpipe-rust", "user-native-feats", "user-gluonts-code")


def training(path: str, epochs: int, workers: int, rounds: int, modes: tuple) -> None:
    import tempfile

    print(f"\n2. DeepAR training, {epochs} epochs of {BATCHES} batches of {BATCH}, "
          f"context {CONTEXT}, prediction {PRED}, 2x40 LSTM, torch on 1 thread; "
          f"{rounds} round(s), every other round in reverse order (load drifts)")
    later: dict = {m: [] for m in modes}
    waits: dict = {m: [] for m in modes}
    for r in range(rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            with tempfile.TemporaryDirectory() as root:
                t = stamp()
                ep = train_once(path, epochs, mode, workers, root)["epochs"]
            print(f"  {mode:18s} s/epoch " + " ".join(f"{e[0]:5.2f}" for e in ep)
                  + "   wait " + " ".join(f"{e[1]:4.0%}" for e in ep)
                  + f"   final train_loss {ep[-1][2]:.4f}   [{t}]")
            rest = ep[1:] or ep
            later[mode] += [e[0] for e in rest]
            waits[mode] += [e[1] for e in rest]
    ref = modes[0]
    g, gw = float(np.mean(later[ref])), float(np.mean(waits[ref]))
    for mode in modes[1:]:
        m, w = float(np.mean(later[mode])), float(np.mean(waits[mode]))
        print(f"  {mode}: epochs 2.. {m:.2f} s vs {g:.2f} s = {m / g:.2f}x the {ref} runs "
              f"(goal <= 0.6x of gluonts); waiting {w:.0%} (goal < 10%; {ref} {gw:.0%})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/tmp/shmpipe_gluonts_long.jsonl")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-loaders", action="store_true")
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modes", default=",".join(MODES),
                    help="training runs, the first is the reference: " + ",".join(MODES))
    a = ap.parse_args()
    unknown = set(a.modes.split(",")) - set(MODES)
    if unknown:
        ap.error(f"--modes: unknown {sorted(unknown)}; choose from {','.join(MODES)}")
    if not os.path.exists(a.data):
        print(f"generating {a.data} (2,000 hourly series of 500-5,000 points, 1% nulls)")
        generate(a.data)
    print(f"data: {a.data}, {os.path.getsize(a.data) / 1e6:.0f} MB; {os.cpu_count()} CPUs; "
          f"start {stamp()}")
    if not a.skip_loaders:
        loaders(a.data, a.workers)
    if not a.skip_training:
        training(a.data, a.epochs, a.workers, a.rounds, tuple(a.modes.split(",")))
    print(f"end {stamp()}")


if __name__ == "__main__":
    main()
