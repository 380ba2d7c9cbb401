"""The epoch order: which rows a rank reads in an epoch, in which order, cut into chunks of work.

One pure function of ``(seed, epoch, shuffle, shards, window, rank, world_size)``, so every rank and
every retry computes the same order without talking to the others.

Two shuffles, chosen by the rows' ``shard`` column (see ``raypipe.sources.table``):

- ``"global"`` (rows without shards, e.g. an image folder, where any row can be read on its own
  cheaply): a seeded permutation of all rows.
- ``"shard-window"`` (rows that live in shards read as a whole: Parquet row groups, tar shards): the
  shards are permuted, consecutive shards are grouped into windows of about ``window_rows`` rows
  (a shard starting inside a window's span joins it), and the rows inside each window are permuted.
  Each shard belongs to exactly one window. Where a shard is read as a whole (a Parquet row group) or
  fetched in byte ranges (a tar shard in an object store), a window is one chunk of work, so the
  worker that runs it reads each of its row groups once per epoch, and a remote shard's members in a
  few large ranged requests (neighbouring members share one) instead of one request each; a window
  longer than half again ``window_rows`` (one huge shard) is cut, and its shard is then read once per
  piece. Where a sample is read on its own cheaply (a member of a local tar shard, one ``pread``), the
  window is cut into ordinary chunks, so its first batch does not wait for the whole window.
  A larger window mixes more shards into each batch (closer to a global shuffle). On a file
  sorted by class (4 classes, 100-row groups, 2000-4000 rows), 2048-row windows give batches
  0.97-1.0x the label entropy of a global shuffle, 1024-row windows 0.91-0.97x
  (tests/test_order.py checks the 2048 default).

Ranks take contiguous, equal (±1 row) slices of the epoch's order, so each sample is in exactly one
rank's epoch and a shard is read by at most two ranks.

A stream's first epoch (``chunks(epoch, ramp=True)``) cuts its first whole window into pieces that
double from ``chunk_rows`` (128, 256, 512, … rows): nothing runs ahead of a run's start, and its first
batch would otherwise wait for a whole window of work on one core. Each piece reads the window's
shards itself, so they are read a few times (about log2(window_rows / chunk_rows)) once per run. The
order, and so every batch, is the same either way: only where the work is cut moves.
"""

from __future__ import annotations

import numpy as np

__all__ = ["epoch_order", "rank_slice", "chunk_bounds", "doubling_bounds", "RankPlan", "SHARDED_KINDS"]

# Sources whose rows live in shards (Parquet row groups, tar shards): shuffled by windows of whole
# shards. A folder or manifest row is a file of its own, read alone, and is shuffled globally.
SHARDED_KINDS = ("parquet", "webdataset")
# Of those, the ones whose shard is read as a whole (a Parquet row group): one chunk per window. A
# remote tar shard's window is one chunk too (``RankPlan.for_rows``): its members come in ranges.
WHOLE_SHARD_KINDS = ("parquet",)


def _rng(seed: int, epoch: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, stream])


