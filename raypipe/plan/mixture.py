"""A weighted mixture's epoch order: which row of which part sits at each position, computed lazily.

Semantics (pure functions of the seed, the epoch, the parts' sizes and the takes):

- **Takes.** An epoch takes ``takes[i]`` rows of part ``i`` (``part_takes``): ``weight_i / sum(weights) *
  samples_per_epoch`` rounded down, and the rows left over go one each to the parts with the largest
  remainders (ties: the lower part index), so the takes add up to ``samples_per_epoch`` exactly.
- **Cycles.** Each part walks an endless stream of its rows: cycle ``c`` is the part's own epoch order
  (``EpochOrder``, its shard windows included) with the seed ``(seed, part)`` at "epoch" ``c``. Epoch
  ``e`` takes the stream's positions ``e * takes[i] … (e + 1) * takes[i]``, so no row of a part is taken
  a second time before every row of it was taken once, counting across epochs: a down-weighted part
  goes on where the last epoch stopped, an up-weighted one repeats whole cycles. A take's cycle is
  reported with it (the augmentation seed includes it, so a repeat is augmented anew).
- **Interleave.** Take ``k`` of part ``i`` gets the key ``(k + u_i) / takes[i]``, ``u_i`` drawn per
  (seed, epoch, part) from [0, 1); positions follow the keys in ascending order. Any run of positions
  then holds each part within one row of its share, and the order of a chunk is found without the
  epoch's whole sequence: the takes before a position are a count per part (``_before``), found by
  bisection on the key, so a billion-sample epoch costs a few numbers per part to plan. Keys are
  compared as ``takes_at`` computes them, and keys too close for a float to split (a billion takes
  bring some within 1e-16 of another part's) are split as it sorts them: a tie, the lower part first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raypipe.plan.order import EpochOrder, ShardRuns

__all__ = ["TAKE", "MixtureOrder", "part_takes"]

# A take: which part, which of its rows, in which of its cycles, at which position of the epoch (the
# rows of a mixture's order; the position is the take's id, unique in the epoch across ranks).
TAKE = np.dtype([("part", np.int64), ("row", np.int64), ("cycle", np.int64), ("position", np.int64)])

_MIX, _PART = 0x313C, 0x9A27  # the generators' streams: the interleave's offsets, a part's cycles


def part_takes(weights: Sequence[float], samples_per_epoch: int) -> np.ndarray:
    """Rows of each part per epoch (see the module doc), an int64 array summing to ``samples_per_epoch``.

    Raises:
        ValueError: a weight that is negative, NaN or infinite, all weights zero, no part, or
            ``samples_per_epoch`` < 1.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0:
        raise ValueError("weights: expected one weight per part, and at least one part")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"weights={list(weights)}: expected finite numbers >= 0")
    if w.sum() <= 0:
        raise ValueError(f"weights={list(weights)}: at least one must be > 0")
    if isinstance(samples_per_epoch, bool) or not isinstance(samples_per_epoch, int | np.integer):
        raise ValueError(f"samples_per_epoch={samples_per_epoch!r}: expected an int >= 1")
    if samples_per_epoch < 1:
        raise ValueError(f"samples_per_epoch={samples_per_epoch}: expected >= 1")
    exact = w / w.sum() * samples_per_epoch
    takes = np.floor(exact).astype(np.int64)
    left = int(samples_per_epoch - takes.sum())
    by_remainder = np.lexsort((np.arange(len(w)), -(exact - takes)))  # largest remainder, then lower index
    takes[by_remainder[:left]] += 1
    return takes


