"""Trainer-side device loading: pinned ring, side-stream copies, normalise, random erasing, mixup.

``DeviceLoader`` composes ``Normalize``, ``RandomErasing`` and ``Mixup`` (timm's names, each usable on
its own); ``from_timm_args`` builds all of it from timm's flat argument names. The factory sits above
the class it builds (``factory`` imports ``loader``, never the reverse), as timm's ``create_*``
functions do.
"""

from raypipe.device.erasing import RandomErasing
from raypipe.device.factory import from_timm_args
from raypipe.device.loader import DeviceLoader, LoaderStats
from raypipe.device.mixup import Mixup, mixup_target
from raypipe.device.normalize import Normalize, normalize

__all__ = [
    "DeviceLoader",
    "LoaderStats",
    "Mixup",
    "Normalize",
    "RandomErasing",
    "from_timm_args",
    "mixup_target",
    "normalize",
]
