"""Exactly once per epoch across ranks, on a simulated two-node cluster, with corrupt files."""

from __future__ import annotations

import contextlib
import json
from collections import Counter

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster
from train_helpers import tiny_dataset, tiny_job

from raypipe.train.data import job_rows
from raypipe.train.run import run_training


@contextlib.contextmanager
def two_nodes():
    ray.shutdown()  # the shared ray_local fixture may have left a local Ray running
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        cluster.add_node(num_cpus=2)
        ray.init(address=cluster.address, logging_level="WARNING")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.cluster
@pytest.mark.isolated
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["auto", "nodes"])
def test_every_sample_trained_once_per_epoch_across_ranks(tmp_path, monkeypatch, backend):
    data = tiny_dataset(tmp_path / "data", corrupt=3)
    # --val-split 0.15 leaves 37 training rows, whose shards give uneven step counts in both epochs
    job = tiny_job(
        data,
        tmp_path / "runs",
        "once",
        "--num-workers",
        "2",
        "--epochs",
        "2",
        "--record-ids",
        "--val-split",
        "0.15",
        "--backend",
        backend,
    )
    # backend="nodes": each rank's feeder starts local workers and a launcher on the other node, whose
    # workers connect to the loopback interface (both simulated nodes are this machine)
    monkeypatch.setenv("RAYPIPE_NODE_WORKERS_HOST", "127.0.0.1")
    train_rows, _, _ = job_rows(job)
    table = train_rows.table.to_pydict()
    train_ids = set(table["sample_id"])
    corrupt_ids = {s for s, p in zip(table["sample_id"], table["path"], strict=True) if "zz_corrupt" in p}
    assert corrupt_ids, "the held-out split took every corrupt file; change the dataset seed"

    with two_nodes():
        summary = run_training(job)

    run = tmp_path / "runs" / "once"
    metrics = json.loads((run / "metrics.json").read_text())
    assert [m["epoch"] for m in metrics] == [0, 1]
    for m in metrics:
        per_rank = [json.loads((run / "ids" / f"epoch{m['epoch']:04d}_rank{r:03d}.json").read_text()) for r in (0, 1)]
        assert all(per_rank), "each rank trained on something"
        counts = Counter(i for ids in per_rank for i in ids)
        assert max(counts.values()) == 1, "a sample was trained on twice in one epoch"
        assert set(counts) == train_ids - corrupt_ids  # everything decodable, nothing else
        assert m["emitted"] == len(counts) == m["train_samples"]
        assert m["emitted"] + sum(m["skipped"].values()) == len(train_rows) == m["expected"]
        assert {p["sample_id"] for p in m["skipped_paths"]} == corrupt_ids
        assert sum(m["steps_per_worker"]) == sum(-(-len(ids) // 8) for ids in per_rank)
        assert m["eval_samples"] > 0 and np.isfinite(m["train_loss"])
    # Uneven shards (37 rows, 3 corrupt, split over 2 ranks in batches of 8) -> uneven step counts:
    # DDP's Join kept the longer rank going instead of hanging or dropping its last batch.
    assert any(len(set(m["steps_per_worker"])) > 1 for m in metrics), [m["steps_per_worker"] for m in metrics]
    assert summary["epochs"] == 2
