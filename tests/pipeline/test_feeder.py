"""FeederSource: the same batches and accounting as EpochSource, from a feeder process."""

import os
import shutil

import numpy as np
import psutil
import pytest
import ray

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.device import from_timm_args
from raypipe.pipeline import EpochSource, FeederDiedError, FeederSource, Pipeline, SkipLimitError

pytestmark = pytest.mark.timeout(240)

AUG = TrainAugment(input_size=32, color_jitter=None)
# Ray tasks whatever cluster an earlier test left (on raypipe's private one, "auto" is local workers:
# tests/pipeline/test_feeder_local.py)
RAY = ExecutionConfig(backend="ray")


def _epochs(source, n):
    out = []
    for _ in range(n):
        out.append([{k: np.array(v) for k, v in b.items()} for b in source])
    return out


def _by_id(batches):
    cat = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    order = np.argsort(cat["sample_id"])
    return {k: v[order] for k, v in cat.items()}


def _feeder_pid(source) -> int:
    return ray.get(source._actor.__ray_call__.remote(lambda self: os.getpid()))


def test_same_batches_and_reports_as_in_process(ray_local, sample_dir):
    ex = ExecutionConfig(backend="ray", chunk_rows=16)
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=16), execution=ex)
    here = EpochSource(pipe, end_epoch=2)
    feeder = FeederSource(pipe, end_epoch=2)
    try:
        want, got = _epochs(here, 2), _epochs(feeder, 2)
        assert _feeder_pid(feeder) != os.getpid()
    finally:
        here.close()
        feeder.close()
    assert [len(e) for e in got] == [3, 3] and all(set(b) == {"image", "label", "sample_id"} for b in got[0])
    # blocks arrive in completion order either way; each sample's content depends on (seed, epoch, id) only
    for we, ge in zip(want, got, strict=True):
        w, g = (_by_id(e) for e in (we, ge))
        assert np.array_equal(w["sample_id"], g["sample_id"]) and np.array_equal(w["label"], g["label"])
        assert np.array_equal(w["image"], g["image"])
    assert [r.ids_sha256 for r in feeder.reports] == [r.ids_sha256 for r in here.reports]
    assert feeder.last_report.emitted == 48 and feeder.last_report.epoch == 1
    assert feeder.zero_copy_batches == 6  # clean chunks of one batch each: every batch read from its chunk
    assert not np.array_equal(got[0][0]["sample_id"], got[1][0]["sample_id"])  # epochs reshuffle


def test_batches_packed_across_chunks_and_views_of_one_chunk_come_out_the_same(ray_local, sample_dir):
    """12-row chunks, batches of 8: a chunk's first 8 rows are handed over as its object's rows, the
    rest packed across chunks into copies; both are the pixels EpochSource yields, in its order."""
    pipe = Pipeline(
        str(sample_dir),
        AUG,
        config=PipelineConfig(batch_size=8),
        execution=ExecutionConfig(backend="ray", chunk_rows=12),
    )
    here, feeder = EpochSource(pipe, end_epoch=1), FeederSource(pipe, end_epoch=1)
    try:
        want, got = _epochs(here, 1)[0], _epochs(feeder, 1)[0]
    finally:
        here.close()
        feeder.close()
    assert len(got) == len(want) == 6
    assert 0 < feeder.zero_copy_batches < len(got)
    for w, g in zip(want, got, strict=True):
        assert all(np.array_equal(w[k], g[k]) for k in ("image", "label", "sample_id"))


