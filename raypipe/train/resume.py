"""Where a training attempt starts, and the rules of the checkpoints it writes inside an epoch: pure
functions over small JSON values, so the loop stays a loop and each rule is tested alone.

A checkpoint (``state.pt``) is written by rank 0 at the end of every epoch (``step`` None) and, with
``--checkpoint-steps N``, after every N-th optimizer step of an epoch at which every rank is sure to
arrive (``last_safe_step``). A mid-epoch checkpoint also holds every rank's train-loader position
(``raypipe.plan.position.Position``, ``DeviceLoader.state_dict``) and, with ``--record-ids``, the ids
each rank trained on so far in the epoch; the positions resume on any number of ranks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from raypipe.plan.position import Position

__all__ = [
    "ResumePoint",
    "resume_point",
    "allowed_skips",
    "last_safe_step",
    "checkpoint_due",
    "rows_left",
    "repeated_batches",
    "ids_after_resume",
    "stale_ids_files",
]


@dataclass(frozen=True)
class ResumePoint:
    """The epoch an attempt runs first and the steps of it trained before (0: from its start), and
    whether a checkpoint says so (``from_checkpoint``; else the run's start);
    ``loaders``: every rank's train-loader state, ``ids``: every rank's ids trained before the
    checkpoint (both only for a mid-epoch checkpoint; ``ids`` only with ``--record-ids``)."""

    epoch: int = 0
    step: int = 0
    loaders: list[dict] | None = None
    ids: list[list[int]] | None = None
    from_checkpoint: bool = False

    @property
    def mid_epoch(self) -> bool:
        return self.loaders is not None


def resume_point(state: dict | None) -> ResumePoint:
    """Where to start from a checkpoint's state (None: no checkpoint, the run's start). An epoch-end
    checkpoint resumes at the next epoch; a mid-epoch one in its own epoch after its step. The loader
    states and ids travel as JSON strings, which ``torch.load(weights_only=True)`` accepts."""
    if state is None:
        return ResumePoint()
    epoch, step = int(state["epoch"]), state.get("step")
    if step is None:
        return ResumePoint(epoch=epoch + 1, from_checkpoint=True)
    ids = state.get("ids")
    return ResumePoint(
        epoch=epoch,
        step=int(step),
        loaders=json.loads(state["loaders"]),
        ids=json.loads(ids) if ids is not None else None,
        from_checkpoint=True,
    )


def allowed_skips(rows: int, *, max_skip_ratio: float | None, max_skips: int | None) -> int | None:
    """The most skipped rows an epoch part of ``rows`` rows may have without failing (``EpochLedger``:
    more than ``max_skips``, or a share above ``max_skip_ratio``, fails it); None: no limit."""
    limits = []
    if max_skips is not None:
        limits.append(max_skips)
    if max_skip_ratio is not None:
        k = int(max_skip_ratio * rows)
        while k > 0 and k / rows > max_skip_ratio:  # the ledger's own test, against float rounding
            k -= 1
        limits.append(k)
    return min(limits) if limits else None


def last_safe_step(
    start_step: int, rows: list[int], *, batch_size: int, max_skip_ratio: float | None, max_skips: int | None
) -> int | None:
    """The last step of an epoch part at which every rank is sure to arrive, or None when skips are
    unlimited (then no step is sure beyond ``start_step``).

    ``rows``: each rank's rows in this part of the epoch (the whole epoch, or what a resumed one has
    left), which it starts at step ``start_step``. Ranks take different numbers of steps (their
    slices differ by a row, and by their skipped images), and a checkpoint is a barrier every rank
    must reach: a rank with ``r`` rows, of which at most ``s`` may be skipped before the epoch fails,
    packs at least ``r - s`` good ones into at least ``floor((r - s) / batch_size)`` batches (full
    ones, and a partial last one is one more), so every rank reaches that many steps past the start.
    """
    least = None
    for r in rows:
        skips = allowed_skips(r, max_skip_ratio=max_skip_ratio, max_skips=max_skips)
        if skips is None:
            return None
        steps = max(0, r - skips) // batch_size
        least = steps if least is None else min(least, steps)
    return start_step + (least or 0)


def checkpoint_due(step: int, *, every: int | None, last_safe: int | None) -> bool:
    """Whether a mid-epoch checkpoint follows step ``step`` (counted in the epoch, from 1)."""
    return every is not None and last_safe is not None and step % every == 0 and step <= last_safe


def rows_left(position: Position) -> int:
    """The rows of its epoch that a rank's position (a loader's ``state_dict()``, read by
    ``Position.from_dict``) has not consumed."""
    return position.rows_left


def repeated_batches(progress: list[dict], resume: ResumePoint) -> dict[int, int]:
    """Per epoch, the batches a dead attempt trained after the checkpoint it resumes from: the
    restarted attempt trains them again.

    ``progress``: the dead attempt's per-rank records ``{"epoch", "step", "ended": {epoch: steps}}``
    (the last step it trained, and the step counts of the epochs it finished). Its steps up to
    ``resume.step`` of ``resume.epoch`` are in the checkpoint; every later one is repeated."""
    out: dict[int, int] = {}
    for p in progress:
        done = {int(e): int(s) for e, s in (p.get("ended") or {}).items()}
        done[int(p["epoch"])] = max(done.get(int(p["epoch"]), 0), int(p["step"]))
        for epoch, steps in done.items():
            before = resume.step if epoch == resume.epoch else 0
            if epoch >= resume.epoch and steps > before:
                out[epoch] = out.get(epoch, 0) + steps - before
    return dict(sorted(out.items()))


def ids_after_resume(saved: list[list[int]] | None, *, rank: int, world_size: int) -> list[int]:
    """This rank's ids of the resumed epoch trained before the checkpoint: its own on the same number of
    ranks; on another, rank 0 takes all of them (its file then lists them, the others' their new ones)."""
    if not saved:
        return []
    if len(saved) == world_size:
        return list(saved[rank])
    return [i for ids in saved for i in ids] if rank == 0 else []


_IDS_FILE = re.compile(r"epoch(\d+)_rank(\d+)\.json")


def stale_ids_files(names: list[str], *, epoch: int) -> list[str]:
    """The ids files (``epochNNNN_rankRRR.json``) of ``epoch`` and later: an attempt that resumes there
    writes them again, and a rank that a smaller restarted group lacks would otherwise keep its old one."""
    return sorted(n for n in names if (m := _IDS_FILE.fullmatch(n)) and int(m.group(1)) >= epoch)
