"""The training job's figures as TensorBoard scalars, where ``tensorboard`` is installed (the
``[tensorboard]`` extra): rank 0 writes them in ``<run folder>/tensorboard``, beside ``metrics.json``,
which stays the record. Without ``tensorboard`` nothing is written and nothing else changes; a folder
that cannot be written (a store ``tensorboard`` cannot reach) is one line, and the job goes on.

Per epoch (step: the epoch, from 1): ``train/loss``, ``eval/top1``, ``eval/top5``, ``eval/loss``,
``data/images_per_s``, ``data/stall_share``, ``data/emitted``, ``data/skipped``, ``lr``. Every
``INTERVAL_S`` of training (step: the rank's optimizer steps over the run): ``interval/loss``,
``interval/images_per_s``, ``interval/stall_share`` of rank 0 over that interval.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import posixpath
import time

__all__ = ["INTERVAL_S", "Scalars", "available", "folder"]

log = logging.getLogger(__name__)

INTERVAL_S = 30.0  # a point every 30 s: a day's run is ~3000 points, TensorBoard's default sampling keeps them
_EPOCH = {
    "train/loss": "train_loss",
    "eval/top1": "eval_top1",
    "eval/top5": "eval_top5",
    "eval/loss": "eval_loss",
    "data/images_per_s": "images_per_s",
    "data/stall_share": "data_stall_fraction",
    "data/emitted": "emitted",
    "lr": "lr",
}


def available() -> bool:
    """Whether ``tensorboard`` is installed here (``torch.utils.tensorboard`` needs it)."""
    return importlib.util.find_spec("tensorboard") is not None


def folder(storage_path: str, name: str) -> str:
    """Where a run's scalars go: ``<storage_path>/<name>/tensorboard``."""
    return posixpath.join(storage_path, name, "tensorboard")


class Scalars:
    """Rank 0's writer of the job's scalars (``open`` makes one, or None where none can be written)."""

    def __init__(self, writer, *, clock=time.perf_counter):
        self._writer = writer
        self._clock = clock
        self._since = clock()
        self._steps = self._samples = 0
        self._loss = 0.0
        self._wait = 0.0

    @classmethod
    def open(cls, path: str) -> Scalars | None:
        """A writer into ``path``, or None: ``tensorboard`` is not installed, or ``path`` cannot be written
        (said in one line)."""
        if not available():
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter

            return cls(SummaryWriter(log_dir=path))
        except Exception as e:  # TensorBoard is a view: a folder it cannot write must not fail the run
            log.warning("raypipe: no TensorBoard scalars in %s (%s: %s)", path, type(e).__name__, e)
            return None

    def step(self, global_step: int, *, samples: int, loss_sum: float, wait_s: float) -> None:
        """After an optimizer step: ``samples``, ``loss_sum`` and ``wait_s`` are the epoch's so far; an
        interval's figures are written once ``INTERVAL_S`` has passed."""
        now = self._clock()
        span = now - self._since
        if span < INTERVAL_S:
            return
        if samples < self._samples:  # a new epoch: its counts start again
            self._samples, self._loss, self._wait = 0, 0.0, 0.0
        n, wait = samples - self._samples, max(0.0, wait_s - self._wait)
        if n > 0:
            self._add("interval/loss", (loss_sum - self._loss) / n, global_step)
            self._add("interval/images_per_s", n / span, global_step)
            self._add("interval/stall_share", min(1.0, wait / span), global_step)
        self._since, self._samples, self._loss, self._wait = now, samples, loss_sum, wait_s

    def epoch(self, metrics: dict) -> None:
        """One epoch's combined figures (``raypipe.train.metrics.combine``)."""
        step = int(metrics["epoch"]) + 1
        for tag, key in _EPOCH.items():
            value = metrics.get(key)
            if isinstance(value, (int, float)) and not math.isnan(value):
                self._add(tag, value, step)
        self._add("data/skipped", sum(metrics.get("skipped", {}).values()), step)
        self._flush()

    def close(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: S110 - closing a view that already failed
                pass

    def _add(self, tag: str, value: float, step: int) -> None:
        if self._writer is None:
            return
        try:
            self._writer.add_scalar(tag, float(value), step)
        except Exception as e:
            log.warning("raypipe: TensorBoard scalars stopped (%s: %s)", type(e).__name__, e)
            self._writer = None

    def _flush(self) -> None:
        if self._writer is not None:
            try:
                self._writer.flush()
            except Exception as e:
                log.warning("raypipe: TensorBoard scalars stopped (%s: %s)", type(e).__name__, e)
                self._writer = None
