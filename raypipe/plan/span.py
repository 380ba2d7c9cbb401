"""A rank's span of the run, as one frozen value: which rank of how many, the epochs it reads and the
CPUs its trainer holds.

``EpochSource``, ``FeederSource`` and ``Pipeline.stream`` take it whole (``span=``) or as the same
fields given as keywords; validated on construction (``ValueError`` naming the field).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from raypipe._values import fail, is_int, is_number, one_value

__all__ = ["RankSpan"]


@dataclass(frozen=True, kw_only=True)
class RankSpan:
    """A rank's span of the run.

    Args:
        rank, world_size: rank ``rank`` (in ``[0, world_size)``) of ``world_size`` (>= 1).
        start_epoch, end_epoch: the epochs it reads, ``end_epoch`` exclusive (None: no end); ints >= 0.
        reserved_cpus: CPUs of the cluster its trainer (and feeder) hold, left out of the rank's share
            of it (a finite number >= 0).

    Raises:
        ValueError: an invalid field, named.
    """

    rank: int = 0
    world_size: int = 1
    start_epoch: int = 0
    end_epoch: int | None = None
    reserved_cpus: float = 0.0

    def __post_init__(self) -> None:
        if not is_int(self.world_size) or self.world_size < 1:
            fail("world_size", self.world_size, "expected an int >= 1")
        if not is_int(self.rank) or not 0 <= self.rank < self.world_size:
            fail("rank", self.rank, f"expected an int in [0, world_size={self.world_size})")
        if not is_int(self.start_epoch) or self.start_epoch < 0:
            fail("start_epoch", self.start_epoch, "expected an int >= 0")
        if self.end_epoch is not None and (not is_int(self.end_epoch) or self.end_epoch < 0):
            fail("end_epoch", self.end_epoch, "expected an int >= 0, or None (no end)")
        cpus = self.reserved_cpus
        if not is_number(cpus) or not math.isfinite(cpus) or cpus < 0:
            fail("reserved_cpus", cpus, "expected a number >= 0")
        for name in ("rank", "world_size", "start_epoch", "end_epoch"):  # a NumPy int as Python's
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))

    @classmethod
    def of(cls, span: RankSpan | None = None, **keywords: Any) -> RankSpan:
        """``span``, or the same fields given as keywords (``EpochSource(pipe, rank=…)``) made into one;
        both at once is refused."""
        return one_value(cls, span, keywords, name="span", what="rank keywords")
