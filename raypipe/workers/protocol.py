"""What a rank's chunk stream asks of whichever workers run its chunks.

Three backends answer it: ``RayTasks`` (Ray tasks on any node), ``LocalWorkers`` (worker processes of
this machine) and ``NodeWorkers`` (raypipe's worker processes on every eligible node, a ``LocalWorkers``
pool inside). A chunk's handle is whatever ``submit`` returns; the stream only passes it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["Workers"]


class Workers(Protocol):
    # Whether a chunk submitted while the workers start waits for them (local processes), rather than
    # being impossible to send until they are up (Ray tasks before Ray is).
    queues_while_starting: bool

    def starting(self) -> bool:
        """Whether the workers cannot take chunks yet (the consumer makes them itself meanwhile)."""

    def release_start(self) -> None:
        """The consumer's first batches are out: the workers may start now."""

    def size_tasks(self, cpus: float) -> None:
        """The rank's budget was taken again: each task from now on asks for ``cpus``."""

    def set_up(self, spec: Any, count: int) -> list:
        """Handles of tasks that build ``spec``'s stage where chunks will run (``count`` of them where
        the backend cannot aim them at its workers)."""

    def submit(self, rows: dict[str, np.ndarray], spec: Any) -> Any:
        """Run one chunk: its rows through ``spec``'s stage. Returns its handle."""

    def all_done(self, handles: Sequence[Any]) -> bool: ...

    def wait(self, handle: Any, timeout: float) -> bool:
        """Whether the chunk finished within ``timeout`` seconds."""

    def get(self, handle: Any) -> dict[str, np.ndarray]:
        """The finished chunk's block (its stage's exception, raised)."""

    def cancel(self, handle: Any) -> None:
        """The chunk is no longer wanted: drop it, or let it finish and drop its result."""

    def shared_ref(self, handle: Any) -> Any:
        """What another process on this node may read the chunk's block from (a Ray object reference),
        or None."""
