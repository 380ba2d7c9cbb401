"""Re-running a job with the same --name/--storage-path resumes from its last checkpoint."""

from __future__ import annotations

import json

import pytest
from train_helpers import tiny_dataset, tiny_job

from raypipe.train.run import run_training


@pytest.mark.timeout(180)
def test_second_run_resumes_at_the_next_epoch(ray_local, tmp_path):
    data = tiny_dataset(tmp_path / "data", per_class=6, corrupt=1)
    storage = tmp_path / "runs"
    first = run_training(tiny_job(data, storage, "resume", "--epochs", "1"))
    assert first["epochs"] == 1 and first["checkpoint"]

    second = run_training(tiny_job(data, storage, "resume", "--epochs", "2"))

    metrics = json.loads((storage / "resume" / "metrics.json").read_text())
    assert [m["epoch"] for m in metrics] == [0, 1]
    assert metrics[0]["resumed_from_epoch"] is None
    assert metrics[1]["resumed_from_epoch"] == 1  # the second run started at epoch 1, not 0
    assert not any(m["repeated"] for m in metrics)
    assert second["epochs"] == 2 and second["checkpoint"] != first["checkpoint"]
