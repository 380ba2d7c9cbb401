"""Imported by ``raypipe.integrations`` before anything there imports Ray. The one thing raypipe sets
on import, and only in one case: a torchrun rank other than its node's local rank 0, with neither
``RAY_ADDRESS`` nor ``RAY_AUTH_MODE`` set and Ray not imported yet, gets ``RAY_AUTH_MODE=token``.

Why: that rank will join the Ray its node's local rank 0 starts (``node_ray.connect_node``), which
has token authentication on (Ray's default for a new local cluster; the token is in the user's
``~/.ray``). Ray reads the mode once, when it is imported, so the joining process must have it in its
environment by then; set later, the join fails as unauthenticated. When Ray was imported first,
nothing is set here and ``connect_node`` says how to launch instead (``RAY_AUTH_MODE=token torchrun …``).
"""

from __future__ import annotations

import os
import sys


def _joins_local_rank_zero() -> bool:
    env = os.environ
    local_rank = env.get("LOCAL_RANK")
    return local_rank not in (None, "0") and not env.get("RAY_ADDRESS") and "RAY_AUTH_MODE" not in env


if "ray" not in sys.modules and _joins_local_rank_zero():
    os.environ["RAY_AUTH_MODE"] = "token"
