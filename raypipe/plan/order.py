"""The epoch order: which rows a rank reads in an epoch, in which order, cut into chunks of work.

One pure function of ``(seed, epoch, shuffle, shards, window, rank, world_size)``, so every rank and
every retry computes the same order without talking to the others. It is held as data whose size grows
with the shards, not the samples (``EpochOrder``): the rows of one window are computed when a chunk of
it is planned, so a billion samples in 100,000 shards cost a few arrays of 100,000 numbers.

Two shuffles, chosen by the rows' ``shard`` column (see ``raypipe.sources.table``), or by per-shard
sample counts where an index gives them (``ShardRuns.from_sizes``):

- ``"global"`` (rows without shards, e.g. an image folder, where any row can be read on its own
  cheaply): a seeded permutation of all rows.
- ``"shard-window"`` (rows that live in shards read as a whole: Parquet row groups, tar shards): the
  shards are permuted, consecutive shards are grouped into windows of about ``window_rows`` rows
  (a shard starting inside a window's span joins it), and the rows inside each window are permuted by
  a generator of their own (seeded by seed, epoch and the window's number), so any window's rows can be
  computed without the others. Each shard belongs to exactly one window. Where a shard is read as a
  whole (a Parquet row group) or fetched in byte ranges (a tar shard in an object store), a window is
  one chunk of work, so the worker that runs it reads each of its row groups once per epoch, and a
  remote shard's members in a few large ranged requests (neighbouring members share one) instead of
  one request each; a window longer than half again ``window_rows`` (one huge shard) is cut, and its
  shard is then read once per piece. Where a sample is read on its own cheaply (a member of a local tar
  shard, one ``pread``), the window is cut into ordinary chunks, so its first batch does not wait for
  the whole window. A larger window mixes more shards into each batch (closer to a global shuffle). On
  a file sorted by class (4 classes, 100-row groups, 2000-4000 rows), 2048-row windows give batches
  about the label entropy of a global shuffle (tests/plan/test_order.py checks the 2048 default).

Positions: the epoch's order is a sequence of ``n`` positions; a rank's part is a list of position
ranges (``segments``): its contiguous, equal (±1 row) slice of the order for a fresh epoch
(``rank_slice``), so each sample is in exactly one rank's epoch and a shard is read by at most two
ranks; what is left of the ranks' slices when an epoch is resumed (``raypipe.plan.position``).

A stream's first epoch (``chunks(epoch, ramp=True)``) cuts its first whole window into pieces that
double from ``chunk_rows`` (128, 256, 512, … rows): nothing runs ahead of a run's start, and its first
batch would otherwise wait for a whole window of work on one core. For a Parquet file in an object
store the stream reads that window once and hands each piece its rows' bytes
(``raypipe.pipeline.window_read``), so each row group is still fetched once; elsewhere each piece reads
its own rows (a remote tar shard's members once each; a local file's row groups again, from the page
cache). The order, and so every batch, is the same either way: only where the work is cut moves.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

__all__ = [
    "EpochOrder",
    "EpochChunks",
    "RankPlan",
    "SHARDED_KINDS",
    "ShardRuns",
    "chunk_bounds",
    "doubling_bounds",
    "epoch_order",
    "rank_slice",
]

# Sources whose rows live in shards (Parquet row groups, tar shards, a Ray Dataset's blocks in the object
# store): shuffled by windows of whole shards. A folder or manifest row is a file of its own, read alone,
# and is shuffled globally. A Ray Dataset's chunk gets each block it touches (zero-copy on the node that
# holds it): a window keeps those to a few, where a global shuffle would touch every block per chunk.
SHARDED_KINDS = ("parquet", "webdataset", "raydata")
# Of those, the ones whose shard is read as a whole (a Parquet row group): one chunk per window. A
# remote tar shard's window is one chunk too (``RankPlan.for_rows``): its members come in ranges. A
# block in the object store is not: any of its rows is a slice of it where it lies, so a window of
# blocks is cut into ordinary chunks, whose first batch does not wait for the whole window.
WHOLE_SHARD_KINDS = ("parquet",)

_GLOBAL, _SHARDS, _INNER = 0x5EED, 0x5A4D, 0x1A3E  # the generators' streams: all rows, shards, a window


def _rng(seed: int, epoch: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, *stream])


class ShardRuns:
    """The listing's rows as the shards an epoch shuffles: ``sizes[u]`` rows in shard ``u`` (shards in
    ascending shard number; rows without a shard each one of their own), its rows either the run
    ``start[u] …`` of row indices (``rows`` None: shards that are contiguous runs in listing order, as
    every source lists them, or counts from an index) or ``rows[start[u] …]``. Empty shards hold no
    rows and take no place in the order."""

    def __init__(self, sizes: np.ndarray, start: np.ndarray, rows: np.ndarray | None = None):
        self.sizes, self.start, self.rows = sizes, start, rows

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def total(self) -> int:
        return int(self.sizes.sum())

    @classmethod
    def from_sizes(cls, counts) -> ShardRuns:
        """Shards of ``counts[k]`` rows each, one after another in listing order (e.g. an index's sample
        counts per shard): nothing per row."""
        counts = np.asarray(counts, dtype=np.int64)
        if (counts < 0).any():
            raise ValueError("a shard's row count is negative")
        first = np.cumsum(counts) - counts
        keep = counts > 0
        return cls(counts[keep], first[keep])

    @classmethod
    def from_shards(cls, shards: np.ndarray) -> ShardRuns | None:
        """The shards of a listing's ``shard`` column; None when no row has one (a global shuffle)."""
        n = len(shards)
        if n == 0 or not (shards >= 0).any():
            return None
        if shards[0] >= 0 and not (shards[1:] < shards[:-1]).any():
            bounds = np.flatnonzero(shards[1:] != shards[:-1]) + 1
            first = np.r_[0, bounds].astype(np.int64)
            return cls(np.diff(np.r_[first, n]).astype(np.int64), first)
        # Rows without a shard (-1) each form a shard of their own.
        keys = np.where(shards >= 0, shards, -1 - np.arange(n))
        _, inverse = np.unique(keys, return_inverse=True)
        sizes = np.bincount(inverse).astype(np.int64)
        return cls(sizes, np.cumsum(sizes) - sizes, np.argsort(inverse, kind="stable"))

    def rows_of(self, units: np.ndarray) -> np.ndarray:
        """The rows of shards ``units``, one shard's after another's, each in listing order."""
        sizes = self.sizes[units]
        at = np.cumsum(sizes) - sizes
        where = np.repeat(self.start[units] - at, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)
        return where if self.rows is None else self.rows[where]


