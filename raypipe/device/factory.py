"""Build a ``DeviceLoader`` and its parts from timm's flat argument names.

timm spreads the device side over ``create_loader`` / ``PrefetchLoader`` (``img_dtype``, ``mean``,
``std``, ``re_prob``, ``re_mode``, ``re_count``, ``re_num_splits``) and ``train.py``'s ``Mixup``
arguments (``--mixup``, ``--cutmix``, ``--cutmix-minmax``, ``--mixup-prob``, ``--mixup-switch-prob``,
``--mixup-mode``, ``--smoothing``). :func:`from_timm_args` takes those names and makes the objects the
loader composes; an invalid value raises ``ValueError`` naming the keyword given here.

Mixup is built when timm's ``train.py`` would build it (``mixup_alpha > 0``, ``cutmix_alpha > 0`` or
``cutmix_minmax``); otherwise labels stay int64 class indices and ``label_smoothing`` is left to the
loss (timm's ``LabelSmoothingCrossEntropy``), exactly as in timm.

:func:`from_timm_args` is the one factory and sits above the class it builds, as timm's ``create_*``
functions do: this module imports ``DeviceLoader``, which knows nothing of it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from raypipe._values import check_prob
from raypipe.config import IMAGENET_MEAN, IMAGENET_STD
from raypipe.device.erasing import RandomErasing
from raypipe.device.loader import DeviceLoader
from raypipe.device.mixup import MIX_MODES, Mixup
from raypipe.device.normalize import Normalize

__all__ = ["from_timm_args"]


def _build(cls: type, names: dict[str, str], **fields: Any) -> Any:
    """``cls(**fields)``, with a ValueError naming the field renamed to the factory's keyword."""
    try:
        return cls(**fields)
    except ValueError as exc:
        match = re.match(r"(\w+)=", str(exc))
        if match and match.group(1) in names:
            raise ValueError(names[match.group(1)] + str(exc)[len(match.group(1)) :]) from None
        raise


def from_timm_args(
    source: Iterable,
    *,
    device: str | torch.device = "cpu",
    img_dtype: str | torch.dtype | None = None,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    channels_last: bool = True,
    re_prob: float | None = 0.0,
    re_mode: str = "const",
    re_count: int = 1,
    re_min_area: float = 0.02,
    re_max_area: float = 1 / 3,
    re_min_aspect: float = 0.3,
    re_max_aspect: float | None = None,
    re_num_splits: int = 0,
    mixup_alpha: float = 0.0,
    cutmix_alpha: float = 0.0,
    cutmix_minmax: Sequence[float] | None = None,
    mixup_prob: float | None = 1.0,
    mixup_switch_prob: float | None = 0.5,
    mixup_mode: str = "batch",
    correct_lam: bool = True,
    label_smoothing: float | None = 0.0,
    num_classes: int | None = None,
    layout: str = "auto",
    prefetch: int = 2,
    pin_memory: bool = True,
    seed: int = 0,
    rank: int | None = None,
    close_timeout_s: float = 30.0,
) -> DeviceLoader:
    """A ``DeviceLoader`` over ``source`` configured by timm's argument names (see the module doc).

    Args:
        source: the packed host batches, as ``DeviceLoader`` takes them.
        device, prefetch, pin_memory, layout, seed, rank, close_timeout_s: ``DeviceLoader``'s.
        img_dtype, mean, std, channels_last: ``Normalize``'s; ``img_dtype`` None: float32 on CPU,
            float16 on CUDA.
        re_*: timm's random erasing (``RandomErasing``); ``re_count`` is its ``max_count`` (boxes per
            erased image uniform in 1..re_count).
        mixup_alpha, cutmix_alpha, cutmix_minmax, mixup_prob, mixup_switch_prob, mixup_mode, correct_lam,
            label_smoothing, num_classes: timm's ``Mixup``, built only when it would be. ``None`` for a
            probability means timm's default.

    Returns:
        The ``DeviceLoader`` (close it, or use it as a context manager).

    Raises:
        ValueError: an invalid value, naming the keyword given here (``device``: not ``cpu`` or
            ``cuda[:n]``, or CUDA unavailable).

    >>> loader = from_timm_args([], re_prob=0.25, mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=10)
    >>> type(loader.erasing).__name__, loader.mixup.prob, loader.mixup_enabled
    ('RandomErasing', 1.0, True)
    >>> loader.close()
    """
    normalize = _build(
        Normalize, {"dtype": "img_dtype"}, mean=mean, std=std, dtype=img_dtype, channels_last=channels_last
    )
    erasing = _build(
        RandomErasing,
        {
            "probability": "re_prob",
            "mode": "re_mode",
            "max_count": "re_count",
            "min_area": "re_min_area",
            "max_area": "re_max_area",
            "min_aspect": "re_min_aspect",
            "max_aspect": "re_max_aspect",
            "num_splits": "re_num_splits",
        },
        probability=re_prob,
        mode=re_mode,
        max_count=re_count,
        min_area=re_min_area,
        max_area=re_max_area,
        min_aspect=re_min_aspect,
        max_aspect=re_max_aspect,
        num_splits=re_num_splits,
    )
    if label_smoothing is not None:
        check_prob("label_smoothing", label_smoothing)
    mixup = None
    if _positive(mixup_alpha) or _positive(cutmix_alpha) or cutmix_minmax is not None:
        mixup = _build(
            Mixup,
            {"prob": "mixup_prob", "switch_prob": "mixup_switch_prob", "mode": "mixup_mode"},
            mixup_alpha=mixup_alpha,
            cutmix_alpha=cutmix_alpha,
            cutmix_minmax=cutmix_minmax,
            prob=mixup_prob,
            switch_prob=mixup_switch_prob,
            mode=mixup_mode,
            correct_lam=correct_lam,
            label_smoothing=label_smoothing,
            num_classes=num_classes,
        )
    else:  # still validated, so a typo does not wait for the day mixup is switched on
        for name, value in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value != 0:
                raise ValueError(f"{name}={value!r}: expected a finite number >= 0")
        for name, value in (("mixup_prob", mixup_prob), ("mixup_switch_prob", mixup_switch_prob)):
            if value is not None:
                check_prob(name, value)
        if mixup_mode not in MIX_MODES:
            raise ValueError(f"mixup_mode={mixup_mode!r}: expected one of {MIX_MODES}")
    return DeviceLoader(
        source,
        device=device,
        normalize=normalize,
        erasing=erasing,
        mixup=mixup,
        prefetch=prefetch,
        pin_memory=pin_memory,
        layout=layout,
        seed=seed,
        rank=rank,
        close_timeout_s=close_timeout_s,
    )


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
