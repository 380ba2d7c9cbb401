"""Colour ops on HxWx3 uint8 RGB arrays: torchvision's ColorJitter / RandomGrayscale / GaussianBlur
(as timm's train transform uses them), drawn from our generator.

torchvision runs them on PIL images: brightness, contrast and saturation are Pillow's ``ImageEnhance``
blends, the grey image is ``convert("L")``. With the ``_colorops`` extension built those are Pillow's
own arithmetic (the auto-augment ops' blends and luma, :mod:`raypipe.kernels.aa_arrays`): the same
bytes as torchvision. Without it, and for the hue shift and the blur always, OpenCV mirrors them to
within 1–2 levels (the hue shift wraps a uint8 HSV hue); the tests measure both.
"""

from __future__ import annotations

from typing import NamedTuple

import cv2
import numpy as np

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
_TRUNC = -0.4999  # added before OpenCV's round-to-nearest so blends truncate like Pillow's


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


def _gray(img: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)


def _exact(op, img: np.ndarray, f: float) -> np.ndarray | None:
    """``op`` (an ``aa_arrays`` blend, Pillow's arithmetic) on ``img``; None when ``_colorops`` is not built."""
    if not aa_arrays.available():
        return None
    return op(aa_arrays.ArrayImage(np.ascontiguousarray(img)), f).array


def adjust_brightness(img: np.ndarray, f: float) -> np.ndarray:
    """Blend with black (``ImageEnhance.Brightness``)."""
    out = _exact(aa_arrays.brightness, img, f)
    return out if out is not None else cv2.addWeighted(img, f, img, 0.0, _TRUNC)


def adjust_contrast(img: np.ndarray, f: float) -> np.ndarray:
    """Blend with the mean grey level (``ImageEnhance.Contrast``: mean rounded to an int)."""
    out = _exact(aa_arrays.contrast, img, f)
    if out is not None:
        return out
    mean = int(float(_gray(img).mean()) + 0.5)
    return cv2.addWeighted(img, f, img, 0.0, (1.0 - f) * mean + _TRUNC)


def adjust_saturation(img: np.ndarray, f: float) -> np.ndarray:
    """Blend with the grey image (``ImageEnhance.Color``)."""
    out = _exact(aa_arrays.color, img, f)
    if out is not None:
        return out
    g = cv2.cvtColor(_gray(img), cv2.COLOR_GRAY2RGB)
    return cv2.addWeighted(img, f, g, 1.0 - f, _TRUNC)


def adjust_hue(img: np.ndarray, f: float) -> np.ndarray:
    """Rotate the uint8 hue by ``f`` turns, wrapping (torchvision's PIL ``adjust_hue``)."""
    hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV_FULL)
    hsv[:, :, 0] += np.uint8(int(f * 255) % 256)  # np.uint8(hue_factor * 255) in torchvision
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB_FULL)


def to_grayscale(img: np.ndarray) -> np.ndarray:
    """3-channel grey (``RandomGrayscale`` keeps the channel count): ``convert("L")``'s luma, which is
    ``ImageEnhance.Color`` at factor 0."""
    out = _exact(aa_arrays.color, img, 0.0)
    return out if out is not None else cv2.cvtColor(_gray(img), cv2.COLOR_GRAY2RGB)


def blur_sigma(rng: np.random.Generator) -> float:
    return float(rng.uniform(*BLUR_SIGMA))


def gaussian_blur(img: np.ndarray, sigma: float, ksize: int = BLUR_KERNEL) -> np.ndarray:
    """torchvision ``F.gaussian_blur``: separable kernel exp(-x²/2σ²) over ``ksize`` taps, reflect borders."""
    half = (ksize - 1) * 0.5
    x = np.linspace(-half, half, ksize)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    k = (k / k.sum()).astype(np.float32)
    return cv2.sepFilter2D(img, -1, k, k, borderType=cv2.BORDER_REFLECT_101)
