"""Loaders of other projects that ``raypipe bench`` runs beside raypipe's: NVIDIA DALI's CPU pipeline
(``dali``) and SPDL (``spdl``), each in a module of its own that imports its library only when its row
runs. ``unavailable(key, aug)`` says, without importing the library, why a row cannot run here: the
library or its system libraries are missing (with the command that installs them), or the suite asks
for augmentation beyond the work the peers do (RandomResizedCrop, flip, resize, normalise).
"""

from __future__ import annotations

import ctypes.util
import importlib
import importlib.util
from dataclasses import dataclass

from raypipe.benchmark.measure import Result
from raypipe.config import TrainAugment

__all__ = ["Peer", "PEERS", "missing", "unavailable", "unsupported", "skipped_row", "load_library", "run_peer"]

# FFmpeg's shared libraries as Debian 12 names them; SPDL loads FFmpeg 4 to 8 (libavutil 56 to 60)
FFMPEG_APT = (
    "apt-get install -y libavutil57 libavcodec59 libavformat59 libavfilter8 libswscale6 libswresample4 libavdevice59"
)


@dataclass(frozen=True)
class Peer:
    key: str  # the row's name for --only
    label: str  # the row's name in the table
    module: str  # the library's import name
    install: str  # the command that installs it
    libraries: tuple[str, ...] = ()  # shared libraries it loads from the system (ldconfig names)
    system_install: str = ""  # the command that installs those


PEERS = {
    "dali": Peer(
        "dali",
        "DALI (CPU)",
        "nvidia.dali",
        "pip install nvidia-dali-cuda120 (raypipe's extra: pip install -e '.[peers]')",
    ),
    "spdl": Peer(
        "spdl",
        "SPDL",
        "spdl.io",
        "pip install spdl (raypipe's extra: pip install -e '.[peers]')",
        libraries=("avutil", "avcodec", "avformat", "avfilter", "swscale", "swresample", "avdevice"),
        system_install=FFMPEG_APT,
    ),
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # its parent package is missing, or a None entry in sys.modules
        return False


def unsupported(aug: TrainAugment) -> str | None:
    """Why the peers cannot do this augmentation's work, or None: they crop, flip, resize and normalise."""
    extra = [
        name
        for name, on in (
            ("auto-augment " + str(aug.auto_augment), aug.auto_augment is not None),
            ("colour jitter", aug.color_jitter not in (None, 0, 0.0)),
            ("grayscale", aug.grayscale_prob > 0),
            ("blur", aug.gaussian_blur_prob > 0),
            ("vertical flip", aug.vflip > 0),
            (f"{aug.interpolation} interpolation", aug.interpolation not in ("bilinear", "bicubic")),
        )
        if on
    ]
    return None if not extra else f"RandomResizedCrop + flip only; this suite adds {', '.join(extra)}"


def missing(key: str) -> str | None:
    """Where ``key``'s library or the system libraries it loads are missing here: "not installed: <the
    command that installs them>"; else None."""
    peer = PEERS[key]
    absent = [f"lib{name}" for name in peer.libraries if ctypes.util.find_library(name) is None]
    libraries = f"FFmpeg's shared libraries ({', '.join(absent)}): {peer.system_install}"
    if not _importable(peer.module):
        return f"not installed: {peer.install}" + (f"; it also needs {libraries}" if absent else "")
    return f"not installed: {libraries}" if absent else None


def unavailable(key: str, aug: TrainAugment) -> str | None:
    """Why ``key``'s row cannot run here with ``aug`` ("not installed: …", "not run: …"), or None."""
    why = missing(key)
    if why is None and (extra := unsupported(aug)) is not None:
        why = f"not run: {extra}"
    return why


def skipped_row(key: str, why: str) -> Result:
    return Result(PEERS[key].label, 0.0, 0.0, skipped=why)


def load_library(key: str) -> None:
    """Import ``key``'s library (and load what it loads lazily), so that its row's clock leaves it out."""
    importlib.import_module(f"raypipe.benchmark.peers.{key}").load_library()


def run_peer(
    key: str, folder: str, aug: TrainAugment, *, batch_size: int, epochs: int, started: float | None = None
) -> Result:
    """``key``'s row: its loader on the image folder ``folder``, one thread per core."""
    module = importlib.import_module(f"raypipe.benchmark.peers.{key}")
    return module.run(folder, aug, batch_size=batch_size, epochs=epochs, started=started)
