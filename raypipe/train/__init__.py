"""The training job: timm-style flags, a Ray Train ``TorchTrainer``, exactly-once epochs across ranks.

Names are imported lazily (PEP 562): ``jobs/train.py`` parses its flags (``raypipe.train.args``) before
Ray is imported, since what ``-v`` shows is decided by settings Ray reads at import.
"""

from raypipe._lazy import lazy_exports

_EXPORTS = {
    "TrainJobConfig": "raypipe.train.args",
    "build_parser": "raypipe.train.args",
    "parse_job": "raypipe.train.args",
    "ray_loader": "raypipe.integrations.ray_train",
    "run_training": "raypipe.train.run",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("raypipe.train", _EXPORTS, globals())
