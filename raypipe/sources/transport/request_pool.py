"""The threads that send a block reader's requests: a remote root keeps many in flight (a request's
latency, not its bytes, is what a read of an object store waits on; see ``raypipe.sources.transport.remote``),
while a local root reads one file after another (a read costs microseconds, threads would only add
hand-offs). Results come back per row, in the rows' order, or as a ``Future`` per row for a caller that
decodes the first rows while later ones are still in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["RequestPool", "fan_out"]


class RequestPool:
    """Up to ``threads`` requests at once where ``concurrent`` (a remote root), none on threads otherwise;
    the threads are made on first use and stopped by ``close`` (they start again on demand)."""

    def __init__(self, threads: int, *, concurrent: bool):
        self.concurrent = concurrent
        self._size = threads
        self._pool: ThreadPoolExecutor | None = None

    @property
    def started(self) -> bool:
        """Whether the threads are running (made by a request sent on them, stopped by ``close``)."""
        return self._pool is not None

    def close(self) -> None:
        """Stop the threads, once the requests sent have finished."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._size, thread_name_prefix="raypipe-read")
        return self._pool

    def map(self, fn: Callable, items: Sequence) -> list:
        """``[fn(x) for x in items]``, on the threads where the reads are concurrent."""
        if not self.concurrent or len(items) <= 1:
            return [fn(x) for x in items]
        return list(self.executor().map(fn, items))

    def map_rows(self, fn: Callable, items: list[tuple[object, list[int]]], out: list, wait: bool) -> None:
        """``out[i]`` for every row ``i`` of each ``(key, rows)`` item from ``fn(item)``, which returns one
        result per row. ``wait=False`` where the reads are concurrent: ``out[i]`` is a Future of it, the items' requests
        sent at once, those of the earliest rows first."""
        if wait or not self.concurrent or not items:
            for (_, idx), results in zip(items, self.map(fn, items), strict=True):
                for i, result in zip(idx, results, strict=True):
                    out[i] = result
            return
        pool = self.executor()
        for item in sorted(items, key=lambda item: min(item[1])):
            rows = [Future() for _ in item[1]]
            for i, row in zip(item[1], rows, strict=True):
                out[i] = row
            pool.submit(fn, item).add_done_callback(lambda done, rows=rows: fan_out(done, rows))


def fan_out(done: Future, rows: list[Future]) -> None:
    """Each row's Future from its request's (a list of results, one per row), or the request's error.
    Runs as a done-callback, where an exception would be logged and lost: every row gets an outcome."""
    error = done.exception()
    if error is None:
        results = done.result()
        if len(results) == len(rows):
            for row, result in zip(rows, results, strict=True):
                row.set_result(result)
            return
        error = AssertionError(f"a request answered {len(results)} rows of {len(rows)}")  # a bug of ours
    for row in rows:
        row.set_exception(error)
