"""The execution layer: a rank's epoch order, its chunks run as Ray tasks, exact packing, accounting.

Names are imported lazily (PEP 562): the epoch order (``raypipe.pipeline.order``) is plain NumPy, and
importing it must not import Ray.
"""

from __future__ import annotations

from raypipe._lazy import lazy_exports

_EXPORTS = {
    "EpochReport": "raypipe.pipeline.accounting",
    "SkipLimitError": "raypipe.pipeline.accounting",
    "RankBudget": "raypipe.pipeline.budget",
    "rank_budget": "raypipe.pipeline.budget",
    "FeederDiedError": "raypipe.pipeline.feeder",
    "FeederSource": "raypipe.pipeline.feeder",
    "RankPlan": "raypipe.pipeline.order",
    "epoch_order": "raypipe.pipeline.order",
    "BatchSpec": "raypipe.pipeline.pack",
    "Packer": "raypipe.pipeline.pack",
    "EpochRun": "raypipe.pipeline.pipeline",
    "EpochSource": "raypipe.pipeline.pipeline",
    "Pipeline": "raypipe.pipeline.pipeline",
    "StateMismatchError": "raypipe.pipeline.position",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("raypipe.pipeline", _EXPORTS, globals())