class MixtureOrder:
    """Epoch ``epoch`` of a mixture of parts of ``sizes`` rows: ``n`` positions, ``take(lo, hi)`` the
    ``(part, row, cycle)`` at positions ``lo … hi`` (see the module doc). ``runs``: each part's shards
    (``ShardRuns``, or None for rows read one by one), whose windows each cycle keeps."""

    def __init__(
        self,
        sizes: Sequence[int],
        takes: Sequence[int],
        *,
        seed: int,
        epoch: int,
        shuffle: bool = True,
        runs: Sequence[ShardRuns | None] | None = None,
        window_rows: int = 1,
    ):
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.takes = np.asarray(takes, dtype=np.int64)
        if len(self.sizes) != len(self.takes) or np.any((self.sizes < 1) & (self.takes > 0)):
            raise ValueError(
                f"sizes={list(sizes)}, takes={list(takes)}: one size per part, and rows in each part taken"
            )
        self.seed, self.epoch, self.shuffle, self.window_rows = seed, epoch, shuffle, window_rows
        self.runs = list(runs) if runs is not None else [None] * len(self.sizes)
        self.n = int(self.takes.sum())
        self.offsets = np.random.default_rng([seed, epoch, _MIX]).random(len(self.sizes))
        self._cycles: dict[tuple[int, int], EpochOrder] = {}

    def _before(self, x: float) -> np.ndarray:
        """Per part, its takes whose key, as ``takes_at`` computes it, is below ``x``."""
        count = np.clip(np.ceil(x * self.takes - self.offsets), 0, self.takes).astype(np.int64)
        taken = self.takes > 0
        divisor = np.where(taken, self.takes, 1)
        while True:  # the estimate is off by a row where a key is within rounding of x
            down = taken & (count > 0) & ((count - 1 + self.offsets) / divisor >= x)
            up = taken & (count < self.takes) & ((count + self.offsets) / divisor < x)
            if not (down.any() or up.any()):
                return count
            count += up.astype(np.int64) - down.astype(np.int64)

    def counts_before(self, position: int) -> np.ndarray:
        """Per part, its takes at positions before ``position`` (0 … n)."""
        if not 0 <= position <= self.n:
            raise ValueError(f"position {position} outside the epoch's {self.n}")
        if position == 0:
            return np.zeros(len(self.takes), dtype=np.int64)
        if position == self.n:
            return self.takes.copy()
        lo, hi = 0.0, 2.0  # keys lie in [0, 1): _before(0) sums to 0, _before(2) to n
        while lo < (mid := (lo + hi) / 2) < hi:
            total = int(self._before(mid).sum())
            if total == position:
                return self._before(mid)
            lo, hi = (mid, hi) if total < position else (lo, mid)
        # lo and hi are neighbouring floats: the keys in [lo, hi) all equal lo, and the position falls
        # among them; as in ``takes_at``, a tie goes to the lower part
        below, tied = self._before(lo), self._before(hi) - self._before(lo)
        left = position - int(below.sum())
        for i in range(len(tied)):
            step = min(int(tied[i]), left)
            below[i] += step
            left -= step
        return below

    starts = np.zeros(1, dtype=np.int64)  # one window: chunks are cut by rows (``order.chunk_bounds``)

    @property
    def windows(self) -> int:
        return 1

    def all(self) -> np.ndarray:
        return self.take(0, self.n)

    def take(self, lo: int, hi: int) -> np.ndarray:
        """The takes (``TAKE``: part, row, cycle) at positions ``lo … hi`` (exclusive), in order."""
        part, row, cycle = self.takes_at(lo, hi)
        out = np.empty(len(part), dtype=TAKE)
        out["part"], out["row"], out["cycle"] = part, row, cycle
        out["position"] = np.arange(lo, hi, dtype=np.int64)
        return out

    def takes_at(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(part, row, cycle)`` int64 arrays of the positions ``lo … hi`` (exclusive), in order."""
        if not 0 <= lo <= hi <= self.n:
            raise ValueError(f"positions {lo}…{hi} outside the epoch's {self.n}")
        first, last = self.counts_before(lo), self.counts_before(hi)
        parts, ks = [], []
        for i in np.flatnonzero(last > first):
            k = np.arange(first[i], last[i], dtype=np.int64)
            parts.append(np.full(len(k), i, dtype=np.int64))
            ks.append(k)
        if not parts:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty, empty
        part, k = np.concatenate(parts), np.concatenate(ks)
        keys = (k + self.offsets[part]) / self.takes[part]
        by_key = np.lexsort((part, keys))  # ascending keys; a tie goes to the lower part
        part, k = part[by_key], k[by_key]
        stream = self.epoch * self.takes[part] + k  # each part's position in its endless stream
        cycle = stream // self.sizes[part]
        row = np.empty(len(part), dtype=np.int64)
        for i, c in {(int(i), int(c)) for i, c in zip(part, cycle, strict=True)}:
            mine = np.flatnonzero((part == i) & (cycle == c))
            offsets = stream[mine] - c * self.sizes[i]  # consecutive: a run of this cycle's order
            row[mine] = self._cycle(i, c).take(int(offsets[0]), int(offsets[-1]) + 1)
        return part, row, cycle

    def _cycle(self, part: int, cycle: int) -> EpochOrder:
        key = (part, cycle)
        order = self._cycles.get(key)
        if order is None:
            if len(self._cycles) > 16:
                self._cycles.clear()
            order = self._cycles[key] = EpochOrder(
                int(self.sizes[part]),
                seed=_part_seed(self.seed, part),
                epoch=cycle,
                shuffle=self.shuffle,
                runs=self.runs[part],
                window_rows=self.window_rows,
            )
        return order


def _part_seed(seed: int, part: int) -> int:
    """Part ``part``'s own seed: its cycles are its own, whatever the other parts are."""
    return int(np.random.SeedSequence([seed, _PART, part]).generate_state(1, np.uint64)[0] >> np.uint64(1))
