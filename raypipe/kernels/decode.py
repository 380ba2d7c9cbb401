"""Bytes -> RGB uint8 pixels: header probe, decompression-bomb refusal, DCT-scaled JPEG decode, modes, EXIF.

JPEGs (YCbCr/RGB/grey) go through libjpeg-turbo (``simplejpeg``), which can decode at n/8 scale: when a
crop will be shrunk anyway we decode the smallest scale that still keeps the crop at least as large as
the output, so the decoder does up to 64x less work. Everything else (PNG, WebP, BMP, TIFF, PPM, CMYK
JPEGs, …) goes through Pillow, converted the way timm/torchvision would (``convert('RGB')``) except
16-bit grey, which is scaled (``>> 8``) instead of clamped. EXIF orientation is applied like
``PIL.ImageOps.exif_transpose``; a broken EXIF block is ignored, never fatal.

When the optional C extension ``_jpegregion`` is built (see setup.py), a crop of an upright JPEG decodes
only the rows and columns the crop reads (plus a margin), into a buffer laid out as the whole scaled
image: the same pixels as a full decode where the crop reads them (tested bit for bit), for a fraction of
the IDCT and colour-conversion work, and no entropy decoding at all below the crop.

A failure of the data leaves this module as :class:`~raypipe.kernels.errors.SkipImage`: only the calls
into the decoders are guarded, and only against the errors the decoders raise for bad input
(``_DECODER_ERRORS``). Any other exception (a bug here, a failed import, ``MemoryError``) propagates
with its own type, so it fails the epoch instead of passing for a corrupt image.
"""

from __future__ import annotations

import io
import math
import struct
import warnings
from typing import NamedTuple

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from raypipe._native import load_native
from raypipe.config import DEFAULT_MAX_PIXELS
from raypipe.kernels import errors
from raypipe.kernels.errors import SkipImage


def _load_region_decoder():
    """The C extension's ``decode_region``, or None (built without a compiler or libjpeg-turbo headers:
    whole-image decodes only, same pixels)."""
    module = load_native("raypipe.kernels._jpegregion")
    return getattr(module, "decode_region", None)


_decode_region = _load_region_decoder()

__all__ = ["ImageInfo", "Source", "probe_image", "open_image", "decode_rgb", "decode_for_crop", "orient"]

_JPEG_MAGIC = b"\xff\xd8\xff"
_JPEG_MODES = {"YCbCr": "RGB", "RGB": "RGB", "Gray": "L"}  # what simplejpeg decodes itself
_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height
# DCT scales n/8 we use. libjpeg-turbo's 5/8..7/8 IDCTs cost more CPU than a full decode (time
# ``simplejpeg.decode_jpeg(data, min_width=…)`` per scale on ~500x375 q90 JPEGs), so we skip them: the
# remaining shrink (up to 2.7x) is antialiased by ``geometry.crop_resize`` instead.
_FAST_SCALES = (1, 2, 3, 4, 8)
# Pixels decoded around a crop: crop_resize reads 2 beyond the box, and libjpeg's fancy upsampling makes
# the outermost 1-2 columns of a partial decode differ from a full decode (tests/kernels/test_kernels_region.py
# compares partial and full decodes with this margin).
_REGION_MARGIN = 12


class ImageInfo(NamedTuple):
    """What the header says. ``width``/``height`` are as displayed, i.e. after EXIF orientation."""

    format: str
    width: int
    height: int
    mode: str
    orientation: int


class Source:
    """An opened (not yet decoded) image: the header facts plus what is needed to decode it."""

    __slots__ = ("data", "info", "pil", "stored_size")

    def __init__(self, data: bytes, info: ImageInfo, pil: Image.Image | None, stored_size: tuple[int, int]):
        self.data = data
        self.info = info
        self.pil = pil  # None: the simplejpeg fast path
        self.stored_size = stored_size  # (width, height) before orientation

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) as displayed."""
        return self.info.width, self.info.height


# --------------------------------------------------------------------------------------------------
# EXIF orientation


def jpeg_orientation(data: bytes) -> int:
    """EXIF orientation (1–8) from a JPEG's APP1 segment, read without decoding; 1 if absent or broken."""
    try:
        i, n = 2, len(data)
        while i + 4 <= n and data[i] == 0xFF:
            marker = data[i + 1]
            if marker == 0xFF:  # fill byte
                i += 1
                continue
            if marker == 0xDA or marker == 0xD9:  # start of scan / end of image: no more headers
                return 1
            (length,) = struct.unpack_from(">H", data, i + 2)
            if marker == 0xE1 and data[i + 4 : i + 10] == b"Exif\x00\x00":
                return _tiff_orientation(data[i + 10 : i + 2 + length])
            i += 2 + length
    except (struct.error, IndexError, ValueError):
        pass
    return 1


