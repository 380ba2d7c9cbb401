"""The Ray Data pipeline: sharding, augmentation on the cluster, exact packing, accounting."""

from raypipe.pipeline.accounting import EpochReport, SkipLimitError
from raypipe.pipeline.feeder import FeederDiedError, FeederSource
from raypipe.pipeline.pack import BatchSpec, Packer
from raypipe.pipeline.pipeline import EpochRun, EpochSource, Pipeline, shard_indices

__all__ = [
    "BatchSpec",
    "EpochReport",
    "EpochRun",
    "EpochSource",
    "FeederDiedError",
    "FeederSource",
    "Packer",
    "Pipeline",
    "SkipLimitError",
    "shard_indices",
]
