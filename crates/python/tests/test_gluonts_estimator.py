"""A gluonts.torch DeepAREstimator trained with shmpipe's loaders (``use_shmpipe``): tiny, CPU."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gluonts")
torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

from gluonts.time_feature import get_lags_for_frequency  # noqa: E402
from gluonts.torch.model.deepar import DeepAREstimator  # noqa: E402

import gluonts_helpers as h  # noqa: E402
from procs import children  # noqa: E402
from shmpipe.gluonts import TrainDataLoader, ValidationDataLoader, use_shmpipe  # noqa: E402




@pytest.mark.parametrize("fast", [True, False])
def test_deepar_trains_with_shmpipe_loaders(tmp_path, fast):
    torch.set_num_threads(1)
    recs = h.records(30, 200, nan=0.01, min_len=120, seed=7)
    train = h.file_dataset(tmp_path, recs)
    est = DeepAREstimator(freq="h", prediction_length=12, context_length=24, num_layers=1,
                          hidden_size=8, batch_size=8, num_batches_per_epoch=4,
                          trainer_kwargs={"max_epochs": 2, "logger": False,
                                          "enable_progress_bar": False,
                                          "enable_model_summary": False,
                                          "accelerator": "cpu",
                                          "default_root_dir": str(tmp_path)})
    assert use_shmpipe(est, num_workers=2, seed=1, fast_path=fast) is est
    made = []
    inner_train, inner_val = est.create_training_data_loader, est.create_validation_data_loader

    def spy(f):
        def g(*a, **k):
            made.append(f(*a, **k))
            return made[-1]
        return g

    est.create_training_data_loader = spy(inner_train)
    est.create_validation_data_loader = spy(inner_val)
    before = children()
    out = est.train_model(train, validation_data=train)
    assert [type(m) for m in made] == [TrainDataLoader, ValidationDataLoader]
    assert all(m.fast_path == fast for m in made), [m.why_not_fast for m in made]
    # DeepAR's lags: the splitter's past is context_length + max(lags_seq), its lags_seq
    # being get_lags_for_frequency's minus one (24 + 720 for hourly data)
    if fast:
        past = 24 + max(get_lags_for_frequency("h")) - 1
        assert made[0]._fast.args["context_length"] == past == 744
    metrics = out.trainer.callback_metrics
    assert np.isfinite(float(metrics["train_loss"])) and np.isfinite(float(metrics["val_loss"]))
    assert out.trainer.fit_loop.epoch_loop.batch_progress.total.completed == 2 * 4
    # train_model closed the training loader's workers
    assert children() - before == set()
    forecasts = list(out.predictor.predict(h.list_dataset(recs[:3])))
    assert len(forecasts) == 3 and forecasts[0].mean.shape == (12,)
