"""Pure resource arithmetic that the budget and the workers share: Ray's fixed-point steps and whether a
node can hold a request."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["RESOURCE_STEPS", "offers", "in_steps"]

# Ray keeps resource amounts in fixed point, this many steps to a unit: a task's request is rounded down
# to a step, so that n tasks of a share never ask for more than the share.
RESOURCE_STEPS = 10_000


def in_steps(amount: float) -> float:
    """``amount`` rounded down to Ray's step, at least one step."""
    return max(1, math.floor(amount * RESOURCE_STEPS + 1e-6)) / RESOURCE_STEPS


def offers(have: Mapping[str, float], resources: Mapping[str, float]) -> bool:
    """Whether a node with ``have`` (``ray.nodes()``' ``Resources``) can hold a task asking for
    ``resources``."""
    return all(have.get(name, 0.0) >= amount for name, amount in resources.items())
