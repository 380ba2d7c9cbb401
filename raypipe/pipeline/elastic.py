"""A rank's width that follows its consumer's demand: the chunk stream's observations, every ``TICK_S``,
turned into a width by the pure controller (``raypipe.pipeline.controller``) and given to the workers.

What the stream sees stands for what the trainer sees: the consumer blocked on the next chunk is the
trainer's wait one window later (the window of chunks in flight is all that lies between them), and a
chunk finished before it was asked for is supply ahead of demand. Measured here, the loop needs
nothing from the trainer, whichever loader stack or process (a feeder) consumes the stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from raypipe.config import MAX_ELASTIC_WORKERS, ExecutionConfig
from raypipe.pipeline.controller import ControllerPolicy, Observation, WidthBounds, WidthController

__all__ = ["ElasticWidth", "Resizable", "TICK_S", "bounds_for", "start_width"]

log = logging.getLogger(__name__)

TICK_S = 3.0  # an interval: long enough to hold a few chunks, short enough to follow a node's arrival


class Resizable(Protocol):
    """Workers whose width can be set (``raypipe.workers.node.NodeWorkers``, elastic)."""

    width: int | None

    def set_width(self, width: int) -> None: ...

    def ready_workers(self) -> int: ...


def bounds_for(execution: ExecutionConfig) -> WidthBounds:
    """An elastic rank's bounds in workers, from ``min_cpus`` / ``max_cpus`` (per rank)."""
    cpus = float(execution.cpus_per_task or 1.0)
    return WidthBounds.from_cpus(
        floor_cpus=execution.min_cpus if execution.min_cpus is not None else cpus,
        ceiling_cpus=execution.max_cpus if execution.max_cpus is not None else MAX_ELASTIC_WORKERS * cpus,
        cpus_per_task=cpus,
    )


class ElasticWidth:
    """Observations of one rank's stream, and the width its controller wants from them."""

    def __init__(
        self,
        workers: Resizable,
        bounds: WidthBounds,
        policy: ControllerPolicy | None = None,
        *,
        tick_s: float = TICK_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.workers = workers
        self.controller = WidthController(workers.width or bounds.floor, bounds, policy)
        self.tick_s = tick_s
        self._clock = clock
        self._since: float | None = None  # the interval's start: the first chunk handed out
        self._wait = 0.0
        self._images = 0
        self._busy = 0.0  # sum of samples of the workers' busy share
        self._samples = 0
        self.history: list[tuple[float, int, int, str]] = []  # (time, width wanted, workers running, why)

    def waited(self, seconds: float) -> None:
        """The consumer was blocked ``seconds`` on the next chunk."""
        if self._since is not None:
            self._wait += seconds

    def note(self, *, images: int, running: int, ready: int) -> bool:
        """A chunk of ``images`` rows was handed out (0: a wait's slice ended) with ``running`` chunks
        in flight and ``ready`` finished ahead; True when the width changed."""
        now = self._clock()
        if self._since is None:
            self._since = now  # from the first chunk on: the set-up before it is no demand
            return False
        self._images += images
        width = max(1, self.workers.width or 1)
        self._busy += min(running, width) / width
        self._samples += 1
        span = now - self._since
        if span < self.tick_s:
            return False
        obs = Observation(
            span_s=span,
            wait_s=min(self._wait, span),
            idle_share=1.0 - self._busy / self._samples,
            ready_chunks=ready,
            width=self.workers.ready_workers(),
            images=self._images,
        )
        self._since, self._wait, self._images, self._busy, self._samples = now, 0.0, 0, 0.0, 0
        wanted = self.controller.observe(obs)
        self.history.append((now, wanted, obs.width, self.controller.reason))
        if wanted == self.workers.width:
            return False
        log.info("raypipe: %s", self.controller.reason)
        self.workers.set_width(wanted)
        return True

    @property
    def wanted(self) -> int:
        return self.controller.wanted

    def __repr__(self) -> str:
        return f"ElasticWidth(wanted={self.wanted}, bounds={self.controller.bounds})"


def start_width(share: int, bounds: WidthBounds) -> int:
    """The width to start from: the rank's share of the nodes there are (never more, so that a start
    asks the autoscaler for nothing beyond the floor), within the bounds."""
    return bounds.clamp(max(0, share)) if share > 0 else bounds.floor
