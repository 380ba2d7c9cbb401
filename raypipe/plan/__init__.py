"""The plan: each epoch's order of a dataset's rows, a rank's slice of it and span of the run, and a
rank's position.

Pure data (NumPy and JSON): nothing here imports Ray, the workers or the pipeline, so the same order
and positions are computed wherever a rank runs.
"""

from __future__ import annotations

from raypipe._lazy import lazy_exports

_EXPORTS = {
    "RankPlan": "raypipe.plan.order",
    "epoch_order": "raypipe.plan.order",
    "rank_slice": "raypipe.plan.order",
    "StateMismatchError": "raypipe.plan.position",
    "ListingMismatchError": "raypipe.plan.same_listing",
    "check_same_listing": "raypipe.plan.same_listing",
    "RankSpan": "raypipe.plan.span",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("raypipe.plan", _EXPORTS, globals())