class EpochOrder:
    """One epoch's order of ``n`` rows as positions ``0 … n``: ``starts`` the positions where windows
    begin (``[0]`` for a global shuffle), ``take(lo, hi)`` the rows at positions ``lo … hi``. Holds
    a few numbers per shard; a window's rows are computed when asked (the last one is kept)."""

    def __init__(self, n: int, *, seed: int, epoch: int, shuffle: bool, runs: ShardRuns | None, window_rows: int = 1):
        self.n, self.seed, self.epoch, self.shuffle = n, seed, epoch, shuffle
        self._runs = runs
        self._window: tuple[int, np.ndarray] | None = None
        if runs is None:
            self._all = _rng(seed, epoch, _GLOBAL).permutation(n) if shuffle else np.arange(n)
            self.starts = np.zeros(1, dtype=np.int64)
            return
        if runs.total != n:
            raise ValueError(f"the shards hold {runs.total} rows, the listing {n}")
        count = len(runs)
        shard_order = _rng(seed, epoch, _SHARDS).permutation(count) if shuffle else np.arange(count)
        shuffled = runs.sizes[shard_order]
        window_of_shard = np.empty(count, dtype=np.int64)
        window_of_shard[shard_order] = (np.cumsum(shuffled) - shuffled) // max(1, window_rows)
        self._units = np.argsort(window_of_shard, kind="stable")  # shards by window, then by number
        windows = window_of_shard[self._units]
        new_window = np.r_[True, windows[1:] != windows[:-1]]
        run = runs.sizes[self._units]
        self.starts = (np.cumsum(run) - run)[new_window]
        self._first_unit = np.r_[np.flatnonzero(new_window), count]

    @property
    def windows(self) -> int:
        return len(self.starts)

    def window(self, w: int) -> np.ndarray:
        """The rows of window ``w`` in order."""
        if self._runs is None:
            return self._all
        if self._window is not None and self._window[0] == w:
            return self._window[1]
        rows = self._runs.rows_of(self._units[self._first_unit[w] : self._first_unit[w + 1]])
        if self.shuffle:
            rows = rows[_rng(self.seed, self.epoch, _INNER, w).permutation(len(rows))]
        self._window = (w, rows)
        return rows

    def take(self, lo: int, hi: int) -> np.ndarray:
        """The rows at positions ``lo … hi`` (exclusive), in order."""
        if not 0 <= lo <= hi <= self.n:
            raise ValueError(f"positions {lo}…{hi} outside the epoch's {self.n}")
        if self._runs is None:
            return self._all[lo:hi]
        parts, at = [], lo
        w = int(np.searchsorted(self.starts, lo, side="right")) - 1
        while at < hi:
            begin = int(self.starts[w])
            end = int(self.starts[w + 1]) if w + 1 < len(self.starts) else self.n
            parts.append(self.window(w)[at - begin : min(hi, end) - begin])
            at, w = end, w + 1
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def all(self) -> np.ndarray:
        return self.take(0, self.n)


