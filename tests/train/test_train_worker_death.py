"""A training worker killed (SIGKILL) mid-run: with --max-failures the job resumes from its last
checkpoint and finishes, and metrics.json says where the restarted attempt began; with
--checkpoint-steps, killed inside an epoch, it resumes after the checkpoint's step and trains each
image of the epoch once, the batches of an uninterrupted run, or, rerun on fewer workers, the rest
of the epoch split over them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import psutil
import pytest
from train_helpers import REPO, tiny_args, tiny_dataset

pytestmark = [pytest.mark.ray, pytest.mark.slow]


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


@pytest.mark.timeout(420)
def test_killed_training_worker_resumes_from_checkpoint(tmp_path):
    data = tiny_dataset(tmp_path / "data", per_class=30, corrupt=1)
    storage = tmp_path / "runs"
    args = tiny_args(data, storage, "crash", "--max-failures", "1", "-v")  # -v: Ray's own lines too
    args[args.index("--epochs") + 1] = "5"
    env = dict(os.environ, RAYPIPE_NO_PROGRESS="1", RAY_ADDRESS="")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "jobs" / "train.py"), *args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
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


def _latest_checkpoint_metrics(run_dir) -> dict | None:
    """The metrics reported with the checkpoint Ray Train's controller registered last."""
    try:
        state = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    except (OSError, ValueError):
        return None
    latest = state.get("latest_checkpoint_result")
    return latest["metrics"] if latest else None


def _progress(run_dir, world: int) -> list[dict] | None:
    """Each rank's last trained step (``--record-ids``), or None while a rank has none."""
    out = []
    for r in range(world):
        try:
            out.append(json.loads((run_dir / "progress" / f"rank{r:03d}.json").read_text()))
        except (OSError, ValueError):
            return None
    return out


def _inside_checkpointed_epoch(latest: dict | None, progress: list[dict] | None, steps: dict) -> bool:
    """A mid-epoch checkpoint is registered, and every rank trained past its step with at least three
    steps of the epoch left (``steps``: each rank's steps per epoch): a restart resumes inside it."""
    if not latest or "step" not in latest or not progress:
        return False
    epoch, step = latest["epoch"], latest["step"]
    return all(p["epoch"] == epoch and step < p["step"] <= steps[epoch][r] - 3 for r, p in enumerate(progress))


