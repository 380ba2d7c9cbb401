"""timm's AutoAugment / RandAugment / AugMix, reused as they are (on PIL images), seeded from our generator.

timm's policies draw from Python's ``random`` and NumPy's global generator. Right before each call we
seed both from the sample's generator, so the result depends only on (seed, epoch, sample_id). That
makes a transform using them **not thread-safe** (one transform per process, as Ray workers run them).
"""

from __future__ import annotations

import random

import numpy as np
from PIL import Image, ImageOps

__all__ = ["aa_hparams", "build_auto_augment", "apply_auto_augment", "jitter_enabled"]


def aa_hparams(input_size: tuple[int, int], mean: tuple[float, ...], interpolation: str) -> dict:
    """The hparams timm's ``transforms_imagenet_train`` passes to its policies."""
    from timm.data.transforms import str_to_pil_interp  # timm (and torch) only when a policy is used

    hp = dict(
        translate_const=int(min(input_size) * 0.45),
        img_mean=tuple(min(255, round(255 * x)) for x in mean),
    )
    if interpolation and interpolation != "random":
        hp["interpolation"] = str_to_pil_interp(interpolation)
    return hp


def build_auto_augment(policy: str, input_size: tuple[int, int], mean: tuple[float, ...], interpolation: str):
    """timm's policy object for ``policy`` (``rand-…``, ``augmix-…``, or an AutoAugment name)."""
    from timm.data.auto_augment import augment_and_mix_transform, auto_augment_transform, rand_augment_transform

    hp = aa_hparams(input_size, mean, interpolation)
    if policy.startswith("rand"):
        op = rand_augment_transform(policy, hp)
    elif policy.startswith("augmix"):
        hp["translate_pct"] = 0.3
        op = augment_and_mix_transform(policy, hp)
    else:
        op = auto_augment_transform(policy, hp)
    _patch_posterize(op)
    return op


def _posterize(img: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's posterize, safe for 0 bits: timm's 'increasing' levels ask for 0 bits at magnitude 10
    (reachable with ``mstd``), which Pillow >= 12 refuses; older Pillow gave a black image, as here."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep < 1:
        return Image.new(img.mode, img.size)
    return ImageOps.posterize(img, bits_to_keep)


def _patch_posterize(op) -> None:
    ops = list(getattr(op, "ops", []))
    for sub in getattr(op, "policy", []):
        ops.extend(sub)
    for o in ops:
        if getattr(o, "name", "").startswith("Posterize"):
            o.aug_fn = _posterize


def jitter_enabled(policy: str | None) -> bool:
    """timm disables colour jitter under auto-augment, except for the '3a' policies."""
    return policy is None or "3a" in policy


def apply_auto_augment(op, img: np.ndarray, seed: int) -> np.ndarray:
    """Run timm's ``op`` on an RGB uint8 array with ``random`` and NumPy's global RNG seeded by ``seed``."""
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    out = op(Image.fromarray(img, "RGB"))
    return np.asarray(out.convert("RGB") if out.mode != "RGB" else out)
