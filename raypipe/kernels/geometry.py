"""Geometry: RandomResizedCrop parameters (timm's draw, from our generator), eval crop geometry
(timm's ``transforms_imagenet_eval``) and one fused crop+resize(+flip): Pillow's own resize in C
(``_resample``, the same bytes as timm's Pillow path) or, without that extension, Pillow itself: the same
bytes again, so a node without the extension augments exactly like one with it, only slower.

Parameters are drawn once (``rrc_params``/``eval_geometry``), then applied deterministically
(``crop_resize``), torchvision-v2 style, so the apply step is testable against Pillow with fixed boxes.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import cv2
import numpy as np
from PIL import Image

from raypipe._native import load_native

__all__ = ["Box", "EvalGeometry", "rrc_params", "eval_geometry", "crop_resize", "CV2_INTERP"]

cv2.setNumThreads(1)  # one process per core under Ray; OpenCV's own pool would oversubscribe

CV2_INTERP = {"bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC}

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in pixel-edge coordinates

_resample = load_native("raypipe.kernels._resample")
_PIL_FILTER = {"bilinear": 2, "bicubic": 3}


@functools.cache
def _pillow_vertical_first() -> bool:
    """Whether the installed Pillow may start a resize with its vertical pass (Pillow >= 13, #9549):
    the pass order changes some bytes, and timm's images are whatever the installed Pillow makes."""
    return _pillow_major() >= 13


def _pillow_major() -> int:
    """The installed Pillow's major version: from the package metadata (no PIL import in workers that
    do not need it), else from PIL itself (a fork such as Pillow-SIMD installs under another name)."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("pillow")
    except importlib.metadata.PackageNotFoundError:
        import PIL

        version = PIL.__version__
    return int(version.split(".")[0])


def rrc_params(
    width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float], rng: np.random.Generator
) -> tuple[int, int, int, int]:
    """timm's ``RandomResizedCropAndInterpolation.get_params``: (top, left, h, w), drawn from ``rng``.

    Ten attempts at a box of area ``uniform(scale)`` and log-uniform aspect ``ratio`` that fits; then
    the centre crop clamped to the ratio range.
    """
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = rng.uniform(scale[0], scale[1]) * area
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:  # timm accepts 0; a 0-pixel crop cannot be resized
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class EvalGeometry(NamedTuple):
    """Source ``box`` lands in output rows ``top:top+h``, cols ``left:left+w``; the rest is ``fill``.

    The same as timm computes it: the whole image resized to ``resized`` (H, W), then the h x w window
    at ``start`` (row, col) of that kept."""

    box: Box
    top: int
    left: int
    h: int
    w: int
    fill: tuple[int, int, int] | None
    resized: tuple[int, int] = (0, 0)
    start: tuple[int, int] = (0, 0)


def _resized_size(width: int, height: int, size: tuple[int, int], crop_mode: str) -> tuple[int, int]:
    """(h, w) after timm's eval resize step for ``crop_mode``."""
    sh, sw = size
    if crop_mode == "squash":
        return sh, sw
    if crop_mode == "center" and sh == sw:  # torchvision Resize(int): shorter side, longer truncated
        if width <= height:
            return int(sh * height / width), sh
        return sh, int(sh * width / height)
    # timm ResizeKeepRatio: longest=1 for border, 0 for (non-square) center
    rh, rw = height / sh, width / sw
    r = max(rh, rw) if crop_mode == "border" else min(rh, rw)
    return round(height / r), round(width / r)


def eval_geometry(
    width: int, height: int, input_size: tuple[int, int], crop_pct: float, crop_mode: str, mean: tuple
) -> EvalGeometry:
    """timm ``transforms_imagenet_eval`` as one source box and one destination rectangle."""
    oh, ow = input_size
    scale_size = (math.floor(oh / crop_pct), math.floor(ow / crop_pct))
    rh, rw = (max(1, v) for v in _resized_size(width, height, scale_size, crop_mode))  # 1-px-thin inputs
    fy, fx = height / rh, width / rw

    def axis(r: int, c: int, f: float) -> tuple[float, float, int, int, int]:
        # torchvision CenterCrop / timm CenterCropOrPad, per axis: pad (content centred) or crop.
        if c > r:
            return 0.0, r * f, (c - r) // 2, r, 0
        start = int(round((r - c) / 2.0))
        return start * f, (start + c) * f, 0, c, start

    y0, y1, top, h, sy = axis(rh, oh, fy)
    x0, x1, left, w, sx = axis(rw, ow, fx)
    fill = tuple(round(255 * v) for v in mean) if crop_mode == "border" else (0, 0, 0)
    if h == oh and w == ow:
        fill = None
    return EvalGeometry((x0, y0, x1, y1), top, left, h, w, fill, (rh, rw), (sy, sx))


def resize_window(
    img: np.ndarray, resized: tuple[int, int], start: tuple[int, int], out: np.ndarray, interpolation: str
) -> bool:
    """``out`` = the ``out``-sized window at ``start`` (row, col) of Pillow's resize of the whole ``img``
    to ``resized`` (H, W): timm's eval resize + centre crop, byte for byte, without computing the
    pixels the crop drops (without the ``_resample`` extension: Pillow's resize of the whole image, then
    the window). False (``out`` untouched) for what Pillow's resize does not cover here."""
    if interpolation not in _PIL_FILTER or not _packed(out) or img.shape[2:] != (3,) or img.dtype != np.uint8:
        return False
    if _resample is None:
        (rh, rw), (sy, sx) = resized, start
        oh, ow = out.shape[:2]
        full = Image.fromarray(np.ascontiguousarray(img), "RGB").resize((rw, rh), _PIL_FILTER[interpolation])
        out[...] = np.asarray(full)[sy : sy + oh, sx : sx + ow]
        return True
    if not _packed(img):
        img = np.ascontiguousarray(img, np.uint8)
    H, W = img.shape[:2]
    (rh, rw), (sy, sx) = resized, start
    _resample.resample(
        img, out, 0.0, 0.0, float(W), float(H), _PIL_FILTER[interpolation], _pillow_vertical_first(), rw, rh, sx, sy
    )
    return True


# Largest per-axis shrink the 3-tap prefilter handles (its centre weight 1 - (s*s - 1)/6 stays > 0.1);
# beyond it an exact integer INTER_AREA reduction runs first.
_MAX_PREFILTER_SHRINK = 2.5


def _prefilter_taps(s: float) -> np.ndarray | None:
    """3-tap kernel that turns OpenCV's non-antialiased linear/cubic sampling into Pillow's antialiased
    resize for a shrink by ``s`` (1 < s <= 2.5): Pillow's filter is the kernel stretched by ``s``
    (variance x s**2), so the prefilter adds the missing variance (s**2 - 1) * var(kernel), with
    var = 1/6 for the tent (bilinear); the same taps measured best for bicubic too. None if s <= 1."""
    if s <= 1.0:
        return None
    a = (s * s - 1.0) / 12.0
    return np.array([a, 1.0 - 2.0 * a, a], np.float32)


_IDENTITY_TAP = np.ones(1, np.float32)


def _antialias(img: np.ndarray, sx: float, sy: float) -> np.ndarray:
    kx, ky = _prefilter_taps(sx), _prefilter_taps(sy)
    if kx is None and ky is None:
        return img
    kx = _IDENTITY_TAP if kx is None else kx
    ky = _IDENTITY_TAP if ky is None else ky
    return cv2.sepFilter2D(img, -1, kx, ky, borderType=cv2.BORDER_REPLICATE)


def _integral(v: float) -> bool:
    return abs(v - round(v)) < 1e-9


def crop_resize(
    img: np.ndarray,
    box: Box,
    size: tuple[int, int],
    interpolation: str = "bilinear",
    *,
    hflip: bool = False,
    vflip: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Resize the (sub-pixel) ``box`` of HWC uint8 ``img`` to ``size`` (H, W), optionally flipped.

    Pixel-centre mapping (Pillow's convention). A box on whole pixels (every RandomResizedCrop box of
    a full-size decode) is cropped, then resized, as torchvision's ``resized_crop`` (timm's RRC) does;
    a fractional box (eval, DCT-scaled decodes) is Pillow's ``resize(size, box=box)`` of the image.
    RGB uint8 images are resized with Pillow's arithmetic: the ``_resample`` extension, or Pillow itself
    without it (the same bytes, so whether a node has the extension never changes a sample). Other
    inputs (grey, other dtypes) go through OpenCV, which approximates Pillow's antialiasing: up to 2.5x
    per axis by a 3-tap prefilter (see :func:`_prefilter_taps`), beyond by an exact integer INTER_AREA
    reduction first. Flips are applied in place on the result (exact mirror images).
    """
    rgb = img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8
    if interpolation in _PIL_FILTER and rgb:
        res = _pillow_resize(img, box, size, interpolation, out)
    else:
        res = _opencv_resize(img, box, size, interpolation, out)
    if hflip or vflip:
        cv2.flip(res, -1 if (hflip and vflip) else (1 if hflip else 0), dst=res)
    if out is None:
        return res
    if res is not out and res.ctypes.data != out.ctypes.data:
        out[...] = res
    return out


def _packed(a: np.ndarray) -> bool:
    """HxWx3 uint8 with 3-byte pixels and forward rows: what the extension reads and writes in place."""
    return a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3 and a.strides[1:] == (3, 1) and a.strides[0] > 0


def _whole_pixel_box(img: np.ndarray, box: Box) -> tuple[int, int, int, int] | None:
    H, W = img.shape[:2]
    if not all(map(_integral, box)):
        return None
    x0, y0, x1, y1 = (round(v) for v in box)
    return (x0, y0, x1, y1) if 0 <= x0 < x1 <= W and 0 <= y0 < y1 <= H else None


def _pillow_resize(img: np.ndarray, box: Box, size: tuple[int, int], interpolation: str, out) -> np.ndarray:
    oh, ow = size
    if not _packed(img):
        img = np.ascontiguousarray(img, np.uint8)
    whole = _whole_pixel_box(img, box)
    if whole is not None:
        x0, y0, x1, y1 = whole
        src, b = img[y0:y1, x0:x1], (0.0, 0.0, float(x1 - x0), float(y1 - y0))
    else:  # clamp float noise at the edges; Pillow refuses boxes outside the image
        H, W = img.shape[:2]
        src = img
        b = (min(max(box[0], 0.0), W), min(max(box[1], 0.0), H), min(max(box[2], 0.0), W), min(max(box[3], 0.0), H))
    if _resample is None:  # Pillow itself: the bytes the extension reproduces
        pil = Image.fromarray(np.ascontiguousarray(src), "RGB")
        return np.array(pil.resize((ow, oh), _PIL_FILTER[interpolation], box=b))  # a writable copy: flips
    dst = out if out is not None and out.shape == (oh, ow, 3) and _packed(out) else np.empty((oh, ow, 3), np.uint8)
    _resample.resample(src, dst, *b, _PIL_FILTER[interpolation], _pillow_vertical_first())
    return dst


def _opencv_resize(img: np.ndarray, box: Box, size: tuple[int, int], interpolation: str, out) -> np.ndarray:
    oh, ow = size
    x0, y0, x1, y1 = box
    sx, sy = (x1 - x0) / ow, (y1 - y0) / oh
    kx = int(sx) if sx > _MAX_PREFILTER_SHRINK else 1
    ky = int(sy) if sy > _MAX_PREFILTER_SHRINK else 1
    if kx > 1 or ky > 1:
        img, (x0, y0, x1, y1) = _reduce(img, (x0, y0, x1, y1), kx, ky)
        sx, sy = (x1 - x0) / ow, (y1 - y0) / oh
    flags = CV2_INTERP[interpolation]
    direct = out is not None and out.flags.c_contiguous and out.shape == (oh, ow, 3) and out.dtype == np.uint8
    H, W = img.shape[:2]
    whole = _whole_pixel_box(img, (x0, y0, x1, y1))
    if whole is not None:
        roi = _antialias(img[whole[1] : whole[3], whole[0] : whole[2]], sx, sy)
        return cv2.resize(roi, (ow, oh), dst=out if direct else None, interpolation=flags)
    # Prefilter only the whole-pixel region the warp reads (one pixel of margin for the kernel).
    ix0, iy0 = max(0, int(math.floor(x0)) - 2), max(0, int(math.floor(y0)) - 2)
    ix1, iy1 = min(W, int(math.ceil(x1)) + 2), min(H, int(math.ceil(y1)) + 2)
    src = _antialias(img[iy0:iy1, ix0:ix1], sx, sy)
    # dst pixel centre (u + .5) -> src centre x0 + (u + .5) * sx, in OpenCV's integer-centre coords
    m = np.array([[sx, 0.0, x0 - ix0 + 0.5 * sx - 0.5], [0.0, sy, y0 - iy0 + 0.5 * sy - 0.5]], np.float64)
    return cv2.warpAffine(
        src,
        m,
        (ow, oh),
        dst=out if direct else None,
        flags=flags | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_REPLICATE,
    )


def _reduce(img: np.ndarray, box: Box, kx: int, ky: int) -> tuple[np.ndarray, Box]:
    """Box-filter the integer region around ``box`` by (kx, ky); return it and the box in its coordinates."""
    H, W = img.shape[:2]
    ix0, iy0 = max(0, int(math.floor(box[0]))), max(0, int(math.floor(box[1])))
    ix1, iy1 = min(W, int(math.ceil(box[2]))), min(H, int(math.ceil(box[3])))
    nw, nh = max(1, (ix1 - ix0) // kx), max(1, (iy1 - iy0) // ky)
    roi = img[iy0 : iy0 + nh * ky, ix0 : ix0 + nw * kx]
    small = cv2.resize(roi, (nw, nh), interpolation=cv2.INTER_AREA)
    return small, ((box[0] - ix0) / kx, (box[1] - iy0) / ky, (box[2] - ix0) / kx, (box[3] - iy0) / ky)