def epoch_order(
    n: int, *, seed: int, epoch: int, shuffle: bool, shards: np.ndarray | None = None, window_rows: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """``(order, starts)``: all ``n`` row indices in this epoch's order and, for sharded rows, the
    positions in ``order`` where each window begins (``[0]`` without shards)."""
    if shards is None or n == 0 or not (shards >= 0).any():
        order = _rng(seed, epoch, 0x5EED).permutation(n) if shuffle else np.arange(n)
        return order, np.zeros(1, dtype=np.int64)
    if shards[0] >= 0 and not (shards[1:] < shards[:-1]).any():
        return _contiguous_order(n, seed, epoch, shuffle, shards, window_rows)
    # Rows without a shard (-1) each form a shard of their own.
    keys = np.where(shards >= 0, shards, -1 - np.arange(n))
    uniq, inverse = np.unique(keys, return_inverse=True)
    shard_order = _rng(seed, epoch, 0x5A4D).permutation(len(uniq)) if shuffle else np.arange(len(uniq))
    sizes = np.bincount(inverse, minlength=len(uniq))[shard_order]
    first_row = np.cumsum(sizes) - sizes  # where each shard starts in the epoch, in shuffled order
    window_of_shard = np.empty(len(uniq), dtype=np.int64)
    window_of_shard[shard_order] = first_row // max(1, window_rows)
    win = window_of_shard[inverse]  # each row's window number
    # Rows by window, then by a random key inside the window (stable on ties: listing order).
    inner = _rng(seed, epoch, 0x1A3E).random(n) if shuffle else np.arange(n, dtype=np.float64)
    order = np.lexsort((inner, win))
    sorted_win = win[order]
    starts = np.flatnonzero(np.r_[True, sorted_win[1:] != sorted_win[:-1]])
    return order, starts


# Rows sorted together by their random keys in one go (whole windows): small enough for the cache,
# large enough that the per-call cost vanishes.
_SORT_ROWS = 1 << 16
_SORT_WINDOWS = 1 << 11  # their numbers in a batch take the 11 bits of a 64-bit key above a draw's 53


def _contiguous_order(
    n: int, seed: int, epoch: int, shuffle: bool, shards: np.ndarray, window_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """``epoch_order`` for shards that are contiguous runs in listing order (non-decreasing ``shard``, as
    every source lists them): the same values, from per-shard arithmetic instead of sorting every row.

    A window's rows in listing order are its shards' runs, by shard number; sorting each window by its
    random keys, ties kept in that order, then gives what sorting every row by (window, key, listing
    index) gives. The draws are multiples of 2**-53, so a draw times 2**53 is an exact integer."""
    bounds = np.flatnonzero(shards[1:] != shards[:-1]) + 1
    first = np.r_[0, bounds]  # each shard's first row
    sizes = np.diff(np.r_[first, n])
    count = len(sizes)
    shard_order = _rng(seed, epoch, 0x5A4D).permutation(count) if shuffle else np.arange(count)
    shuffled = sizes[shard_order]
    window_of_shard = np.empty(count, dtype=np.int64)
    window_of_shard[shard_order] = (np.cumsum(shuffled) - shuffled) // max(1, window_rows)
    by_window = np.argsort(window_of_shard, kind="stable")  # shards by window, then by number
    run = sizes[by_window]
    at = np.cumsum(run) - run  # where each shard's run lands in the order
    windows = window_of_shard[by_window]
    new_window = np.r_[True, windows[1:] != windows[:-1]]
    starts = at[new_window]
    # order[at[k] + j] = first[by_window[k]] + j: a run of consecutive rows per shard
    order = np.repeat(first[by_window] - at, run)
    for lo in range(0, n, _SORT_ROWS):
        hi = min(lo + _SORT_ROWS, n)
        order[lo:hi] += np.arange(lo, hi)
    if shuffle:
        inner = _rng(seed, epoch, 0x1A3E).random(n)
        ends, count = np.r_[starts[1:], n], len(starts)
        # batches of whole windows: about _SORT_ROWS rows (a longer window alone), at most 2**11 windows
        cut = np.r_[True, np.diff(starts // _SORT_ROWS) != 0] | (np.arange(count) % _SORT_WINDOWS == 0)
        batch = np.flatnonzero(cut)
        for a, b in zip(batch, np.r_[batch[1:], count], strict=True):
            lo, hi = int(starts[a]), int(ends[b - 1])
            rows = order[lo:hi]
            # one integer key: the window's place in the batch, then the random draw (53 bits, exact)
            key = (inner[rows] * 2.0**53).astype(np.uint64)
            key |= np.repeat(np.arange(b - a, dtype=np.uint64) << np.uint64(53), ends[a:b] - starts[a:b])
            pick = np.argsort(key)
            ordered = key[pick]
            if (ordered[1:] == ordered[:-1]).any():  # equal draws in a window: listing order decides
                pick = np.argsort(key, kind="stable")
            order[lo:hi] = rows[pick]
    return order, starts.astype(np.int64)


def rank_slice(n: int, rank: int, world_size: int) -> slice:
    """This rank's contiguous part of an epoch's order of ``n`` rows (sizes differ by at most one)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def chunk_bounds(lo: int, hi: int, window_starts: np.ndarray, chunk_rows: int) -> list[tuple[int, int]]:
    """Cut positions ``[lo, hi)`` of an epoch's order into chunks: at every window start, and every
    ``chunk_rows`` rows inside a window that is longer than that."""
    cuts = [int(s) for s in window_starts if lo < s < hi]
    edges = [lo, *cuts, hi]
    out = []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        out.extend((s, min(s + chunk_rows, b)) for s in range(a, b, chunk_rows))
    return out


def doubling_bounds(lo: int, hi: int, first: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into pieces of ``first``, ``2 * first``, ``4 * first``, … rows (the last one what
    is left)."""
    out, size = [], max(1, first)
    while lo < hi:
        out.append((lo, min(lo + size, hi)))
        lo, size = lo + size, 2 * size
    return out


class RankPlan:
    """One rank's epochs: ``rows(epoch)`` its row indices in order, ``chunks(epoch)`` the same cut into
    the units of work the workers run (each a sorted-by-order index array)."""

    def __init__(
        self,
        n: int,
        *,
        seed: int,
        shuffle: bool,
        chunk_rows: int,
        rank: int = 0,
        world_size: int = 1,
        shards: np.ndarray | None = None,
        window_rows: int = 2048,
        whole_windows: bool = True,
    ):
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.chunk_rows = chunk_rows
        self.rank, self.world_size = rank, world_size
        self.shards, self.window_rows = shards, window_rows
        self.whole_windows = whole_windows
        self._span = rank_slice(n, rank, world_size)
        self.sharded = shards is not None and n > 0 and bool((shards >= 0).any())

    @classmethod
    def for_rows(cls, rows, *, seed: int, shuffle: bool, chunk_rows: int, window_rows: int, rank: int = 0,
                 world_size: int = 1) -> RankPlan:  # fmt: skip
        """The plan for a listing (``raypipe.sources.SourceRows``): shard windows for sharded kinds, each
        one chunk where its shards are read whole or from an object store."""
        from raypipe.sources.table import column_array  # the order itself needs numpy only

        table = rows.table
        sharded = rows.kind in SHARDED_KINDS and "shard" in table.column_names
        return cls(
            len(rows), seed=seed, shuffle=shuffle, chunk_rows=chunk_rows, rank=rank, world_size=world_size,
            shards=column_array(table.column("shard")) if sharded else None, window_rows=window_rows,
            whole_windows=rows.kind in WHOLE_SHARD_KINDS or not rows.root.is_local,
        )  # fmt: skip

    @property
    def max_chunk_rows(self) -> int:
        """The most rows in one chunk: a whole window where shards are read whole (its row groups read
        once), cut only when one shard alone makes it much longer than ``window_rows``."""
        if self.sharded and self.whole_windows:
            return max(self.chunk_rows, self.window_rows + self.window_rows // 2)
        return self.chunk_rows

    def __len__(self) -> int:
        """Rows this rank reads per epoch."""
        return self._span.stop - self._span.start

    def chunks(self, epoch: int, *, ramp: bool = False) -> list[np.ndarray]:
        """This rank's chunks of ``epoch``; ``ramp``: the first whole window cut into doubling pieces (a
        stream's first epoch: see the module's doc)."""
        order, starts = epoch_order(
            self.n, seed=self.seed, epoch=epoch, shuffle=self.shuffle, shards=self.shards,
            window_rows=self.window_rows,
        )  # fmt: skip
        limit = self.max_chunk_rows if self.sharded else self.chunk_rows
        bounds = chunk_bounds(self._span.start, self._span.stop, starts, limit)
        if ramp and bounds and limit > self.chunk_rows:
            bounds = doubling_bounds(*bounds[0], self.chunk_rows) + bounds[1:]
        return [order[a:b] for a, b in bounds]

    def rows(self, epoch: int) -> np.ndarray:
        chunks = self.chunks(epoch)
        return np.concatenate(chunks) if chunks else np.empty(0, np.int64)