def epoch_order(
    n: int, *, seed: int, epoch: int, shuffle: bool, shards: np.ndarray | None = None, window_rows: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """``(order, starts)``: all ``n`` row indices in this epoch's order and, for sharded rows, the
    positions in ``order`` where each window begins (``[0]`` without shards). For small listings and
    tests; a run plans with ``EpochOrder``."""
    runs = ShardRuns.from_shards(shards) if shards is not None else None
    order = EpochOrder(n, seed=seed, epoch=epoch, shuffle=shuffle, runs=runs, window_rows=window_rows)
    return order.all(), order.starts


def rank_slice(n: int, rank: int, world_size: int) -> slice:
    """This rank's contiguous part of ``n`` positions (sizes differ by at most one)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def chunk_bounds(lo: int, hi: int, window_starts: np.ndarray, chunk_rows: int) -> np.ndarray:
    """Positions ``[lo, hi)`` cut into chunks, as rows ``(start, stop)``: at every window start, and every
    ``chunk_rows`` rows inside a window that is longer than that."""
    starts = np.asarray(window_starts, dtype=np.int64)
    edges = np.r_[lo, starts[(starts > lo) & (starts < hi)], hi].astype(np.int64)
    seg_lo, seg_hi = edges[:-1], edges[1:]
    counts = -(-(seg_hi - seg_lo) // chunk_rows)
    first = np.cumsum(counts) - counts
    total = int(counts.sum())
    begin = np.repeat(seg_lo, counts) + (np.arange(total) - np.repeat(first, counts)) * chunk_rows
    return np.stack([begin, np.minimum(begin + chunk_rows, np.repeat(seg_hi, counts))], axis=1)


def doubling_bounds(lo: int, hi: int, first: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into pieces of ``first``, ``2 * first``, ``4 * first``, … rows (the last one what
    is left)."""
    out, size = [], max(1, first)
    while lo < hi:
        out.append((lo, min(lo + size, hi)))
        lo, size = lo + size, 2 * size
    return out


class EpochChunks(Sequence):
    """A rank's chunks of one epoch: ``bounds[i]`` the positions of chunk ``i``, ``self[i]`` its rows;
    the first ``ramp`` chunks are the pieces of one window (0: none is)."""

    def __init__(self, order: EpochOrder, bounds: np.ndarray, ramp: int = 0):
        self.order, self.bounds, self.ramp = order, bounds, ramp

    def __len__(self) -> int:
        return len(self.bounds)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        lo, hi = self.bounds[i]
        return self.order.take(int(lo), int(hi))

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))


def _reads_whole_windows(rows) -> bool:
    """Whether a listing's shards are read a window at a time (a Parquet row group is read whole; a
    remote shard in few requests), so a chunk should hold a whole window of them."""
    return rows.kind in WHOLE_SHARD_KINDS or not rows.root.is_local


