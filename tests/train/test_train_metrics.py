"""The job's per-epoch metrics: counts summed over ranks, an epoch without eval samples printed as n/a
and written as null (metrics.json stays standard JSON)."""

from __future__ import annotations

import json
import math

from raypipe.train.metrics import RankEpoch, RunDir, combine, format_line


def _refuse(token):
    raise ValueError(f"not standard JSON: {token}")


def test_an_epoch_without_eval_samples(tmp_path):
    ranks = [
        RankEpoch(rank=0, steps=2, samples=6, loss_sum=3.0, train_s=2.0, wait_s=0.5, emitted=6, expected=6),
        RankEpoch(
            rank=1,
            steps=1,
            samples=2,
            loss_sum=1.0,
            train_s=1.0,
            wait_s=0.5,
            emitted=2,
            expected=3,
            skipped={"truncated": 1},
        ),
    ]
    m = combine(0, ranks, lr=0.1, resumed_from_epoch=None)
    assert m["train_loss"] == 0.5 and m["train_samples"] == 8 and m["eval_samples"] == 0
    assert math.isnan(m["eval_top1"])
    line = format_line(m, epochs=3)
    assert "loss 0.5000" in line and "top1 n/a" in line and "top5 n/a" in line and "skipped 1" in line
    run = RunDir(str(tmp_path), "r")
    run.write_json("metrics.json", [m])
    text = (tmp_path / "r" / "metrics.json").read_text()
    back = json.loads(text, parse_constant=_refuse)  # no NaN / Infinity tokens
    assert back[0]["eval_top1"] is None and back[0]["train_loss"] == 0.5
    assert run.read_json("metrics.json") == back


def test_an_epoch_resumed_inside_says_after_which_step():
    ranks = [RankEpoch(rank=0, steps=4, samples=32, loss_sum=8.0, train_s=1.0, emitted=32, expected=32)]
    m = combine(2, ranks, lr=0.1, resumed_from_epoch=2, resumed_from_step=10, repeated_batches=3)
    assert (m["resumed_from_epoch"], m["resumed_from_step"], m["repeated_batches"]) == (2, 10, 3)
    assert format_line(m, epochs=3).endswith("  resumed after step 10, 3 batch(es) trained again")
    later = combine(3, ranks, lr=0.1, resumed_from_epoch=2, resumed_from_step=10, repeated_batches=0)
    assert "resumed" not in format_line(later, epochs=4)  # the note is on the epoch it resumed inside
    fresh = combine(0, ranks, lr=0.1, resumed_from_epoch=None)
    assert fresh["resumed_from_step"] is None and fresh["repeated_batches"] is None
