"""raypipe: Ray-distributed image preprocessing for PyTorch training.

Names are imported lazily (PEP 562): a Ray worker that only runs the augmentation stage imports
``raypipe.stages`` without pulling in torch or Ray Train through this package's top level.
"""

from __future__ import annotations

from raypipe._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "Config": "raypipe.config",
    "IMAGENET_MEAN": "raypipe.config",
    "IMAGENET_STD": "raypipe.config",
    "DecodeConfig": "raypipe.config",
    "ExecutionConfig": "raypipe.config",
    "EvalAugment": "raypipe.config",
    "PipelineConfig": "raypipe.config",
    "TrainAugment": "raypipe.config",
    "load_config": "raypipe.config",
    "load_yaml": "raypipe.config",
    "DeviceLoader": "raypipe.device",
    "from_timm_args": "raypipe.device",
    "connect": "raypipe.runtime",
    "EpochReport": "raypipe.pipeline",
    "EpochRun": "raypipe.pipeline",
    "EpochSource": "raypipe.pipeline",
    "FeederSource": "raypipe.pipeline",
    "StateMismatchError": "raypipe.pipeline",
    "Pipeline": "raypipe.pipeline",
    "RankSpan": "raypipe.plan",
    "RankLoader": "raypipe.integrations",
    "RayDataAugment": "raypipe.integrations.ray_data",
    "RaypipeIterableDataset": "raypipe.integrations",
    "SkipLimitError": "raypipe.pipeline",
    "FieldTransformError": "raypipe.stages.field_values",
    "ListingOptions": "raypipe.sources",
    "Mixture": "raypipe.sources.mixture",
    "SourceRows": "raypipe.sources",
    "open_source": "raypipe.sources",
    "ray_loader": "raypipe.integrations",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("raypipe", _EXPORTS, globals())
