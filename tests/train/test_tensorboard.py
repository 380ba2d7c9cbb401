"""The training job's TensorBoard scalars (``raypipe.train.tensorboard``): per epoch and per interval, read
back from the event files; without ``tensorboard`` nothing is written and nothing breaks."""

from __future__ import annotations

import pytest

from raypipe.train import tensorboard
from raypipe.train.metrics import RankEpoch, combine


def _epoch_metrics(epoch: int) -> dict:
    rank = RankEpoch(
        rank=0,
        steps=4,
        samples=32,
        loss_sum=64.0,
        train_s=2.0,
        wait_s=0.5,
        emitted=32,
        expected=35,
        skipped={"truncated": 3},
        eval_correct1=6,
        eval_correct5=9,
        eval_count=10,
        eval_loss_sum=12.0,
        eval_s=0.5,
    )
    return combine(epoch, [rank], lr=1e-3, resumed_from_epoch=None)


def _read(path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_epochs_and_intervals_are_scalars_in_the_run_folder(tmp_path):
    pytest.importorskip("tensorboard")
    where = tensorboard.folder(str(tmp_path), "run1")
    now = [0.0]
    scalars = tensorboard.Scalars.open(where)
    assert scalars is not None
    scalars._clock = lambda: now[0]
    scalars._since = 0.0
    now[0] = 10.0
    scalars.step(3, samples=24, loss_sum=48.0, wait_s=1.0)  # before the interval: nothing
    now[0] = tensorboard.INTERVAL_S
    scalars.step(4, samples=30, loss_sum=60.0, wait_s=3.0)
    for epoch in (0, 1):
        scalars.epoch(_epoch_metrics(epoch))
    scalars.close()
    got = _read(where)
    assert got["train/loss"] == [(1, 2.0), (2, 2.0)]
    assert got["eval/top1"] == [(1, 60.0), (2, 60.0)]
    assert got["data/skipped"] == [(1, 3.0), (2, 3.0)] and got["data/emitted"][0] == (1, 32.0)
    assert got["data/stall_share"][0] == (1, 0.25) and got["data/images_per_s"][0] == (1, 16.0)
    assert got["interval/loss"] == [(4, 2.0)]
    assert got["interval/images_per_s"] == [(4, pytest.approx(1.0))]
    assert got["interval/stall_share"] == [(4, pytest.approx(0.1))]


def test_a_nan_figure_is_left_out(tmp_path):
    pytest.importorskip("tensorboard")
    scalars = tensorboard.Scalars.open(str(tmp_path / "tb"))
    m = _epoch_metrics(0) | {"eval_top1": float("nan")}
    scalars.epoch(m)
    scalars.close()
    assert "eval/top1" not in _read(tmp_path / "tb") and "train/loss" in _read(tmp_path / "tb")


def test_without_tensorboard_nothing_is_written_and_nothing_breaks(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard, "available", lambda: False)
    assert tensorboard.Scalars.open(str(tmp_path / "tb")) is None
    assert not (tmp_path / "tb").exists()


def test_a_folder_that_cannot_be_written_is_one_line(tmp_path, caplog):
    pytest.importorskip("tensorboard")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert tensorboard.Scalars.open(str(blocker / "tb")) is None
    assert len([r for r in caplog.records if "TensorBoard" in r.getMessage()]) == 1
