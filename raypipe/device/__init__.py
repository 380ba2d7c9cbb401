"""Trainer-side device loading: pinned ring, side-stream copies, normalise, random erasing, mixup.

``DeviceLoader`` is the entry point; the pure functions below it are usable on their own.
"""

from raypipe.device.erasing import Erasing, random_erase_
from raypipe.device.loader import DeviceLoader, LoaderStats
from raypipe.device.mixup import Mixing, mixup_batch, mixup_target
from raypipe.device.normalize import normalize

__all__ = [
    "DeviceLoader",
    "Erasing",
    "LoaderStats",
    "Mixing",
    "mixup_batch",
    "mixup_target",
    "normalize",
    "random_erase_",
]
