"""timm's auto-augment ops on NumPy arrays, with Pillow's arithmetic: the same bytes, no PIL images.

A timm policy (``RandAugment``, ``AutoAugment``) only draws its random numbers and hands the image from op
to op, so it runs unchanged on an :class:`ArrayImage`, a packed HxWx3 uint8 array, when each op's
function accepts one:

- the geometric ops (rotate, shear, translate) are timm's own functions: they call ``img.transform``
  and Pillow's ``Image.rotate``, which :class:`ArrayImage` provides (Pillow's own ``rotate`` code builds
  the matrix; the warp is Pillow's arithmetic in the ``_warp`` extension, or Pillow itself);
- the colour ops are rewritten here: the same tables as Pillow's ``ImageOps`` (built with the same
  float and integer operations) and ``ImageEnhance``'s blends, run by the ``_colorops`` extension.

Each rewritten op matches one timm function (``ARRAY_OPS``); a policy with any other op stays on PIL
images. Why: through Pillow every op converts the array to Pillow's 4-byte layout and back, builds its
table in Python and Sharpness filters in scalar floats, so a rand-m9 policy costs more than twice as much
on PIL images (even with the C warps) as on arrays (``python bench/profiles.py autoaug`` measures both).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from PIL import Image

from raypipe._native import load_native

__all__ = ["ArrayImage", "array_ops", "affine_array", "available"]

_colorops = load_native("raypipe.kernels._colorops")
_warp = load_native("raypipe.kernels._warp")
_FAST_FILTERS = (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC)
_RAMP = np.arange(256, dtype=np.int64)


def available() -> bool:
    """Whether policies can run on arrays here (the ``_colorops`` extension is built)."""
    return _colorops is not None


class ArrayImage:
    """An RGB image as a packed HxWx3 uint8 array, with the part of ``PIL.Image.Image``'s interface that
    timm's geometric ops and Pillow's ``Image.rotate`` use. Ops return new images; none changes one."""

    __slots__ = ("array",)
    mode = "RGB"

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @property
    def size(self) -> tuple[int, int]:
        return self.array.shape[1], self.array.shape[0]

    @property
    def width(self) -> int:
        return self.array.shape[1]

    @property
    def height(self) -> int:
        return self.array.shape[0]

    def getbands(self) -> tuple[str, ...]:
        return ("R", "G", "B")

    def copy(self) -> ArrayImage:
        return ArrayImage(self.array.copy())

    def transpose(self, method) -> ArrayImage:
        return ArrayImage(np.asarray(self._pil().transpose(method)))

    # Pillow's own code: the matrix (and its fast paths) exactly as Image.rotate computes them
    rotate = Image.Image.rotate

    def transform(self, size, method, data=None, resample=Image.Resampling.NEAREST, fill=1, fillcolor=None):
        out = affine_array(self.array, size, method, data, resample, fillcolor)
        if out is None:  # a case _warp does not reproduce: Pillow runs it
            pil = self._pil().transform(size, method, data, resample, fill, fillcolor)
            out = np.asarray(pil.convert("RGB") if pil.mode != "RGB" else pil)
        return ArrayImage(out)

    def _pil(self) -> Image.Image:
        return Image.fromarray(self.array, "RGB")


def _fill_bytes(fillcolor) -> bytes | None:
    if fillcolor is None:
        return b"\0\0\0"  # Pillow zero-fills when no colour is given
    if isinstance(fillcolor, (tuple, list)) and len(fillcolor) == 3:
        if all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in fillcolor):
            return bytes(fillcolor)
    return None  # colour names, single numbers, floats: Pillow's parsing decides


def affine_array(src: np.ndarray, size, method, data, resample, fillcolor) -> np.ndarray | None:
    """Pillow's ``transform(size, AFFINE, data, resample, fillcolor=fillcolor)`` of the packed RGB array
    ``src`` through ``_warp``, or None when the call is not one it reproduces exactly."""
    if _warp is None or method != Image.Transform.AFFINE or resample not in _FAST_FILTERS:
        return None
    fill = _fill_bytes(fillcolor)
    try:
        coeffs = [float(v) for v in list(data)[:6]]
        w, h = size
    except (TypeError, ValueError):
        return None
    if len(coeffs) != 6 or not all(math.isfinite(v) for v in coeffs) or fill is None:
        return None
    if not (isinstance(w, int) and isinstance(h, int) and w >= 1 and h >= 1):
        return None  # Pillow's own handling (or error) for anything but a positive int size
    src = np.ascontiguousarray(src)
    out = np.empty((h, w, 3), np.uint8)
    _warp.affine_rgb(src, src.shape[1], src.shape[0], out, w, h, *coeffs, int(resample), fill)
    return out


# ---- colour ops: timm's functions with Pillow's ImageOps / ImageEnhance arithmetic ----


def _through(img: ArrayImage, table: np.ndarray) -> ArrayImage:
    """``Image.point`` with a per-channel table (3 x 256 values, rounded and clipped as Pillow does)."""
    table = np.clip(np.round(table), 0, 255).astype(np.uint8)
    out = np.empty_like(img.array)
    _colorops.lut(img.array, out, np.ascontiguousarray(np.broadcast_to(table, (3, 256))))
    return ArrayImage(out)


def auto_contrast(img: ArrayImage, **_) -> ArrayImage:
    """``ImageOps.autocontrast(img)``: each channel's lowest and highest level stretched to 0 and 255."""
    lo_hi = _colorops.minmax(img.array)
    table = np.empty((3, 256), np.int64)
    for c in range(3):
        lo, hi = lo_hi[c], lo_hi[3 + c]
        if hi <= lo:
            table[c] = _RAMP
        else:
            scale = 255.0 / (hi - lo)
            offset = -lo * scale
            table[c] = np.trunc(_RAMP * scale + offset)  # int(ix * scale + offset), clipped by _through
    return _through(img, table)