def _tiff_orientation(tiff: bytes) -> int:
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None:
        return 1
    (ifd,) = struct.unpack_from(order + "I", tiff, 4)
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    for k in range(count):
        tag, typ, _, value = struct.unpack_from(order + "HHI4s", tiff, ifd + 2 + 12 * k)
        if tag == 0x0112 and typ == 3:
            (o,) = struct.unpack_from(order + "H", value, 0)
            return o if 1 <= o <= 8 else 1
    return 1


def _pil_orientation(im: Image.Image) -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Corrupt EXIF data": handled as no orientation
            o = int(im.getexif().get(0x0112, 1))
    except Exception:  # noqa: BLE001 - any broken EXIF block means "no orientation", never a failure
        return 1
    return o if 1 <= o <= 8 else 1


def orient(arr: np.ndarray, orientation: int) -> np.ndarray:
    """Apply EXIF ``orientation`` to an HWC array (same result as ``ImageOps.exif_transpose``)."""
    if orientation == 2:
        arr = arr[:, ::-1]
    elif orientation == 3:
        arr = arr[::-1, ::-1]
    elif orientation == 4:
        arr = arr[::-1]
    elif orientation == 5:
        arr = arr.transpose(1, 0, 2)
    elif orientation == 6:
        arr = arr.transpose(1, 0, 2)[:, ::-1]
    elif orientation == 7:
        arr = arr[::-1, ::-1].transpose(1, 0, 2)
    elif orientation == 8:
        arr = arr.transpose(1, 0, 2)[::-1]
    else:
        return arr
    return np.ascontiguousarray(arr)


# --------------------------------------------------------------------------------------------------
# Opening (header only)


# What Pillow and simplejpeg raise for bad input, and only that: Pillow reports unknown formats as
# UnidentifiedImageError (an OSError), truncated or corrupt data as OSError, SyntaxError, ValueError,
# EOFError or struct.error from its plugins, and bombs as DecompressionBombError; simplejpeg raises
# ValueError. TypeError, MemoryError, ImportError and the like are not data errors and pass through.
_DECODER_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, Image.DecompressionBombError)


def _classify(exc: BaseException) -> SkipImage:
    """The skip reason for a decoder's error (one of ``_DECODER_ERRORS``, raised by a decoder call)."""
    if isinstance(exc, SkipImage):
        return exc
    msg = f"{type(exc).__name__}: {exc}"
    low = msg.lower()
    if isinstance(exc, UnidentifiedImageError):  # its message names the BytesIO object: say what it means
        return SkipImage(errors.NOT_AN_IMAGE, "no known image format (Pillow cannot identify it)")
    if isinstance(exc, Image.DecompressionBombError):
        return SkipImage(errors.TOO_LARGE, f"{msg} (Pillow's own limit: PIL.Image.MAX_IMAGE_PIXELS)")
    if isinstance(exc, EOFError) or "truncated" in low or "premature end" in low:
        return SkipImage(errors.TRUNCATED, msg)
    return SkipImage(errors.DECODE_ERROR, msg)


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        detail = f"{width}x{height} = {width * height} pixels > max_pixels={max_pixels}"
        raise SkipImage(errors.TOO_LARGE, detail)


def open_image(data: bytes, max_pixels: int) -> Source:
    """Read the header; refuse empty, unknown and too-large images before any pixel is decoded."""
    if data is None or len(data) == 0:
        raise SkipImage(errors.EMPTY, "0 bytes")
    data = bytes(data) if not isinstance(data, bytes) else data
    if data[:3] == _JPEG_MAGIC:
        try:
            h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            colorspace = None  # let Pillow have a go and classify the failure
        if colorspace in _JPEG_MODES:
            _check_pixels(w, h, max_pixels)
            o = jpeg_orientation(data)
            dw, dh = (h, w) if o in _TRANSPOSED else (w, h)
            return Source(data, ImageInfo("JPEG", dw, dh, _JPEG_MODES[colorspace], o), None, (w, h))
    im = _pil_open(data)
    w, h = im.size
    _check_pixels(w, h, max_pixels)
    o = _pil_orientation(im)
    dw, dh = (h, w) if o in _TRANSPOSED else (w, h)
    return Source(data, ImageInfo(im.format or "unknown", dw, dh, im.mode, o), im, (w, h))


