"""raypipe: Ray-distributed image preprocessing for PyTorch training."""

from raypipe.config import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    DecodeConfig,
    EvalAugment,
    PipelineConfig,
    TrainAugment,
    load_yaml,
)
from raypipe.device import DeviceLoader
from raypipe.pipeline import EpochReport, EpochRun, EpochSource, Pipeline, SkipLimitError
from raypipe.sources import SourceRows, open_source

__version__ = "0.1.0"

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DecodeConfig",
    "DeviceLoader",
    "EpochReport",
    "EpochRun",
    "EpochSource",
    "Pipeline",
    "SkipLimitError",
    "SourceRows",
    "open_source",
    "EvalAugment",
    "PipelineConfig",
    "TrainAugment",
    "load_yaml",
]
