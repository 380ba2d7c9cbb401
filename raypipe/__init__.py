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

__version__ = "0.1.0"

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DecodeConfig",
    "EvalAugment",
    "PipelineConfig",
    "TrainAugment",
    "load_yaml",
]
