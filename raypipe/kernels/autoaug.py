"""timm's AutoAugment / RandAugment / AugMix, reused as they are, seeded from our generator.

timm's policies draw from Python's ``random`` and NumPy's global generator. Right before each call we
seed both from the sample's generator, so the result depends only on (seed, epoch, sample_id). That
makes a transform using them **not thread-safe** (one transform per process, as Ray workers run them).

RandAugment and AutoAugment policies whose ops all have array versions (timm's standard ops; see
:mod:`raypipe.kernels.aa_arrays`) run on the array itself: timm's policy object draws as always, the
colour ops are Pillow's arithmetic in the ``_colorops`` extension and the geometric ops timm's own
functions on an array image, so the bytes are timm's on Pillow without a single PIL image (a rand-m9
policy about 2.4x faster per 224 px image, ``bench/profiles.py autoaug``). Other policies (AugMix,
custom ops) and builds without ``_colorops`` run on plain PIL images with Pillow's own ops.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import random
import sys

import numpy as np
from PIL import Image, ImageOps

from raypipe.kernels import aa_arrays

logger = logging.getLogger(__name__)

__all__ = ["aa_hparams", "build_auto_augment", "apply_auto_augment", "jitter_enabled", "patch_posterize"]


# timm.data.transforms' str_to_pil_interp, which imports torch to offer it
_PIL_INTERP = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
    "lanczos": Image.Resampling.LANCZOS,
}


def aa_hparams(input_size: tuple[int, int], mean: tuple[float, ...], interpolation: str) -> dict:
    """The hparams timm's ``transforms_imagenet_train`` passes to its policies."""
    hp = dict(
        translate_const=int(min(input_size) * 0.45),
        img_mean=tuple(min(255, round(255 * x)) for x in mean),
    )
    if interpolation and interpolation != "random":
        hp["interpolation"] = _PIL_INTERP[interpolation]
    return hp


@functools.cache
def timm_auto_augment():
    """timm's ``timm.data.auto_augment`` module, without importing the ``timm`` package if it is not yet.

    The module itself needs only Pillow and NumPy, but importing it through its package imports timm's
    models and torch: seconds of CPU and hundreds of MB per augmentation worker (``python
    bench/profiles.py aa-import``), for code the stage never runs. So
    it is loaded from its file as a module of its own (the same code, so the same behaviour); if timm is
    already imported, or the file stops being loadable alone, the package's module is used.
    """
    loaded = sys.modules.get("timm.data.auto_augment")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("timm")  # locates the package without running it
    path = os.path.join(spec.submodule_search_locations[0], "data", "auto_augment.py") if spec else ""
    if os.path.isfile(path):
        alone = importlib.util.spec_from_file_location("raypipe._timm_auto_augment", path)
        module = importlib.util.module_from_spec(alone)
        try:
            alone.loader.exec_module(module)
            return module
        except Exception:  # noqa: BLE001 - e.g. it imports other parts of timm now: use the package
            pass
    return importlib.import_module("timm.data.auto_augment")


def build_auto_augment(policy: str, input_size: tuple[int, int], mean: tuple[float, ...], interpolation: str):
    """timm's policy object for ``policy`` (``rand-…``, ``augmix-…``, or an AutoAugment name), its ops
    taking array images too (see the module docstring)."""
    op = timm_policy(policy, input_size, mean, interpolation)
    _patch_ops(op, timm_auto_augment())
    return op


def timm_policy(policy: str, input_size: tuple[int, int], mean: tuple[float, ...], interpolation: str):
    """timm's policy object as ``transforms_imagenet_train`` builds it, on PIL images only (its posterize
    made safe for 0 bits): what ``build_auto_augment``'s images must equal."""
    timm_aa = timm_auto_augment()
    hp = aa_hparams(input_size, mean, interpolation)
    if policy.startswith("rand"):
        op = timm_aa.rand_augment_transform(policy, hp)
    elif policy.startswith("augmix"):
        hp["translate_pct"] = 0.3
        op = timm_aa.augment_and_mix_transform(policy, hp)
    else:
        op = timm_aa.auto_augment_transform(policy, hp)
    patch_posterize(op)
    return op


def _posterize(img: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's posterize, safe for 0 bits: timm's 'increasing' levels ask for 0 bits at magnitude 10
    (reachable with ``mstd``), which Pillow >= 12 refuses; older Pillow gave a black image, as here."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep < 1:
        return Image.new(img.mode, img.size)
    return ImageOps.posterize(img, bits_to_keep)


def _ops(op) -> list:
    """Every AugmentOp of a RandAugment / AugMix (``ops``) or AutoAugment (``policy``: lists of ops)."""
    ops = list(getattr(op, "ops", []))
    for sub in getattr(op, "policy", []):
        ops.extend(sub)
    return ops


def patch_posterize(op) -> None:
    for o in _ops(op):
        if getattr(o, "name", "").startswith("Posterize"):
            o.aug_fn = _posterize


def jitter_enabled(policy: str | None) -> bool:
    """timm disables colour jitter under auto-augment, except for the '3a' policies."""
    return policy is None or "3a" in policy


def apply_auto_augment(op, img: np.ndarray, seed: int) -> np.ndarray:
    """Run timm's ``op`` on an RGB uint8 array with ``random`` and NumPy's global RNG seeded by ``seed``."""
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    if getattr(op, "_raypipe_arrays", False):
        try:
            return op(aa_arrays.ArrayImage(np.ascontiguousarray(img))).array
        except AttributeError as e:  # a newer timm/Pillow reached past ArrayImage's interface
            op._raypipe_arrays = False
            logger.warning("auto-augment ops fall back to PIL images (%s): same images, slower", e)
            random.seed(seed)
            np.random.seed(seed & 0xFFFFFFFF)
    out = op(Image.fromarray(img, "RGB"))
    return np.asarray(out.convert("RGB") if out.mode != "RGB" else out)


def _patch_ops(op, timm_aa) -> None:
    """Give every op of ``op`` (RandAugment, AutoAugment, AugMix) a function that takes both image kinds:
    an ``ArrayImage`` goes to the op's array version, a PIL image to timm's function.
    ``op._raypipe_arrays`` says whether the whole policy can run on arrays."""
    table = aa_arrays.array_ops(timm_aa, _posterize) if aa_arrays.available() else {}
    ready = type(op) in (getattr(timm_aa, "RandAugment", None), getattr(timm_aa, "AutoAugment", None))
    for o in _ops(op):
        fn = getattr(o, "aug_fn", None)
        if fn is None or getattr(fn, "_raypipe_dual", False):
            ready = False
            continue
        array_fn = table.get(fn)
        ready = ready and array_fn is not None
        o.aug_fn = _dual(fn, array_fn)
    op._raypipe_arrays = ready and bool(_ops(op))


def _dual(fn, array_fn):
    @functools.wraps(fn)
    def run(img, *args, **kwargs):
        if isinstance(img, aa_arrays.ArrayImage):
            return array_fn(img, *args, **kwargs)
        return fn(img, *args, **kwargs)

    run._raypipe_dual = True
    return run
