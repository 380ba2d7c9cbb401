"""The execution layer: a rank's epoch order, its chunks run as Ray tasks, exact packing, accounting.

Names are imported lazily (PEP 562): the epoch order (``raypipe.pipeline.order``) is plain NumPy, and
importing it must not import Ray.
"""

from __future__ import annotations

import importlib

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
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raypipe.pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