class RankPlan:
    """One rank's epochs: ``order(epoch)`` the epoch's order, ``chunks(epoch)`` this rank's positions of
    it cut into the units of work the workers run, ``rows(epoch)`` their rows in order."""

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
        runs: ShardRuns | None = None,
        window_rows: int = 2048,
        whole_windows: bool = True,
        mixture=None,
    ):
        self.n, self.seed, self.shuffle = n, seed, shuffle
        # a mixture's order of an epoch, ``mixture(epoch, seed=, shuffle=, window_rows=)`` (its listing's
        # ``mixture_order``: ``raypipe.plan.mixture.MixtureOrder``), instead of an ``EpochOrder``
        self.mixture = mixture
        self.chunk_rows = chunk_rows
        self.rank, self.world_size = rank, world_size
        self.runs = runs if runs is not None else (ShardRuns.from_shards(shards) if shards is not None else None)
        self.window_rows = window_rows
        self.whole_windows = whole_windows
        span = rank_slice(n, rank, world_size)
        self.segments = [(span.start, span.stop)]  # a fresh epoch's: this rank's slice
        self.sharded = self.runs is not None
        self._order: EpochOrder | None = None

    @classmethod
    def for_rows(
        cls, rows, *, seed: int, shuffle: bool, chunk_rows: int, window_rows: int, rank: int = 0, world_size: int = 1
    ) -> RankPlan:
        """The plan for a listing (``raypipe.sources.SourceRows``, or a ``ShardListing``'s samples per
        shard): shard windows for sharded kinds, each one chunk where its shards are read whole or from an
        object store."""
        mixture = getattr(rows, "mixture_order", None)  # a mixture's: its parts' orders interleaved
        runs = None
        if mixture is not None:
            # a part read a window at a time alone (a Parquet file's row groups, a remote shard) has its
            # window's rows spread over the epoch's positions: chunks of a window's size read each of its
            # row groups about once, as alone, where ``chunk_rows`` would read them many times
            whole_windows = any(_reads_whole_windows(part) for part in rows.mixture_parts)
        else:
            whole_windows = _reads_whole_windows(rows)
            if rows.by_shard:
                runs = ShardRuns.from_sizes(rows.shard_counts)
            elif rows.kind in SHARDED_KINDS:
                runs = ShardRuns.from_shards(rows.shard_ids())
        return cls(
            len(rows),
            seed=seed,
            shuffle=shuffle,
            chunk_rows=chunk_rows,
            rank=rank,
            world_size=world_size,
            runs=runs,
            window_rows=window_rows,
            whole_windows=whole_windows,
            mixture=mixture,
        )

    @property
    def max_chunk_rows(self) -> int:
        """The most rows in one chunk: a whole window where shards are read whole (its row groups read
        once), cut only when one shard alone makes it much longer than ``window_rows``."""
        if (self.sharded or self.mixture is not None) and self.whole_windows:
            return max(self.chunk_rows, self.window_rows + self.window_rows // 2)
        return self.chunk_rows

    def __len__(self) -> int:
        """Rows this rank reads in a fresh epoch."""
        return sum(hi - lo for lo, hi in self.segments)

    def order(self, epoch: int) -> EpochOrder:
        """Epoch ``epoch``'s order (the last one asked for is kept)."""
        if self._order is not None and self._order.epoch == epoch:
            return self._order
        if self.mixture is not None:
            self._order = self.mixture(epoch, seed=self.seed, shuffle=self.shuffle, window_rows=self.window_rows)
        else:
            self._order = EpochOrder(
                self.n, seed=self.seed, epoch=epoch, shuffle=self.shuffle, runs=self.runs, window_rows=self.window_rows
            )
        return self._order

    def chunks(self, epoch: int, *, ramp: bool = False, segments=None) -> EpochChunks:
        """This rank's chunks of ``epoch`` over ``segments`` (position ranges; None: its fresh slice);
        ``ramp``: the first whole window cut into doubling pieces (a stream's first epoch: see the
        module's doc)."""
        order = self.order(epoch)
        limit = self.max_chunk_rows
        # an empty ``segments`` is a resumed epoch with nothing left, not a fresh one
        ranges = self.segments if segments is None else segments
        parts = [chunk_bounds(lo, hi, order.starts, limit) for lo, hi in ranges if hi > lo]
        bounds = np.concatenate(parts) if parts else np.empty((0, 2), np.int64)
        pieces = 0
        if ramp and len(bounds) and limit > self.chunk_rows:
            head = np.array(doubling_bounds(int(bounds[0, 0]), int(bounds[0, 1]), self.chunk_rows), np.int64)
            bounds = np.concatenate([head.reshape(-1, 2), bounds[1:]])
            pieces = len(head) if len(head) > 1 else 0
        return EpochChunks(order, bounds, pieces)

    def rows(self, epoch: int, *, segments=None) -> np.ndarray:
        chunks = self.chunks(epoch, segments=segments)
        return np.concatenate(list(chunks)) if len(chunks) else np.empty(0, np.int64)
