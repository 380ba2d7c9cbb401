"""The training job sent with `ray job submit` to Ray's fake autoscaling cluster (raypipe.testing.autoscaler:
its own ports and temp dir, ended by the process tree it started): a head without ``preprocess`` that
runs the trainer, a CPU group of 1-CPU ``preprocess`` nodes at 0 when the job starts.

- Without a storage path every node reads (the default, relative ``runs``, which would land in the
  job's unpacked working dir on the head), the job stops with one line before any step, exit 2.
- With one (a temporary directory: every fake node is this machine), the CPU group grows from 0, every
  epoch is exact, the job ends 0, and the group goes back to 0.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import REPO, tiny_args, tiny_dataset

log = logging.getLogger(__name__)

RAY_BIN = Path(sys.executable).parent / "ray"
IDLE_S = 6.0  # the CPU nodes' idle timeout
SLACK_S = 30.0  # what the autoscaler may take beyond it


def _submit(cluster, args: list[str], sid: str) -> subprocess.Popen:
    env = {**os.environ, **cluster.driver_env()}
    env.pop("RAY_ADDRESS")  # the job API's address is given below
    cmd = [str(RAY_BIN), "job", "submit", "--address", cluster.dashboard_url, "--submission-id", sid]
    cmd += ["--working-dir", str(REPO), "--", "python", "jobs/train.py", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _without_storage_path(args: list[str]) -> list[str]:
    at = args.index("--storage-path")
    return args[:at] + args[at + 2 :]


@pytest.mark.cluster
@pytest.mark.slow
# the nodes' settings as cluster.yaml's (RAY_worker_niceness); node workers reach the trainer on loopback
@pytest.mark.isolated(
    env={"RAY_AUTH_MODE": "token", "RAYPIPE_NODE_WORKERS_HOST": "127.0.0.1", "RAY_worker_niceness": "0"}
)
@pytest.mark.timeout(480)
def test_a_submitted_job_trains_on_an_autoscaling_cluster_only_with_a_storage_path_every_node_reads(tmp_path):
    from raypipe.testing.autoscaler import PREPROCESS, FakeAutoscalingCluster

    data = tiny_dataset(tmp_path / "data", per_class=6, corrupt=1)
    storage = tmp_path / "runs"
    args = tiny_args(data, storage, "autoscaled", "--epochs", "2", "--preprocess-resource", PREPROCESS)
    with FakeAutoscalingCluster(
        head_cpus=2, worker_cpus=1, max_workers=2, idle_timeout_s=IDLE_S, dashboard=True
    ) as cluster:
        cluster.connect()
        assert cluster.alive_workers() == 0
        tag = f"{os.getpid()}-{int(time.time())}"

        # the default storage path: one line, exit 2, before any step
        proc = _submit(cluster, _without_storage_path(args), f"raypipe-unshared-{tag}")
        out, _ = proc.communicate(timeout=180)
        logs = out.split("Status message:")[0]  # the job's log as it ran (the status message repeats it)
        errors = [line for line in logs.splitlines() if line.startswith("train.py: error:")]
        assert proc.returncode != 0 and "exit code 2" in out, out[-4000:]
        assert len(errors) == 1 and errors[0].startswith("train.py: error: --storage-path 'runs' is relative"), out
        assert "Traceback" not in out and "epoch 1/2" not in out and "raypipe train: checkpoints" not in out, out

        # a path every node reads: the group grows from 0, the epochs are exact, the group goes back to 0
        proc = _submit(cluster, args, f"raypipe-shared-{tag}")
        while proc.poll() is None:
            cluster.alive_workers()  # counted into most_workers_seen and the timeline
            time.sleep(0.5)
        out = proc.stdout.read()
        assert proc.returncode == 0, out[-4000:]
        assert f"raypipe train: checkpoints and metrics.json go to {storage}/autoscaled" in out, out[-4000:]
        assert cluster.most_workers_seen >= 1, cluster.timeline
        back_s = cluster.wait_for_workers(0, timeout_s=IDLE_S + SLACK_S)
        log.info("CPU nodes over time: %s; back to 0 in %.1f s", cluster.timeline, back_s)
    assert not list(storage.glob(".raypipe-storage-check-*"))  # the driver's marker went with the run
    metrics = json.loads((storage / "autoscaled" / "metrics.json").read_text())
    assert [m["epoch"] for m in metrics] == [0, 1]
    for m in metrics:
        assert m["emitted"] + sum(m["skipped"].values()) == m["expected"] and m["train_samples"] == m["emitted"], m
