"""``InProcessWorkers``: the ``Workers`` protocol answered in the calling process, for tests of the chunk
stream, the packing and the accounting that need neither Ray nor worker processes.

A chunk runs its stage when the stream submits it, in the caller's process, through the same
``augment_block`` the real workers call: the same rows give the same images and skip records. What the
stream asked of it is recorded (``submitted``, ``cancelled``, ``sized``), so a test can check the window
and the cancellations as well as the batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from raypipe.stages.augment import augment_block

__all__ = ["InProcessWorkers"]


@dataclasses.dataclass
class _Handle:
    """A submitted chunk: its block, or the exception its stage raised (raised again by ``get``)."""

    number: int
    block: dict[str, np.ndarray] | None = None
    error: BaseException | None = None


class InProcessWorkers:
    """Chunks made in this process as they are submitted; no start-up, nothing shared."""

    queues_while_starting = True

    def __init__(self) -> None:
        self.submitted = 0  # chunks run so far
        self.cancelled: list[int] = []  # the numbers of the chunks the stream dropped
        self.sized: list[float] = []  # every cpus value the stream sized its tasks to
        self.set_ups = 0

    def starting(self) -> bool:
        return False

    def release_start(self) -> None:
        pass

    def size_tasks(self, cpus: float) -> None:
        self.sized.append(cpus)

    def set_up(self, spec: Any, count: int) -> list:
        self.set_ups += 1
        return []

    def submit(self, rows: dict[str, np.ndarray], spec: Any) -> _Handle:
        handle = _Handle(self.submitted)
        self.submitted += 1
        try:
            handle.block = augment_block(rows, spec)
        except Exception as e:  # noqa: BLE001 - handed to the consumer by get(), as a worker's would be
            handle.error = e
        return handle

    def all_done(self, handles: Sequence[Any]) -> bool:
        return True

    def wait(self, handle: Any, timeout: float) -> bool:
        return True

    def get(self, handle: _Handle) -> dict[str, np.ndarray]:
        if handle.error is not None:
            raise handle.error
        return handle.block

    def cancel(self, handle: _Handle) -> None:
        self.cancelled.append(handle.number)

    def shared_ref(self, handle: Any) -> None:
        return None
