"""Stop the prefetch thread Ray Data 2.60 leaves behind after every ``iter_batches(prefetch_batches=0)``.

Ray Data's batch iterator always makes a ``WaitBlockPrefetcher``, which starts a thread parked on a
condition, and stops it only on its prefetching path: with ``prefetch_batches=0`` (what ``EpochRun``
uses, so that each block is handed out as soon as it is done) the thread outlives the iteration, and
it refers to its own prefetcher, so nothing ever collects it. One idle thread per epoch and per
pipeline (train and eval) piles up over a long run.

``stopping_prefetchers()`` stops the prefetchers made on the calling thread while it is open. Only
those: another thread's iteration, which may still be using its own, is left alone. Ray's class is
replaced, once, by a subclass that records where it was made; with other Ray internals (the pinned Ray
moved) nothing is patched and nothing is stopped.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["stopping_prefetchers"]

_made_here = threading.local()
_installed: bool | None = None


def _install() -> bool:
    global _installed
    if _installed is None:
        try:
            from ray.data._internal.block_batching import iter_batches as module

            base = module.WaitBlockPrefetcher
        except (ImportError, AttributeError):  # pragma: no cover - another Ray version
            _installed = False
            return False

        class RecordedWaitBlockPrefetcher(base):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                made = getattr(_made_here, "prefetchers", None)
                if made is not None:
                    made.append(self)

        module.WaitBlockPrefetcher = RecordedWaitBlockPrefetcher
        _installed = True
    return _installed


@contextlib.contextmanager
def stopping_prefetchers() -> Iterator[None]:
    """Within the block, Ray Data prefetchers made on this thread are recorded; on exit they are stopped
    (their threads end). Open it around the whole life of one iterator: creation, reading, closing."""
    if not _install():
        yield
        return
    _made_here.prefetchers = made = []
    try:
        yield
    finally:
        _made_here.prefetchers = None
        for prefetcher in made:
            prefetcher.stop()
