"""The per-sample transforms the pipeline calls: bytes + generator -> HxWx3 uint8 RGB.

``TrainTransform`` follows timm's ``transforms_imagenet_train`` order (RandomResizedCrop, flips,
auto-augment or colour jitter, grayscale, blur) and ``EvalTransform`` its ``transforms_imagenet_eval``.
Normalisation and random erasing are left to the device. Every random draw comes from the ``rng``
argument (see :func:`sample_rng`), so a sample's augmentation does not depend on which worker runs it.

Transforms are plain picklable objects. With ``auto_augment`` set they seed Python's ``random`` and
NumPy's global generator per call (timm's policies use them), so they are not thread-safe.
"""

from __future__ import annotations

import numpy as np

from raypipe.config import DecodeConfig, EvalAugment, TrainAugment
from raypipe.kernels import autoaug, color
from raypipe.kernels.decode import DecodeBuffer, decode_for_crop, open_image
from raypipe.kernels.geometry import crop_resize, eval_geometry, resize_window, rrc_params

__all__ = ["TrainTransform", "EvalTransform", "build_transform", "sample_rng"]

_INTERPS = ("bilinear", "bicubic")


def sample_rng(seed: int, epoch: int, sample_id: int) -> np.random.Generator:
    """The generator for one sample in one epoch: independent of worker, node and retry."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), int(sample_id)]))


def _result(img: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return np.ascontiguousarray(img)
    if img is not out:
        out[...] = img
    return out


class TrainTransform:
    """timm's training transform on encoded bytes; see the module docstring."""

    def __init__(self, aug: TrainAugment, decode: DecodeConfig | None = None) -> None:
        self.aug = aug
        self.decode = decode or DecodeConfig()
        self._aa = None
        self._setup()

    def _setup(self) -> None:
        self._buffer = DecodeBuffer()  # per transform object; not pickled
        a = self.aug
        if a.auto_augment:
            self._aa = autoaug.build_auto_augment(a.auto_augment, a.input_size, a.mean, a.interpolation)
        self._jitter = a.color_jitter if autoaug.jitter_enabled(a.auto_augment) else None
        if self._jitter is not None and not any(self._jitter):
            self._jitter = None  # all-zero factors: ColorJitter is the identity

    def __getstate__(self) -> dict:
        return {"aug": self.aug, "decode": self.decode}

    def __setstate__(self, state: dict) -> None:
        self.aug, self.decode, self._aa = state["aug"], state["decode"], None
        self._setup()

    def __call__(self, data: bytes, rng: np.random.Generator, out: np.ndarray | None = None) -> np.ndarray:
        a = self.aug
        src = open_image(data, self.decode.max_pixels)
        width, height = src.size
        # 1. draw every parameter (timm's order), 2. decode as small as the crop allows, 3. apply.
        top, left, h, w = rrc_params(width, height, a.scale, a.ratio, rng)
        interp = a.interpolation if a.interpolation != "random" else _INTERPS[int(rng.integers(2))]
        hflip = a.hflip > 0 and rng.random() < a.hflip
        vflip = a.vflip > 0 and rng.random() < a.vflip
        aa_seed = int(rng.integers(2**63)) if self._aa is not None else None
        jitter = None
        if self._jitter is not None and (a.color_jitter_prob is None or rng.random() < a.color_jitter_prob):
            jitter = color.jitter_params(self._jitter, rng)
        gray = a.grayscale_prob > 0 and rng.random() < a.grayscale_prob
        blur = a.gaussian_blur_prob > 0 and rng.random() < a.gaussian_blur_prob
        sigma = color.blur_sigma(rng) if blur else None

        box = (float(left), float(top), float(left + w), float(top + h))
        pixels, box = decode_for_crop(src, box, a.input_size, self.decode.dct_for(True), self._buffer)
        post = aa_seed is not None or jitter is not None or gray or sigma is not None
        direct = None if post else out
        img = crop_resize(pixels, box, a.input_size, interp, hflip=hflip, vflip=vflip, out=direct)
        if aa_seed is not None:
            img = autoaug.apply_auto_augment(self._aa, img, aa_seed)
        if jitter is not None:
            img = color.apply_jitter(img, jitter)
        if gray:
            img = color.to_grayscale(img)
        if sigma is not None:
            img = color.gaussian_blur(img, sigma)
        return _result(img, out)


class EvalTransform:
    """timm's eval transform (resize by ``crop_pct``, then centre crop / squash / border) on bytes.

    By default (``DecodeConfig.dct_scaling=None``) JPEGs are decoded full size, so the output is timm's
    ``transforms_imagenet_eval`` byte for byte; ``dct_scaling=True`` trades that for a faster decode.
    """

    def __init__(self, aug: EvalAugment, decode: DecodeConfig | None = None, mean=None) -> None:
        from raypipe.config import IMAGENET_MEAN

        self.aug = aug
        self.decode = decode or DecodeConfig()
        self.mean = tuple(mean) if mean is not None else IMAGENET_MEAN  # border fill, as timm

    def __call__(self, data: bytes, rng: np.random.Generator | None = None, out: np.ndarray | None = None):
        a = self.aug
        oh, ow = a.input_size
        src = open_image(data, self.decode.max_pixels)
        width, height = src.size
        g = eval_geometry(width, height, a.input_size, a.crop_pct, a.crop_mode, self.mean)
        pixels, box = decode_for_crop(src, g.box, (g.h, g.w), self.decode.dct_for(False))
        if out is None:
            out = np.empty((oh, ow, 3), np.uint8)
        if g.fill is not None:
            out[...] = np.asarray(g.fill, np.uint8)
        region = out[g.top : g.top + g.h, g.left : g.left + g.w]
        full_size = pixels.shape[:2] == (height, width)  # not DCT-scaled: timm's own resize + crop exactly
        if not (full_size and resize_window(pixels, g.resized, g.start, region, a.interpolation)):
            crop_resize(pixels, box, (g.h, g.w), a.interpolation, out=region)
        return out


def build_transform(aug: TrainAugment | EvalAugment, decode: DecodeConfig | None = None):
    """The transform object for ``aug`` (picklable; call it as ``t(data, rng, out=None)``)."""
    if isinstance(aug, TrainAugment):
        return TrainTransform(aug, decode)
    if isinstance(aug, EvalAugment):
        return EvalTransform(aug, decode)
    raise TypeError(f"aug: expected TrainAugment or EvalAugment, got {type(aug).__name__}")
