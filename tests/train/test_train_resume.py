"""Re-running a job with the same --name/--storage-path resumes from its last checkpoint; the rules of
where an attempt resumes (``raypipe.train.resume``): the steps a mid-epoch checkpoint may be at, the
batches a dead attempt trained again, the ids files of a resumed epoch."""

from __future__ import annotations

import json

import numpy as np
import pytest
from train_helpers import tiny_dataset, tiny_job

from raypipe.plan.position import PlanIdentity, Position
from raypipe.train import tensorboard
from raypipe.train.resume import (
    ResumePoint,
    allowed_skips,
    checkpoint_due,
    ids_after_resume,
    last_safe_step,
    repeated_batches,
    resume_point,
    rows_left,
    stale_ids_files,
)
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
    if tensorboard.available():  # both attempts' epochs as scalars beside metrics.json
        assert any((storage / "resume" / "tensorboard").glob("events.out.tfevents.*"))


def test_mid_epoch_checkpoints_only_at_steps_every_rank_reaches():
    # 64 and 63 rows in batches of 8; max_skip_ratio 0.05 lets each rank skip 3 rows before its epoch
    # fails: each then packs at least 61 or 60 good rows, 7 full batches.
    rule = dict(batch_size=8, max_skip_ratio=0.05, max_skips=None)
    assert last_safe_step(0, [64, 63], **rule) == 7
    assert last_safe_step(5, [64, 63], **rule) == 12  # a resumed epoch: its rows left, after its step 5
    assert last_safe_step(0, [64, 63], batch_size=8, max_skip_ratio=None, max_skips=0) == 7  # 63 // 8
    assert last_safe_step(0, [64, 64], batch_size=8, max_skip_ratio=0.05, max_skips=1) == 7  # the tighter one
    assert last_safe_step(0, [64, 7], **rule) == 0  # a rank with less than a batch: none inside the epoch
    assert last_safe_step(0, [64, 63], batch_size=8, max_skip_ratio=None, max_skips=None) is None  # no bound
    due = [s for s in range(1, 30) if checkpoint_due(s, every=5, last_safe=17)]
    assert due == [5, 10, 15]
    assert not any(checkpoint_due(s, every=5, last_safe=None) for s in range(1, 30))
    assert not any(checkpoint_due(s, every=None, last_safe=17) for s in range(1, 30))


def test_allowed_skips_are_what_the_epoch_ledger_lets_pass():
    from raypipe.pipeline.accounting import EpochLedger, SkipLimitError

    def fails(rows: int, skips: int, ratio: float) -> bool:
        ledger = EpochLedger(epoch=0, expected=rows, max_skip_ratio=ratio)
        block = {
            "ok": np.zeros(skips, bool),
            "sample_id": np.arange(skips),
            "path": np.array(["p"] * skips),
            "reason": np.array(["r"] * skips),
            "detail": np.array(["d"] * skips),
        }
        try:
            ledger.record_block(block)
        except SkipLimitError:
            return True
        return False

    for ratio in (0.0, 0.01, 0.05, 0.07, 0.1, 0.3, 1 / 3):
        for rows in range(1, 120):
            k = allowed_skips(rows, max_skip_ratio=ratio, max_skips=None)
            assert not fails(rows, k, ratio) and (k == rows or fails(rows, k + 1, ratio)), (ratio, rows, k)
    assert allowed_skips(100, max_skip_ratio=0.5, max_skips=4) == 4
    assert allowed_skips(100, max_skip_ratio=None, max_skips=None) is None


def test_where_an_attempt_resumes_and_what_it_repeats():
    assert resume_point(None) == ResumePoint(epoch=0, step=0, from_checkpoint=False)
    end = resume_point({"epoch": 2, "step": None})
    assert (end.epoch, end.step, end.mid_epoch, end.from_checkpoint) == (3, 0, False, True)
    loaders = [{"format": "raypipe-device-loader", "epoch": 2, "batches": 5, "source": None}] * 2
    mid = resume_point({"epoch": 2, "step": 5, "loaders": json.dumps(loaders), "ids": json.dumps([[1, 2], [3]])})
    assert (mid.epoch, mid.step, mid.mid_epoch, mid.loaders, mid.ids) == (2, 5, True, loaders, [[1, 2], [3]])
    # a dead attempt's ranks: one at step 8 of epoch 2, one that went on into epoch 3 (its epoch-2
    # checkpoint never registered), one that had not passed the checkpoint's step
    progress = [
        {"epoch": 2, "step": 8, "ended": {}},
        {"epoch": 3, "step": 4, "ended": {"2": 17}},
        {"epoch": 2, "step": 5, "ended": {"1": 17}},
    ]
    assert repeated_batches(progress, mid) == {2: (8 - 5) + (17 - 5), 3: 4}
    assert repeated_batches(progress, ResumePoint(epoch=3, from_checkpoint=True)) == {3: 4}
    assert repeated_batches([], mid) == {}
    plan = PlanIdentity("digest", 40, "", 0, True, 2048, 8, False)
    at = Position(epoch=2, batches=5, rank=0, world_size=1, remaining=((10, 20), (30, 31)), plan=plan)
    assert rows_left(at) == 11


def test_ids_of_a_resumed_epoch_on_the_same_or_another_number_of_ranks():
    saved = [[4, 1], [7], [9, 2]]
    assert [ids_after_resume(saved, rank=r, world_size=3) for r in range(3)] == saved
    assert [ids_after_resume(saved, rank=r, world_size=2) for r in range(2)] == [[4, 1, 7, 9, 2], []]
    assert ids_after_resume(None, rank=0, world_size=2) == []
    names = ["epoch0001_rank000.json", "epoch0002_rank003.json", "epoch0003_rank000.json", "notes.txt"]
    assert stale_ids_files(names, epoch=2) == ["epoch0002_rank003.json", "epoch0003_rank000.json"]