def _pil_open(data: bytes) -> Image.Image:
    """``Image.open`` (lazy: reads the header only). Our ``max_pixels`` is checked right after, from the
    header; Pillow's own bomb limit stays as the process has it (``PIL.Image.MAX_IMAGE_PIXELS``): its
    warning (between one and two times that limit) is ours to decide, its error (beyond twice) a skip."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data))
    except _DECODER_ERRORS as exc:
        raise _classify(exc) from None


def probe_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageInfo:
    """Header facts of an encoded image without decoding its pixels; raises SkipImage."""
    return open_image(data, max_pixels).info


# --------------------------------------------------------------------------------------------------
# Decoding


def _pil_to_rgb(im: Image.Image) -> np.ndarray:
    """Any Pillow mode -> HxWx3 uint8 RGB. 16/32-bit grey is scaled to 8 bits, not clamped."""
    mode = im.mode
    if mode == "RGB":
        return np.asarray(im)
    if mode.startswith("I;16") or mode == "I":
        a = np.asarray(im)
        a = (np.clip(a, 0, 65535).astype(np.uint32) >> 8).astype(np.uint8)
        return np.repeat(a[:, :, None], 3, axis=2)
    if mode == "F":
        a = np.clip(np.rint(np.asarray(im)), 0, 255).astype(np.uint8)
        return np.repeat(a[:, :, None], 3, axis=2)
    if mode == "L":
        return np.repeat(np.asarray(im)[:, :, None], 3, axis=2)
    with warnings.catch_warnings():
        # "Palette images with Transparency expressed in bytes should be converted to RGBA": we drop
        # alpha exactly like timm/torchvision's convert('RGB') does, so the advice does not apply.
        warnings.simplefilter("ignore", UserWarning)
        return np.asarray(im.convert("RGB"))


def _decode_pil(src: Source) -> np.ndarray:
    try:
        src.pil.load()
        arr = _pil_to_rgb(src.pil)  # Pillow's convert() decodes too (palette, CMYK, …)
    except _DECODER_ERRORS as exc:
        raise _classify(exc) from None
    return arr


class DecodeBuffer:
    """Reusable output memory for JPEG decodes (saves a fresh ~0.5 MB allocation and its page faults per
    image). The array a decode returns is a view of it, valid until the next decode: one owner, not
    thread-safe. Decodes larger than ``max_bytes`` get their own memory."""

    __slots__ = ("mem", "max_bytes")

    def __init__(self, max_bytes: int = 16 * 2**20):
        self.mem = np.empty(0, np.uint8)
        self.max_bytes = max_bytes

    def get(self, nbytes: int) -> np.ndarray | None:
        if nbytes > self.max_bytes:
            return None
        if self.mem.size < nbytes:
            self.mem = np.empty(nbytes, np.uint8)
        return self.mem


def _decode_jpeg(src: Source, min_w: int = 0, min_h: int = 0, buffer: DecodeBuffer | None = None) -> np.ndarray:
    try:
        if buffer is not None:
            sw, sh = src.stored_size
            n = 8 if min_w <= 0 else _scale_numerator_for(sw, sh, min_w, min_h)
            mem = buffer.get(-(-sw * n // 8) * -(-sh * n // 8) * 3)
            if mem is not None:
                return simplejpeg.decode_jpeg(src.data, colorspace="RGB", min_width=min_w, min_height=min_h, buffer=mem)
        return simplejpeg.decode_jpeg(src.data, colorspace="RGB", min_width=min_w, min_height=min_h)
    except ValueError as exc:
        if "premature end" in str(exc).lower():
            raise SkipImage(errors.TRUNCATED, f"ValueError: {exc}") from None
    # A recoverable libjpeg warning (e.g. extraneous bytes) is fatal in strict mode: Pillow, like timm,
    # decodes such files, so let it.
    return _decode_pil(Source(src.data, src.info, _pil_open(src.data), src.stored_size))


def decode_rgb(src: Source, buffer: DecodeBuffer | None = None) -> np.ndarray:
    """Full-size, oriented HxWx3 uint8 RGB (a view of ``buffer`` when one is given and used)."""
    arr = _decode_jpeg(src, buffer=buffer) if src.pil is None else _decode_pil(src)
    return orient(arr, src.info.orientation)


def decode_for_crop(
    src: Source,
    box: tuple[float, float, float, float],
    out_size: tuple[int, int],
    dct_scaling: bool = True,
    buffer: DecodeBuffer | None = None,
) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """Decode as small as ``box`` (x0, y0, x1, y1, displayed pixels) allows for an (H, W) ``out_size``.

    Returns the oriented RGB array and the box in that array's coordinates. Only JPEGs are decoded
    scaled (by n/8, the smallest n that keeps the scaled crop >= ``out_size``); others come full size.
    With ``buffer`` the array may be a view of it (see :class:`DecodeBuffer`).
    """
    if src.pil is not None or not dct_scaling:
        return decode_rgb(src, buffer), box
    o = src.info.orientation
    x0, y0, x1, y1 = box
    oh, ow = out_size
    cw, ch = max(x1 - x0, 1e-6), max(y1 - y0, 1e-6)
    dw, dh = src.size
    need_w = min(dw, math.ceil(dw * ow / cw))  # displayed width the decode must keep
    need_h = min(dh, math.ceil(dh * oh / ch))
    if o in _TRANSPOSED:
        need_w, need_h = need_h, need_w
    sw, sh = src.stored_size
    n = next(k for k in _FAST_SCALES if -(-sw * k // 8) >= need_w and -(-sh * k // 8) >= need_h)
    if o == 1 and buffer is not None and _decode_region is not None:
        arr = _decode_crop_region(src, n, box, buffer)
        if arr is not None:
            s = n / 8.0
            return arr, (x0 * s, y0 * s, x1 * s, y1 * s)
    if n == 8:
        return decode_rgb(src, buffer), box
    arr = _decode_jpeg(src, -(-sw * n // 8), -(-sh * n // 8), buffer)
    n = _scale_numerator(sw, sh, arr.shape[1], arr.shape[0])
    if o == 1:
        s = n / 8.0
        return arr, (x0 * s, y0 * s, x1 * s, y1 * s)
    # Scale in the stored frame, then orient with the decoded array's own (rounded-up) size, so flips
    # line up with the pixels libjpeg produced.
    s = n / 8.0
    (ax, ay), (bx, by) = (_to_stored(x, y, sw, sh, o) for x, y in ((x0, y0), (x1, y1)))
    aw, ah = arr.shape[1], arr.shape[0]
    (cx, cy), (dx, dy) = (_to_display(x * s, y * s, aw, ah, o) for x, y in ((ax, ay), (bx, by)))
    return orient(arr, o), (min(cx, dx), min(cy, dy), max(cx, dx), max(cy, dy))


def _decode_crop_region(src: Source, n: int, box: tuple, buffer: DecodeBuffer) -> np.ndarray | None:
    """The n/8-scaled image as an array whose pixels are valid around ``box`` (upright JPEGs only).

    None when the region decoder refuses (any libjpeg error or warning, or a buffer too large) or the file
    does not end with an EOI marker: the caller's whole-image decode then runs and decides, so corrupt
    and truncated files are skipped (or not) exactly as without the extension.
    """
    if not src.data.endswith(b"\xff\xd9"):
        return None  # truncated (or trailing bytes): a crop above the cut would decode without complaint
    sw, sh = src.stored_size
    w, h = -(-sw * n // 8), -(-sh * n // 8)
    mem = buffer.get(w * h * 3)
    if mem is None:
        return None
    s = n / 8.0
    x0 = max(0, math.floor(box[0] * s) - _REGION_MARGIN)
    y0 = max(0, math.floor(box[1] * s) - _REGION_MARGIN)
    x1 = min(w, math.ceil(box[2] * s) + _REGION_MARGIN)
    y1 = min(h, math.ceil(box[3] * s) + _REGION_MARGIN)
    if x1 <= x0 or y1 <= y0:
        return None
    try:
        _decode_region(src.data, n, x0, y0, x1 - x0, y1 - y0, mem, w * 3)
    except ValueError:
        return None
    return mem[: w * h * 3].reshape(h, w, 3)


def _to_display(x: float, y: float, w: int, h: int, o: int) -> tuple[float, float]:
    """A point of a stored w x h image, in the coordinates of its EXIF-oriented display."""
    return {
        1: (x, y),
        2: (w - x, y),
        3: (w - x, h - y),
        4: (x, h - y),
        5: (y, x),
        6: (h - y, x),
        7: (h - y, w - x),
        8: (y, w - x),
    }[o]


def _to_stored(x: float, y: float, w: int, h: int, o: int) -> tuple[float, float]:
    """Inverse of :func:`_to_display` (``w``, ``h``: the stored size)."""
    return {
        1: (x, y),
        2: (w - x, y),
        3: (w - x, h - y),
        4: (x, h - y),
        5: (y, x),
        6: (y, h - x),
        7: (w - y, h - x),
        8: (w - y, x),
    }[o]


def _scale_numerator_for(sw: int, sh: int, min_w: int, min_h: int) -> int:
    """The n/8 libjpeg-turbo picks for ``min_width``/``min_height``: the smallest n meeting both."""
    return next((n for n in range(1, 9) if -(-sw * n // 8) >= min_w and -(-sh * n // 8) >= min_h), 8)


def _scale_numerator(sw: int, sh: int, w: int, h: int) -> int:
    """libjpeg-turbo's scale n/8 from the decoded size (it rounds dims up: ceil(dim * n / 8))."""
    for n in range(1, 9):
        if -(-sw * n // 8) == w and -(-sh * n // 8) == h:
            return n
    return max(1, min(8, round(8 * w / sw)))