def test_early_stop_then_next_epoch_and_close_ends_the_process(ray_local, sample_dir):
    pipe = Pipeline(
        str(sample_dir),
        AUG,
        config=PipelineConfig(batch_size=8),
        execution=ExecutionConfig(backend="ray", chunk_rows=16),
    )
    feeder = FeederSource(pipe, prefetch=3)
    it = iter(feeder)
    first = next(it)
    it.close()  # the consumer stops mid-epoch 0
    epoch1 = list(feeder)  # epoch 1 is whole and unaffected
    assert len(first["sample_id"]) == 8
    assert sorted(np.concatenate([b["sample_id"] for b in epoch1]).tolist()) == list(range(48))
    assert feeder.last_report.epoch == 1 and feeder.last_report.emitted == 48
    pid = _feeder_pid(feeder)
    feeder.close()
    feeder.close()  # idempotent
    psutil.wait_procs([psutil.Process(pid)], timeout=30)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(RuntimeError, match="closed"):
        iter(feeder).__next__()


def test_pipeline_errors_reach_the_trainer_with_their_type(ray_local, sample_dir, tmp_path):
    root = tmp_path / "bad"
    shutil.copytree(sample_dir, root)
    cls = sorted(os.listdir(root))[0]
    (root / cls / "empty.jpg").write_bytes(b"")
    pipe = Pipeline(str(root), AUG, config=PipelineConfig(batch_size=16, max_skips=0), execution=RAY)
    feeder = FeederSource(pipe)
    try:
        with pytest.raises(SkipLimitError, match="empty.jpg"):
            list(feeder)
    finally:
        feeder.close()


def test_a_killed_feeder_is_a_clear_error(ray_local, sample_dir):
    pipe = Pipeline(
        str(sample_dir),
        AUG,
        config=PipelineConfig(batch_size=4),
        execution=ExecutionConfig(backend="ray", chunk_rows=16),
    )
    assert_a_killed_feeder_is_a_clear_error(FeederSource(pipe, prefetch=1))


def assert_a_killed_feeder_is_a_clear_error(feeder, before=lambda feeder: None) -> None:
    """Kill ``feeder``'s process after its first batch (``before``: run on it first): the rest of the
    epoch is a ``FeederDiedError``. Closes ``feeder``."""
    try:
        before(feeder)
        it = iter(feeder)
        next(it)
        ray.kill(feeder._actor)
        with pytest.raises(FeederDiedError, match="feeder process"):
            for _ in it:
                pass
    finally:
        feeder.close()


def test_device_loader_over_a_feeder(ray_local, sample_dir):
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=16), execution=RAY)
    with from_timm_args(FeederSource(pipe), device="cpu", img_dtype="float32") as loader:
        for _ in range(2):
            ids = np.concatenate([b["sample_id"].numpy() for b in loader])
            assert sorted(ids.tolist()) == list(range(48))
        assert loader.source.last_report.epoch == 1
    assert loader.source._actor is None  # closing the loader closed the feeder


def test_on_two_cpus_a_feeder_leaves_room_for_two_augmentation_tasks_at_once(ray_local, sample_dir, tmp_path):
    """The feeder holds 0.25 CPU: its rank's 1.75 CPUs run two tasks of 0.875, not one of 1.0, and
    two such tasks do run at the same time beside the feeder on a 2-CPU node."""
    pipe = Pipeline(
        str(sample_dir),
        AUG,
        config=PipelineConfig(batch_size=8),
        execution=ExecutionConfig(backend="ray", chunk_rows=8),
    )
    feeder = FeederSource(pipe, end_epoch=1)
    try:
        it = iter(feeder)
        next(it)
        budget = ray.get(feeder._actor.__ray_call__.remote(lambda self: self.source._stream.budget))
        assert (budget.workers, budget.task_cpus) == (2, 0.875), budget

        @ray.remote(num_cpus=budget.task_cpus)
        def meet(me: str, other: str) -> bool:  # each waits for the other: true only if both run at once
            import time

            (tmp_path / me).touch()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if (tmp_path / other).exists():
                    return True
                time.sleep(0.05)
            return False

        list(it)  # the epoch's tasks are done: the CPUs are the feeder's and free
        assert ray.get([meet.remote("a", "b"), meet.remote("b", "a")], timeout=60) == [True, True]
    finally:
        feeder.close()
