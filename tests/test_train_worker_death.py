"""A training worker killed (SIGKILL) mid-run: with --max-failures the job resumes from its last
checkpoint and finishes, and metrics.json says where the restarted attempt began."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from train_helpers import REPO, tiny_args, tiny_dataset

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _train_workers(root_pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in kids:
        try:
            if " ".join(p.cmdline()).startswith("ray::RayTrainWorker"):
                out.append(p)
        except psutil.Error:
            pass
    return out


def _registered_checkpoint(run_dir) -> bool:
    """Ray Train's controller has registered a checkpoint (a restart resumes from it).

    A ``checkpoint_*`` directory on disk is not enough: it exists before the worker's report reaches
    the controller, and a worker killed in between restarts from scratch (seen in CI with sub-second
    epochs). The controller writes its checkpoint manager snapshot after registering one.
    """
    snapshot = run_dir / "checkpoint_manager_snapshot.json"
    try:
        state = json.loads(snapshot.read_text())
    except (OSError, ValueError):  # not written yet, or caught mid-write
        return False
    return bool(state.get("latest_checkpoint_result"))


def test_killed_training_worker_resumes_from_checkpoint(tmp_path):
    data = tiny_dataset(tmp_path / "data", per_class=30, corrupt=1)
    storage = tmp_path / "runs"
    args = tiny_args(data, storage, "crash", "--max-failures", "1", "-v")  # -v: Ray's own lines too
    args[args.index("--epochs") + 1] = "5"
    env = dict(os.environ, RAYPIPE_NO_PROGRESS="1", RAY_ADDRESS="")
    proc = subprocess.Popen([sys.executable, str(REPO / "jobs" / "train.py"), *args], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    metrics_path = storage / "crash" / "metrics.json"
    killed = None
    try:
        deadline = time.monotonic() + 240
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            workers = _train_workers(proc.pid)
            if _registered_checkpoint(storage / "crash") and workers:
                killed = workers[0].pid
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed is not None, "the job ended before a training worker could be killed"
    assert proc.returncode == 0, out[-4000:]
    metrics = json.loads(metrics_path.read_text())
    assert sorted({m["epoch"] for m in metrics}) == [0, 1, 2, 3, 4]
    # Killed with a checkpoint committed: the restarted attempt must start from it, not from scratch.
    restarted = [m for m in metrics if m["resumed_from_epoch"] is not None]
    brief = [(m["epoch"], m["resumed_from_epoch"], m["repeated"]) for m in metrics]
    assert restarted, f"no epoch was run by a restarted attempt (killed {killed}): {brief}"
    assert restarted[0]["resumed_from_epoch"] >= 1  # resumed from a checkpoint, not from scratch
    # -v shows Ray Train's own lines, which the job leaves out by default (test_train_submit.py)
    assert "Reporting training result" in out and "Checkpoint successfully created" in out, out[-4000:]
