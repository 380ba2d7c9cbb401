"""A rank's position as one small JSON value (``Position``), and how the ranks' positions resume an epoch
on any number of ranks.

A rank's batches are the good rows of its part of the epoch's order, in order (``order``, ``pack.Packer``),
so where it is needs no more than the positions of the order it has not consumed and the batches its
trainer took, valid under the plan they were taken from (``PlanIdentity``; another plan's is refused,
naming what differs). Every loader saves this one value, each layer reading what it needs. A loader
resumes from one rank's value or every rank's list (``read_positions``, the one place that tells them
apart; raypipe 0.1.0's shapes too, ``position_v1``): on the same ranks each goes on with its own; on
another number, what is left is split again as a fresh epoch is (contiguous, equal ±1 row parts).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from raypipe._values import is_int
from raypipe.plan import position_v1
from raypipe.plan.order import rank_slice

__all__ = [
    "PlanIdentity",
    "Position",
    "SavedPositions",
    "StateMismatchError",
    "read_positions",
    "remaining_after",
    "shard_layout_digest",
]

FORMAT = "raypipe-position"
VERSION = 2


class StateMismatchError(ValueError):
    """Raised on loading a saved position that is not one, or not of this plan (another listing, seed, …)."""


def shard_layout_digest(sizes: np.ndarray | None) -> str:
    """A short digest of the shards' row counts (what groups rows into windows); "" without shards."""
    if sizes is None:
        return ""
    return hashlib.sha256(np.ascontiguousarray(sizes, dtype="<i8").tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class PlanIdentity:
    """What a rank's order and batches depend on, besides the epoch and the world size."""

    listing: str  # the listing's digest (``SourceRows.digest``): named first when a state's differs
    rows: int
    shards: str  # ``shard_layout_digest``
    seed: int
    shuffle: bool
    shuffle_window: int
    batch_size: int
    drop_last: bool

    @classmethod
    def from_dict(cls, saved) -> PlanIdentity:
        names = [f.name for f in fields(cls)]
        if not isinstance(saved, dict) or set(saved) != set(names):
            got = sorted(saved) if isinstance(saved, dict) else saved
            raise StateMismatchError(f"the saved position's plan has the keys {got}, expected {names}")
        return cls(**saved)

    def mismatch(self, saved: PlanIdentity) -> str | None:
        """None when ``saved`` (a position's plan) is this identity, else what differs, in words."""
        theirs = asdict(saved)
        for name, value in asdict(self).items():
            if theirs[name] != value:
                what = "listing digest" if name == "listing" else name
                return f"{what} {theirs[name]!r} in the state, {value!r} here"
        return None


@dataclass(frozen=True)
class Position:
    """One rank in ``epoch`` after the ``batches`` its trainer took: rank ``rank`` of ``world_size``, with
    ``remaining`` the positions of the epoch's order it has not consumed (ascending ranges; empty: the
    epoch is done) under ``plan``. The source reads the ranges and numbers its batches on from the count;
    ``EqualBatches`` reads the count (its repeated batches included), the ``DeviceLoader`` the epoch and
    the count. A loader over a source with no plan (a list, a torch DataLoader) has only the epoch and
    the count: the other fields are None. ``as_dict()``::

        {"format": "raypipe-position", "version": 2, "epoch": 3, "rank": 0, "world_size": 2,
         "batches": 120, "remaining": [[15360, 64000]],
         "plan": {"listing": "…", "rows": 128000, "shards": "…", "seed": 0, "shuffle": true,
                  "shuffle_window": 2048, "batch_size": 128, "drop_last": false}}
    """

    epoch: int
    batches: int
    rank: int | None = None
    world_size: int | None = None
    remaining: tuple[tuple[int, int], ...] | None = None
    plan: PlanIdentity | None = None

    def __post_init__(self) -> None:
        for name in ("epoch", "batches"):
            _check_count(name, getattr(self, name))
        placed = [getattr(self, n) is not None for n in ("rank", "world_size", "remaining", "plan")]
        if any(placed) and not all(placed):
            raise StateMismatchError("a saved position has all of rank, world_size, remaining and plan, or none")
        if self.plan is None:
            return
        _check_count("world_size", self.world_size, least=1)
        _check_count("rank", self.rank)
        if self.rank >= self.world_size:
            raise StateMismatchError(f"the saved position is of rank {self.rank} of {self.world_size}")
        previous = 0
        for lo, hi in self.remaining:
            if not (previous <= lo <= hi <= self.plan.rows):
                raise StateMismatchError(
                    f"the saved position's remaining ranges {list(self.remaining)[:4]} are not "
                    f"ascending ranges of the epoch's {self.plan.rows} positions"
                )
            previous = hi

    @property
    def placed(self) -> bool:
        """Whether the position says where in the epoch's order the rank is (its source has a plan)."""
        return self.plan is not None

    @property
    def rows_left(self) -> int:
        """The rows of the epoch the rank has not consumed."""
        if self.remaining is None:
            raise ValueError("a position without a plan has no rows left to count (its source has no position)")
        return sum(hi - lo for lo, hi in self.remaining)

    def with_batches(self, batches: int) -> Position:
        """This position with ``batches`` taken by the trainer (a layer above the source counts them)."""
        return replace(self, batches=batches)

    def as_dict(self) -> dict:
        remaining = None if self.remaining is None else [[int(lo), int(hi)] for lo, hi in self.remaining]
        return {
            "format": FORMAT,
            "version": VERSION,
            "epoch": self.epoch,
            "rank": self.rank,
            "world_size": self.world_size,
            "batches": self.batches,
            "remaining": remaining,
            "plan": None if self.plan is None else asdict(self.plan),
        }

    @classmethod
    def from_dict(cls, saved) -> Position:
        """The position in ``saved`` (``as_dict()``, or one rank's state as raypipe 0.1.0 saved it); a
        value that is not one raises ``StateMismatchError`` naming what is wrong."""
        if position_v1.is_earlier_shape(saved):
            try:
                saved = position_v1.rewrite(saved)
            except ValueError as exc:
                raise StateMismatchError(str(exc)) from None
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            raise StateMismatchError(f"not a raypipe position (no format {FORMAT!r}): {str(saved)[:80]}")
        if saved.get("version") != VERSION:
            raise StateMismatchError(f"raypipe position version {saved.get('version')!r}, this raypipe reads 1 and 2")
        remaining, plan = saved.get("remaining"), saved.get("plan")
        if remaining is not None and not (isinstance(remaining, list) and all(_is_range(r) for r in remaining)):
            raise StateMismatchError(
                f"the saved position's remaining {str(remaining)[:80]} is not a list of [start, end] ranges"
            )
        ranges = None if remaining is None else tuple((lo, hi) for lo, hi in remaining)
        return cls(
            epoch=saved.get("epoch"),
            batches=saved.get("batches"),
            rank=saved.get("rank"),
            world_size=saved.get("world_size"),
            remaining=ranges,
            plan=None if plan is None else PlanIdentity.from_dict(plan),
        )


@dataclass(frozen=True)
class SavedPositions:
    """What a loader resumes from: one rank's position (``every_rank`` False: it goes on with its own),
    or every rank's, in rank order (True: any number of ranks goes on from them). One epoch; placed all
    or none; every rank of one world once."""

    positions: tuple[Position, ...]
    every_rank: bool

    def __post_init__(self) -> None:
        if not self.positions:
            raise StateMismatchError("no saved position to resume from")
        epochs = sorted({p.epoch for p in self.positions})
        if len(epochs) != 1:
            raise StateMismatchError(f"the saved positions are of different epochs {epochs}")
        if len({p.placed for p in self.positions}) != 1:
            raise StateMismatchError("the saved positions are of sources with and without a plan")
        if not self.every_rank or not self.placed:
            return
        world = self.positions[0].world_size
        ranks = [p.rank for p in self.positions]
        if ranks != list(range(world)) or any(p.world_size != world for p in self.positions):
            raise StateMismatchError(
                f"the saved positions are of ranks {ranks}, expected each of 0 … {world - 1} once, in order"
            )

    @property
    def epoch(self) -> int:
        return self.positions[0].epoch

    @property
    def batches(self) -> int:
        """The batches a resumed epoch counts as taken before it: the position's own, or the most of every
        rank's, which is the count a ``DeviceLoader`` goes on from."""
        return max(p.batches for p in self.positions)

    @property
    def placed(self) -> bool:
        return self.positions[0].placed

    @property
    def world_size(self) -> int | None:
        """The number of ranks that saved them."""
        return self.positions[0].world_size

    @property
    def rows_left(self) -> int:
        """The rows of the epoch that none of the positions' ranks consumed."""
        return sum(p.rows_left for p in self.positions)

    def as_state(self) -> dict | list[dict]:
        """The positions as JSON, in the shape given: one rank's dict, or every rank's list."""
        out = [p.as_dict() for p in self.positions]
        return out if self.every_rank else out[0]

    def segments(self, identity: PlanIdentity, *, rank: int, world_size: int) -> list[tuple[int, int]]:
        """Rank ``rank`` of ``world_size``'s ranges of the epoch's order to resume with: its own position's
        (the same world size), or its part of every rank's (any world size)."""
        for p in self.positions:
            why = identity.mismatch(p.plan) if p.placed else "it has no plan (its source had no position)"
            if why:
                raise StateMismatchError(f"the saved position belongs to another plan: {why}")
        if not self.every_rank:
            own = self.positions[0]
            if (own.rank, own.world_size) != (rank, world_size):
                raise StateMismatchError(
                    f"the saved position is rank {own.rank} of {own.world_size}, this is rank {rank} of {world_size}: "
                    "to resume on another number of ranks, give every rank the states of all the ranks that saved them"
                )
            return list(own.remaining)
        if self.world_size == world_size:
            return list(self.positions[rank].remaining)
        ranges = [r for p in self.positions for r in p.remaining if r[1] > r[0]]
        return _split(ranges, rank, world_size)


def read_positions(state) -> SavedPositions:
    """What ``state`` holds: one rank's saved position (a dict) or every rank's (a list or tuple of them,
    in any order), each in this release's shape or one raypipe 0.1.0 saved."""
    every = isinstance(state, list | tuple)
    positions = [Position.from_dict(s) for s in (state if every else [state])]
    if every and all(p.placed for p in positions):
        positions.sort(key=lambda p: p.rank)
    return SavedPositions(tuple(positions), every)


def _is_range(r) -> bool:
    return isinstance(r, list | tuple) and len(r) == 2 and all(is_int(x) for x in r)


def _check_count(name: str, value, least: int = 0) -> None:
    if not is_int(value) or value < least:
        raise StateMismatchError(f"the saved position's {name} is {value!r}: expected an integer >= {least}")


def remaining_after(segments, position: int) -> tuple[tuple[int, int], ...]:
    """The part of ``segments`` (ascending position ranges) at or after ``position``."""
    return tuple((max(int(lo), position), int(hi)) for lo, hi in segments if hi > position and hi > lo)


def _split(ranges: list[tuple[int, int]], rank: int, world_size: int) -> list[tuple[int, int]]:
    """Rank ``rank``'s contiguous, equal (±1) part of the positions ``ranges`` hold, one after another."""
    lengths = np.array([hi - lo for lo, hi in ranges], dtype=np.int64)
    part = rank_slice(int(lengths.sum()), rank, world_size)
    out, at = [], 0
    for (lo, _), length in zip(ranges, lengths, strict=True):
        a, b = max(part.start, at), min(part.stop, at + int(length))
        if a < b:
            out.append((lo + a - at, lo + b - at))
        at += int(length)
    return out
