"""The pipeline: a rank's plan run as chunks on its workers, packed into exact batches, accounted for.

Names are imported lazily (PEP 562): importing the package imports neither Ray nor torch. The plan's
names (``RankPlan``, ``epoch_order``, ``StateMismatchError``) are ``raypipe.plan``'s, kept here too.
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
    "RankPlan": "raypipe.plan.order",
    "epoch_order": "raypipe.plan.order",
    "BatchSpec": "raypipe.pipeline.pack",
    "Packer": "raypipe.pipeline.pack",
    "EpochRun": "raypipe.pipeline.epoch_source",
    "EpochSource": "raypipe.pipeline.epoch_source",
    "Pipeline": "raypipe.pipeline.pipeline",
    "StateMismatchError": "raypipe.plan.position",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("raypipe.pipeline", _EXPORTS, globals())
