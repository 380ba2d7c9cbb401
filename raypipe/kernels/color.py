"""Colour ops on HxWx3 uint8 RGB arrays: torchvision's ColorJitter / RandomGrayscale / GaussianBlur
(as timm's train transform uses them), drawn from our generator.

torchvision runs them on PIL images: brightness, contrast and saturation are Pillow's ``ImageEnhance``
blends, the grey image is ``convert("L")``. With the ``_colorops`` extension built those are Pillow's
own arithmetic (the auto-augment ops' blends and luma, :mod:`raypipe.kernels.aa_arrays`): the same
bytes as torchvision. Without it Pillow's ``ImageEnhance`` runs them: the same bytes again, so a node
without the extension gives the same samples. The hue shift and the blur are OpenCV's on every node
(within 1–2 levels of torchvision; the hue shift wraps a uint8 HSV hue); the tests measure both.
"""

from __future__ import annotations

from typing import NamedTuple

import cv2
import numpy as np
from PIL import Image, ImageEnhance

from raypipe.kernels import aa_arrays

__all__ = [
    "JitterParams",
    "jitter_params",
    "apply_jitter",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_saturation",
    "adjust_hue",
    "to_grayscale",
    "gaussian_blur",
    "blur_sigma",
    "BLUR_KERNEL",
    "BLUR_SIGMA",
]

cv2.setNumThreads(1)

BLUR_KERNEL = 23  # timm 1.0.31 transforms_imagenet_train: GaussianBlur(kernel_size=23), "hardcoded for now"
BLUR_SIGMA = (0.1, 2.0)  # torchvision GaussianBlur's default sigma range


class JitterParams(NamedTuple):
    """torchvision ``ColorJitter.get_params``: op order (0 brightness, 1 contrast, 2 saturation, 3 hue)."""

    order: tuple[int, ...]
    brightness: float | None
    contrast: float | None
    saturation: float | None
    hue: float | None


def jitter_params(jitter: tuple[float, ...], rng: np.random.Generator) -> JitterParams:
    """Draw factors for ``jitter`` = (brightness, contrast, saturation[, hue]) like torchvision."""
    b, c, s = jitter[:3]
    h = jitter[3] if len(jitter) > 3 else 0.0
    order = tuple(int(i) for i in rng.permutation(4))

    def factor(v: float) -> float | None:
        return float(rng.uniform(max(0.0, 1.0 - v), 1.0 + v)) if v > 0 else None

    fb, fc, fs = factor(b), factor(c), factor(s)
    fh = float(rng.uniform(-h, h)) if h > 0 else None
    return JitterParams(order, fb, fc, fs, fh)


def apply_jitter(img: np.ndarray, p: JitterParams) -> np.ndarray:
    """Apply drawn jitter params in their drawn order (torchvision's ``ColorJitter.forward``)."""
    for i in p.order:
        if i == 0 and p.brightness is not None:
            img = adjust_brightness(img, p.brightness)
        elif i == 1 and p.contrast is not None:
            img = adjust_contrast(img, p.contrast)
        elif i == 2 and p.saturation is not None:
            img = adjust_saturation(img, p.saturation)
        elif i == 3 and p.hue is not None:
            img = adjust_hue(img, p.hue)
    return img


def _blend(op, enhancer, img: np.ndarray, f: float) -> np.ndarray:
    """``op`` (an ``aa_arrays`` blend: Pillow's arithmetic in the ``_colorops`` extension) on ``img``, or,
    without the extension, the ``ImageEnhance`` class it reproduces: the same bytes either way."""
    if aa_arrays.available():
        return op(aa_arrays.ArrayImage(np.ascontiguousarray(img)), f).array
    return np.array(enhancer(Image.fromarray(np.ascontiguousarray(img), "RGB")).enhance(f))


def adjust_brightness(img: np.ndarray, f: float) -> np.ndarray:
    """Blend with black (``ImageEnhance.Brightness``)."""
    return _blend(aa_arrays.brightness, ImageEnhance.Brightness, img, f)


def adjust_contrast(img: np.ndarray, f: float) -> np.ndarray:
    """Blend with the mean grey level (``ImageEnhance.Contrast``: mean rounded to an int)."""
    return _blend(aa_arrays.contrast, ImageEnhance.Contrast, img, f)


def adjust_saturation(img: np.ndarray, f: float) -> np.ndarray:
    """Blend with the grey image (``ImageEnhance.Color``)."""
    return _blend(aa_arrays.color, ImageEnhance.Color, img, f)


def adjust_hue(img: np.ndarray, f: float) -> np.ndarray:
    """Rotate the uint8 hue by ``f`` turns, wrapping (torchvision's PIL ``adjust_hue``)."""
    hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV_FULL)
    hsv[:, :, 0] += np.uint8(int(f * 255) % 256)  # np.uint8(hue_factor * 255) in torchvision
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB_FULL)


def to_grayscale(img: np.ndarray) -> np.ndarray:
    """3-channel grey (``RandomGrayscale`` keeps the channel count): ``convert("L")``'s luma, which is
    ``ImageEnhance.Color`` at factor 0."""
    return _blend(aa_arrays.color, ImageEnhance.Color, img, 0.0)


def blur_sigma(rng: np.random.Generator) -> float:
    return float(rng.uniform(*BLUR_SIGMA))


def gaussian_blur(img: np.ndarray, sigma: float, ksize: int = BLUR_KERNEL) -> np.ndarray:
    """torchvision ``F.gaussian_blur``: separable kernel exp(-x²/2σ²) over ``ksize`` taps, reflect borders."""
    half = (ksize - 1) * 0.5
    x = np.linspace(-half, half, ksize)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    k = (k / k.sum()).astype(np.float32)
    return cv2.sepFilter2D(img, -1, k, k, borderType=cv2.BORDER_REFLECT_101)
