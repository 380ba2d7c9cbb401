"""A rank's position in an epoch as a small JSON value, and how the ranks' positions resume the epoch on
any number of ranks.

An epoch's order is a pure function of the plan (``order.EpochOrder``), and a rank's batches are the good
rows of its part of that order, in order (``pack.Packer``). So where a rank is needs no more than the
positions of the order it has not consumed yet (``remaining``: ranges of positions, ascending), and a
state is only valid under the plan it was taken from (``PlanIdentity``: the listing, the seed, the
shuffle, the batch size): another one is refused with an error that names what differs.

Resuming on the same number of ranks, each rank goes on with its own ``remaining``: the same batches an
uninterrupted run yields. On another number (elastic), the ranks' ``remaining`` ranges, in rank order,
are one sequence of positions that is split again into contiguous, equal (±1 row) parts as a fresh
epoch is (``order.rank_slice``): every row of the epoch is still read once, by one rank.

A state (``EpochState.as_dict()``)::

    {"format": "raypipe-position", "version": 1, "epoch": 3, "rank": 0, "world_size": 2,
     "batches": 120, "remaining": [[15360, 64000]],
     "plan": {"listing": "…", "rows": 128000, "shards": "…", "seed": 0, "shuffle": true,
              "shuffle_window": 2048, "batch_size": 128, "drop_last": false}}
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

import numpy as np

from raypipe.plan.order import rank_slice

__all__ = [
    "EpochState",
    "PlanIdentity",
    "StateMismatchError",
    "resume_segments",
    "resumed_batches",
    "shard_layout_digest",
]

FORMAT = "raypipe-position"
VERSION = 1


class StateMismatchError(ValueError):
    """A saved position that does not belong to this plan (another listing, seed, batch size, …)."""


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

    def mismatch(self, saved: dict) -> str | None:
        """None when ``saved`` (a state's ``plan``) is this identity, else what differs, in words."""
        ours = asdict(self)
        for name, value in ours.items():
            if saved.get(name) != value:
                what = "listing digest" if name == "listing" else name
                return f"{what} {saved.get(name)!r} in the state, {value!r} here"
        return None


@dataclass(frozen=True)
class EpochState:
    """Rank ``rank`` of ``world_size`` in ``epoch``: ``batches`` consumed, ``remaining`` the positions of
    the epoch's order it has not (ascending ranges; empty: the epoch is done)."""

    plan: PlanIdentity
    epoch: int
    rank: int
    world_size: int
    batches: int
    remaining: tuple[tuple[int, int], ...] = field(default_factory=tuple)

    def as_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "epoch": self.epoch, "rank": self.rank,
            "world_size": self.world_size, "batches": self.batches,
            "remaining": [[int(lo), int(hi)] for lo, hi in self.remaining], "plan": asdict(self.plan),
        }  # fmt: skip


def remaining_after(segments, position: int) -> tuple[tuple[int, int], ...]:
    """The part of ``segments`` (ascending position ranges) at or after ``position``."""
    return tuple((max(int(lo), position), int(hi)) for lo, hi in segments if hi > position and hi > lo)


def _check(state, identity: PlanIdentity) -> dict:
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise StateMismatchError(f"not a raypipe position (no format {FORMAT!r}): {str(state)[:80]}")
    if state.get("version") != VERSION:
        raise StateMismatchError(f"raypipe position version {state.get('version')}, this raypipe reads {VERSION}")
    why = identity.mismatch(state.get("plan") or {})
    if why:
        raise StateMismatchError(f"the saved position belongs to another plan: {why}")
    previous = -1
    for lo, hi in state["remaining"]:
        if not (previous <= lo <= hi <= identity.rows):
            raise StateMismatchError(f"the saved position's remaining ranges {state['remaining'][:4]} are not "
                                     f"ascending ranges of the epoch's {identity.rows} positions")  # fmt: skip
        previous = hi
    return state


def resume_segments(states, identity: PlanIdentity, *, rank: int, world_size: int
                    ) -> tuple[int, list[tuple[int, int]]]:  # fmt: skip
    """(epoch, this rank's ranges of positions) to resume from ``states``: this rank's own state (same
    world size), or the states of all ranks of the run that saved them (any world size)."""
    many = isinstance(states, list | tuple)
    saved = [_check(s, identity) for s in (states if many else [states])]
    if not saved:
        raise StateMismatchError("no saved position to resume from")
    epochs = {s["epoch"] for s in saved}
    if len(epochs) != 1:
        raise StateMismatchError(f"the saved positions are of different epochs {sorted(epochs)}")
    epoch = epochs.pop()
    old_world = saved[0]["world_size"]
    if not many:
        if old_world != world_size or saved[0]["rank"] != rank:
            raise StateMismatchError(
                f"the saved position is rank {saved[0]['rank']} of {old_world}, this is rank {rank} of {world_size}: "
                "to resume on another number of ranks, give every rank the states of all the ranks that saved them"
            )  # fmt: skip
        return epoch, [tuple(r) for r in saved[0]["remaining"]]
    ranks = sorted(s["rank"] for s in saved)
    if ranks != list(range(old_world)) or any(s["world_size"] != old_world for s in saved):
        raise StateMismatchError(f"the saved positions are of ranks {ranks}, expected each of 0 … {old_world - 1} once")
    saved.sort(key=lambda s: s["rank"])
    if old_world == world_size:
        return epoch, [tuple(r) for r in saved[rank]["remaining"]]
    ranges = [tuple(r) for s in saved for r in s["remaining"] if r[1] > r[0]]
    return epoch, _split(ranges, rank, world_size)


def resumed_batches(states) -> int:
    """The number of the batches a resumed epoch counts as taken before it (``resume_segments``'s
    states, checked there): the state's own, or the most of every rank's, which is the count a
    ``DeviceLoader`` goes on from. A position saved later in the epoch counts them too."""
    saved = states if isinstance(states, list | tuple) else [states]
    return max(int(s["batches"]) for s in saved)


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