def equalize(img: ArrayImage, **_) -> ArrayImage:
    """``ImageOps.equalize(img)``: per channel, levels spread by their cumulative counts."""
    hist = np.empty(768, np.int64)
    _colorops.histogram(img.array, hist)
    table = np.empty((3, 256), np.int64)
    for c, h in enumerate(hist.reshape(3, 256)):
        used = h[h > 0]
        step = (int(used.sum()) - int(used[-1])) // 255 if len(used) > 1 else 0
        if not step:
            table[c] = _RAMP
        else:
            before = np.concatenate(([0], np.cumsum(h)[:-1]))  # pixels below each level
            table[c] = (step // 2 + before) // step
    return _through(img, table)


def invert(img: ArrayImage, **_) -> ArrayImage:
    return ArrayImage(np.bitwise_not(img.array))


def solarize(img: ArrayImage, thresh, **_) -> ArrayImage:
    """``ImageOps.solarize``: levels at or above ``thresh`` inverted."""
    return _through(img, np.where(_RAMP < thresh, _RAMP, 255 - _RAMP))


def solarize_add(img: ArrayImage, add, thresh=128, **_) -> ArrayImage:
    """timm's ``solarize_add``: ``add`` added (capped at 255) to levels below ``thresh``."""
    return _through(img, np.where(_RAMP < thresh, np.minimum(255, _RAMP + add), _RAMP))


def posterize(img: ArrayImage, bits_to_keep, **_) -> ArrayImage:
    """raypipe's ``autoaug._posterize`` (timm's, safe for 0 bits) with ``ImageOps.posterize``'s mask."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep < 1:
        return ArrayImage(np.zeros_like(img.array))
    mask = ~(2 ** (8 - bits_to_keep) - 1)  # Pillow's expression: a non-integer fails as it does there
    return ArrayImage(np.bitwise_and(img.array, np.uint8(mask & 0xFF)))


def _blended(img: ArrayImage, run) -> ArrayImage:
    out = np.empty_like(img.array)
    run(out)
    return ArrayImage(out)


def brightness(img: ArrayImage, factor, **_) -> ArrayImage:
    """``ImageEnhance.Brightness(img).enhance(factor)``: a blend with black."""
    return _blended(img, lambda out: _colorops.blend_const(img.array, out, 0, factor))


def contrast(img: ArrayImage, factor, **_) -> ArrayImage:
    """``ImageEnhance.Contrast``: a blend with the mean grey level (ImageStat's mean of ``convert("L")``,
    plus 0.5, truncated)."""
    count = img.width * img.height
    mean = int(_colorops.luma_sum(img.array) / count + 0.5) if count else 0
    return _blended(img, lambda out: _colorops.blend_const(img.array, out, mean, factor))


def color(img: ArrayImage, factor, **_) -> ArrayImage:
    """``ImageEnhance.Color``: a blend with the image's grey version."""
    return _blended(img, lambda out: _colorops.blend_gray(img.array, out, factor))


def sharpness(img: ArrayImage, factor, **_) -> ArrayImage:
    """``ImageEnhance.Sharpness``: a blend with the image under Pillow's SMOOTH filter."""
    return _blended(img, lambda out: _colorops.blend_smooth(img.array, out, img.width, img.height, factor))


def array_ops(timm_aa, posterize_fn) -> dict[Callable, Callable]:
    """timm's op functions (of the module ``timm_aa``; ``posterize_fn`` is raypipe's posterize) -> the
    function to call with an :class:`ArrayImage`: timm's own for the geometric ops, the rewrites here for
    the colour ops."""
    geometric = (
        "shear_x",
        "shear_y",
        "translate_x_rel",
        "translate_y_rel",
        "translate_x_abs",
        "translate_y_abs",
        "rotate",
    )
    ops = {fn: fn for fn in (getattr(timm_aa, name, None) for name in geometric) if fn is not None}
    rewritten = {
        "auto_contrast": auto_contrast,
        "equalize": equalize,
        "invert": invert,
        "solarize": solarize,
        "solarize_add": solarize_add,
        "brightness": brightness,
        "contrast": contrast,
        "color": color,
        "sharpness": sharpness,
    }
    ops.update({getattr(timm_aa, name): fn for name, fn in rewritten.items() if hasattr(timm_aa, name)})
    ops[posterize_fn] = posterize
    return ops
