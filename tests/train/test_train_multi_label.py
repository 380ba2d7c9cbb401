"""The training job on data with several labels per image: a multi-label loss, mixup of multi-hot
targets, and eval hits counted against each image's set."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from image_factory import captioned_jpeg
from train_helpers import tiny_job

from raypipe.train.run import run_training


@pytest.mark.timeout(300)
def test_the_job_trains_a_multi_label_parquet_with_mixup(ray_local, tmp_path):
    n = 48
    sets = [[i % 4, (i // 4) % 4] if i % 3 else [i % 4] for i in range(n)]
    table = pa.table({"image": [captioned_jpeg(i) for i in range(n)], "label": pa.array(sets, pa.list_(pa.int64()))})
    pq.write_table(table, tmp_path / "multi.parquet", row_group_size=8)
    job = tiny_job(tmp_path / "multi.parquet", tmp_path / "runs", "multi", "--mixup", "0.2", "--smoothing", "0.1")
    summary = run_training(job)
    assert summary["epochs"] == 1
    (m,) = json.loads((tmp_path / "runs" / "multi" / "metrics.json").read_text())
    assert m["emitted"] == m["expected"] and not m["skipped"]
    assert np.isfinite(m["train_loss"]) and 0 < m["train_loss"] < 1.5  # a mean of per-class BCEs, not a CE
    assert m["eval_samples"] > 0 and 0.0 <= m["eval_top1"] <= 100.0