def _kill_inside_an_epoch(proc: subprocess.Popen, run, world: int, steps: dict) -> tuple | None:
    """SIGKILL a training worker of the job ``proc`` as soon as ``_inside_checkpointed_epoch``; return
    the checkpoint's (epoch, step) and the ranks' progress then, or None if the job ended first."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        latest, progress = _latest_checkpoint_metrics(run), _progress(run, world)
        if _inside_checkpointed_epoch(latest, progress, steps):
            workers = _train_workers(proc.pid)
            if workers:
                os.kill(workers[0].pid, signal.SIGKILL)
                return latest["epoch"], latest["step"], progress
        time.sleep(0.05)
    return None


def _ids(run_dir, epoch: int, world: int) -> list[list[int]]:
    return [json.loads((run_dir / "ids" / f"epoch{epoch:04d}_rank{r:03d}.json").read_text()) for r in range(world)]


@pytest.mark.timeout(600)
def test_a_worker_killed_inside_an_epoch_resumes_after_the_checkpoint_step(tmp_path):
    data = tiny_dataset(tmp_path / "data", classes=4, per_class=40, corrupt=1)
    storage = tmp_path / "runs"
    world, batch, every, epochs = 2, 4, 5, 3
    # 2 ranks of 0.25 CPU and no feeder processes leave 1.5 of the 2 CPUs to augmentation; 134 training
    # rows, 67 per rank in batches of 4: 17 steps an epoch, checkpoints after steps 5, 10 and 15 (a rank
    # may skip 3 of its 67 rows, so each is sure to reach step 16).
    extra = [
        "--epochs",
        str(epochs),
        "-b",
        str(batch),
        "--num-workers",
        str(world),
        "--cpus-per-worker",
        "0.25",
        "--feeder",
        "thread",
        "--checkpoint-steps",
        str(every),
        "--max-skip-ratio",
        "0.05",
        "--record-ids",
    ]
    env = dict(os.environ, RAYPIPE_NO_PROGRESS="1", RAY_ADDRESS="")
    job = [sys.executable, str(REPO / "jobs" / "train.py")]

    whole = subprocess.run(
        [*job, *tiny_args(data, storage, "whole", *extra)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    want = {m["epoch"]: m for m in json.loads((storage / "whole" / "metrics.json").read_text())}
    steps = {e: m["steps_per_worker"] for e, m in want.items()}
    assert all(min(s) >= 16 for s in steps.values()), steps

    run = storage / "crash"
    proc = subprocess.Popen(
        [*job, *tiny_args(data, storage, "crash", *extra, "--max-failures", "1")],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        seen = _kill_inside_an_epoch(proc, run, world, steps)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert seen is not None, "the job ended before a worker could be killed inside an epoch"
    assert proc.returncode == 0, out[-4000:]
    epoch, step, progress = seen
    got = {m["epoch"]: m for m in json.loads((run / "metrics.json").read_text())}
    assert sorted(got) == list(range(epochs))
    resumed = got[epoch]
    # Resumed inside the epoch it was killed in, after a checkpoint step (the one seen, or the next one
    # if it registered in the instant before the kill landed).
    assert resumed["resumed_from_epoch"] == epoch and resumed["resumed_from_step"] in (step, step + every), out[-4000:]
    k = resumed["resumed_from_step"]
    assert f"resumed after step {k}" in out and f"after step {k} from its checkpoint" in out, out[-4000:]
    # This attempt trained the rest of the epoch: each rank's steps after k, all of them full batches before.
    assert resumed["steps_per_worker"] == [s - k for s in steps[epoch]]
    assert resumed["train_samples"] == want[epoch]["train_samples"] - world * k * batch
    # The batches the dead attempt trained after the checkpoint: at least those its progress showed,
    # at most the rest of the epoch.
    shown = sum(max(p["step"], k) - k for p in progress)
    assert shown <= resumed["repeated_batches"] <= sum(s - k for s in steps[epoch]), (shown, resumed)
    assert all(got[e]["resumed_from_epoch"] is None for e in range(epoch))
    assert all(got[e]["resumed_from_step"] == k for e in range(epoch, epochs))

    train_ids = None
    for e in range(epochs):
        ids = _ids(run, e, world)
        counts = Counter(i for rank_ids in ids for i in rank_ids)
        assert max(counts.values()) == 1, f"epoch {e}: an image trained twice"
        train_ids = train_ids or set(counts)
        assert set(counts) == train_ids and len(counts) == want[e]["emitted"], e  # every good image, once
        # The same world size: each rank's ids, in order, are the uninterrupted run's.
        assert ids == _ids(storage / "whole", e, world), e


@pytest.mark.timeout(600)
def test_a_job_stopped_inside_an_epoch_resumes_there_on_fewer_workers(tmp_path):
    from train_helpers import tiny_job

    from raypipe.train.data import job_rows

    data = tiny_dataset(tmp_path / "data", classes=4, per_class=40, corrupt=1)
    storage = tmp_path / "runs"
    run = storage / "elastic"
    batch, every, epochs = 4, 5, 3
    # as above: 17 steps a rank and epoch on 2 workers, each sure to reach step 16
    extra = [
        "--epochs",
        str(epochs),
        "-b",
        str(batch),
        "--cpus-per-worker",
        "0.25",
        "--feeder",
        "thread",
        "--checkpoint-steps",
        str(every),
        "--max-skip-ratio",
        "0.05",
        "--record-ids",
    ]
    rows = job_rows(tiny_job(data, storage, "elastic", *extra))[0].table.to_pydict()
    good = {i for i, p in zip(rows["sample_id"], rows["path"], strict=True) if "zz_corrupt" not in p}
    env = dict(os.environ, RAYPIPE_NO_PROGRESS="1", RAY_ADDRESS="")
    job = [sys.executable, str(REPO / "jobs" / "train.py")]

    # Two workers and no restarts: the kill ends the job inside an epoch.
    proc = subprocess.Popen(
        [*job, *tiny_args(data, storage, "elastic", *extra, "--num-workers", "2")],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        seen = _kill_inside_an_epoch(proc, run, 2, {e: [16, 16] for e in range(epochs)})
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert seen is not None, "the job ended before a worker could be killed inside an epoch"
    assert proc.returncode != 0, out[-3000:]
    epoch, step, _ = seen

    # The same run again on one worker: it goes on inside that epoch with what neither rank trained.
    again = subprocess.run(
        [*job, *tiny_args(data, storage, "elastic", *extra, "--num-workers", "1")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    got = {m["epoch"]: m for m in json.loads((run / "metrics.json").read_text())}
    assert sorted(got) == list(range(epochs))
    resumed = got[epoch]
    assert resumed["resumed_from_epoch"] == epoch and resumed["resumed_from_step"] in (step, step + every)
    k = resumed["resumed_from_step"]
    assert f"resumed after step {k}" in again.stdout, again.stdout[-3000:]
    assert resumed["train_samples"] == len(good) - 2 * k * batch  # the rest, on one rank, in full batches
    assert resumed["steps_per_worker"] == [-(-(len(good) - 2 * k * batch) // batch)]
    for e in range(epochs):
        files = sorted((run / "ids").glob(f"epoch{e:04d}_rank*.json"))
        # epochs before the resume: the two ranks' files; from it on, the one rank's (rank 1's removed)
        assert len(files) == (2 if e < epoch else 1), (e, files)
        counts = Counter(i for f in files for i in json.loads(f.read_text()))
        assert max(counts.values()) == 1 and set(counts) == good, e  # every good image once
