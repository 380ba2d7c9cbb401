"""The execution layer: a rank's epoch order, its chunks run as Ray tasks, exact packing, accounting."""

from raypipe.pipeline.accounting import EpochReport, SkipLimitError
from raypipe.pipeline.budget import RankBudget, rank_budget
from raypipe.pipeline.feeder import FeederDiedError, FeederSource
from raypipe.pipeline.order import RankPlan, epoch_order
from raypipe.pipeline.pack import BatchSpec, Packer
from raypipe.pipeline.pipeline import EpochRun, EpochSource, Pipeline

__all__ = [
    "BatchSpec",
    "EpochReport",
    "EpochRun",
    "EpochSource",
    "FeederDiedError",
    "FeederSource",
    "Packer",
    "Pipeline",
    "RankBudget",
    "RankPlan",
    "SkipLimitError",
    "epoch_order",
    "rank_budget",
]
