"""Train gluonts.torch's DeepAREstimator with shmpipe's loaders (one line: ``use_shmpipe``).

    python crates/python/examples/gluonts_deepar.py

Needs gluonts[torch] (torch, lightning) and pandas. Writes 200 hourly series to a temporary
JSON-lines file, trains one short epoch on the Rust fast path (DeepAR's chain), then again
with a user's own step in front of DeepAR's transformation (the chain then runs in Python in
the two workers), and forecasts three series.
"""

import json
import os
import tempfile

import numpy as np
from gluonts.dataset.common import FileDataset
from gluonts.torch.model.deepar import DeepAREstimator
from gluonts.transform import MapTransformation

from shmpipe.gluonts import use_shmpipe


class Clip(MapTransformation):
    """A user's own step: negative values clipped to zero (the workers import it from here)."""

    def map_transform(self, data, is_train):
        data["target"] = np.maximum(data["target"], 0)
        return data


class ClippedDeepAR(DeepAREstimator):
    def create_transformation(self):
        return Clip() + super().create_transformation()


def main():
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.jsonl")
        with open(path, "w") as f:
            for i in range(200):
                n = int(rng.integers(300, 1000))
                y = 10 + 5 * np.sin(np.arange(n) * 2 * np.pi / 24) + rng.normal(0, 1, n)
                f.write(json.dumps({"start": "2024-01-01 00:00", "item_id": f"s{i}",
                                    "target": [round(float(v), 3) for v in y]}) + "\n")
        data = FileDataset(path, freq="h")
        kw = dict(freq="h", prediction_length=24, context_length=48, num_batches_per_epoch=20,
                  trainer_kwargs={"max_epochs": 1, "accelerator": "cpu", "logger": False,
                                  "enable_progress_bar": False, "enable_model_summary": False,
                                  "default_root_dir": tmp})
        for cls in (DeepAREstimator, ClippedDeepAR):
            estimator = use_shmpipe(cls(**kw), num_workers=2)
            out = estimator.train_model(data)
            loss = float(out.trainer.callback_metrics["train_loss"])
            print(f"{cls.__name__}: train_loss {loss:.3f}")
        forecasts = list(out.predictor.predict(list(data)[:3]))
        print("forecast means:", [round(float(f.mean.mean()), 2) for f in forecasts])


if __name__ == "__main__":
    main()
