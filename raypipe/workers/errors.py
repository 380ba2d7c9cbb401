"""The errors a chunk fails with in raypipe's own worker processes (``raypipe.workers.local``)."""

from __future__ import annotations

__all__ = ["WorkerTraceback", "LocalWorkerDiedError"]


class WorkerTraceback(Exception):
    """The traceback of an exception raised in a worker process (the cause of the one raised here)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n" + self.text


class LocalWorkerDiedError(RuntimeError):
    """A chunk's worker process died on every try."""
