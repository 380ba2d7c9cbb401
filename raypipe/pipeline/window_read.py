"""A window whose pieces share one read: the source bytes of a window's rows read once, each piece
handed its own rows with their bytes.

A stream's first window of whole shards (Parquet row groups, remote tar shards) is cut into pieces
that double from ``chunk_rows`` (``order.RankPlan.chunks(ramp=True)``), so its first batch does not
wait for a whole window on one core. Each piece's rows are spread over all of the window's shards: a
piece that read its own would read every row group again (a Parquet row group is read whole), from an
object store requests and bytes over the network again: 2.5 times the file's bytes over a small
file's first epoch (``tests/pipeline/test_window_read.py``). So the stream reads the window once, here,
with a remote store's requests sent in the order of the rows that need them, and a piece goes out with
its rows' bytes (a ``bytes`` column, which ``BlockReader.read_block`` takes instead of reading) as soon
as they have come. A row whose read failed goes out with its skip in the ``error`` column, as a row the
listing knew bad does, so it is counted the same way. Where a piece's own read costs about what
handing it the bytes costs (a local file's page cache, a remote tar shard's own members), the pieces
read their own (``ChunkStream._share_reads``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future

import numpy as np

from raypipe.kernels.errors import SkipImage

__all__ = ["WindowRead"]


class WindowRead:
    """The rows at positions ``lo … lo + len(rows)`` of an epoch's order, read once by ``read`` (a
    ``BlockReader.read_block``) when a piece of them is first asked for."""

    def __init__(self, lo: int, take: Callable[[], Mapping[str, np.ndarray]], read: Callable):
        self.lo = lo
        self._take, self._read = take, read
        self._rows: Mapping[str, np.ndarray] | None = None
        self._bytes: list | None = None

    def _start(self) -> None:
        if self._rows is None:
            self._rows = self._take()
            self._bytes = self._read(self._rows, wait=False)

    def ready(self, lo: int, hi: int) -> bool:
        """Whether the bytes of positions ``lo … hi`` have all come (a piece can go out without waiting)."""
        self._start()
        return not any(isinstance(b, Future) and not b.done() for b in self._bytes[lo - self.lo : hi - self.lo])

    def piece(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Positions ``lo … hi``'s rows with their bytes (waiting for those still in flight). Each
        piece is asked for once: its bytes are dropped here once it has them."""
        self._start()
        a, b = lo - self.lo, hi - self.lo
        rows = {name: column[a:b] for name, column in self._rows.items()}
        cells = np.empty(b - a, dtype=object)
        errors = np.array(rows["error"] if "error" in rows else [None] * (b - a), dtype=object)
        for j, got in enumerate(self._bytes[a:b]):
            if isinstance(got, Future):
                got = got.result()
            if isinstance(got, SkipImage):
                errors[j] = str(got)
            else:
                cells[j] = bytes(got)  # a slice of a ranged read's buffer: its own bytes, to pickle
        self._bytes[a:b] = [None] * (b - a)
        return {**rows, "error": errors, "bytes": cells}
