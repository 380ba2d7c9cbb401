"""Thread hand-off shared by the pipeline's epoch pump and the DeviceLoader's producer."""

from __future__ import annotations

import queue
import threading
from typing import Any

__all__ = ["put_unless_stopped"]


def put_unless_stopped(q: queue.Queue, item: Any, stop: threading.Event, poll_s: float = 0.05) -> bool:
    """Blocking ``q.put(item)`` that gives up (returns False) once ``stop`` is set, so a producer
    blocked on a full queue notices that its consumer went away."""
    while not stop.is_set():
        try:
            q.put(item, timeout=poll_s)
            return True
        except queue.Full:
            continue
    return False
