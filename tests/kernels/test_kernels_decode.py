"""Decoding: the bad-input corpus, odd modes and formats, EXIF orientation, decompression bombs."""

from __future__ import annotations

import io
import os
import tracemalloc
import warnings

import image_factory as f
import numpy as np
import pytest
from kernel_checks import mae
from PIL import Image, ImageOps

from raypipe.config import DecodeConfig, EvalAugment
from raypipe.kernels import (
    DECODE_ERROR,
    EMPTY,
    NOT_AN_IMAGE,
    REASONS,
    TOO_LARGE,
    TRUNCATED,
    SkipImage,
    build_transform,
    decode_rgb,
    open_image,
    probe_image,
)
from raypipe.kernels.decode import orient

BIG = 10**9


def reference(data: bytes) -> np.ndarray:
    """What timm's loader sees: Pillow, EXIF-transposed, convert('RGB')."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))


def decode(data: bytes) -> np.ndarray:
    img = decode_rgb(open_image(data, BIG))
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3 and img.flags.c_contiguous
    return img


@pytest.mark.parametrize(
    "make,reason",
    [
        (f.empty, EMPTY),
        (f.truncated_jpeg, TRUNCATED),
        (f.random_bytes, NOT_AN_IMAGE),
        (f.text_bytes, NOT_AN_IMAGE),
        (lambda: f.encode(f.gradient((64, 64)), "PNG")[:60], TRUNCATED),
        (lambda: b"\xff\xd8\xff\xe0" + f.random_bytes(500), TRUNCATED),  # Pillow runs out of markers
    ],
    ids=["empty", "truncated_jpeg", "random", "text", "truncated_png", "jpeg_magic_garbage"],
)
def test_bad_data_reasons(make, reason):
    data = make()
    with pytest.raises(SkipImage) as e:
        decode(data)
    assert e.value.reason == reason, e.value
    if reason == DECODE_ERROR:
        assert e.value.detail
    assert e.value.reason in REASONS


def test_huge_png_refused_from_header_without_allocation():
    data = f.huge_png(20000, 20000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's DecompressionBombWarning must not leak
        tracemalloc.start()
        try:
            for call in (lambda: probe_image(data), lambda: build_transform(EvalAugment())(data)):
                with pytest.raises(SkipImage) as e:
                    call()
                assert e.value.reason == TOO_LARGE and "400000000 pixels" in e.value.detail  # the real size
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 50 * 2**20


def test_max_pixels_is_ours_not_pillows():
    data = f.encode(f.gradient((300, 200)), "PNG")
    with pytest.raises(SkipImage) as e:
        open_image(data, 300 * 200 - 1)
    assert e.value.reason == TOO_LARGE
    jpeg = f.photo_jpeg()
    with pytest.raises(SkipImage):
        open_image(jpeg, 1000)
    assert open_image(jpeg, 500 * 375).size == (500, 375)


@pytest.mark.parametrize(
    "make",
    [
        f.cmyk_jpeg,
        lambda: f.gray("JPEG"),
        lambda: f.gray("PNG"),
        lambda: f.palette_png(False),
        lambda: f.palette_png(True),
        lambda: f.alpha_png("LA"),
        lambda: f.alpha_png("RGBA"),
        lambda: f.other_format("WEBP"),
        lambda: f.other_format("BMP"),
        lambda: f.other_format("TIFF"),
        lambda: f.other_format("PPM"),
        lambda: f.other_format("PGM"),
        lambda: f.photo_jpeg("coffee"),
    ],
    ids="cmyk gray_jpeg gray_png palette palette_trns la rgba webp bmp tiff ppm pgm jpeg".split(),
)
def test_modes_and_formats_match_convert_rgb(make):
    data = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = decode(data)
    ref = reference(data)
    assert ours.shape == ref.shape
    assert mae(ours, ref) <= 1.0  # simplejpeg and Pillow share libjpeg-turbo; others are exact


def test_16bit_png_is_scaled_not_clamped():
    values = np.array([[0, 255, 256, 32768], [65535, 65280, 1000, 40000]], np.uint16)
    img = decode(f.png16(values))
    assert img.shape == (2, 4, 3)
    np.testing.assert_array_equal(img[:, :, 0], values >> 8)
    assert img[1, 0, 0] == 255 and img[0, 3, 0] == 128 and (img[..., 0] == img[..., 2]).all()
    const = f.png16(np.full((40, 50), 32768, np.uint16))
    assert (build_transform(EvalAugment(input_size=32))(const) == 128).all()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_like_exif_transpose(orientation):
    data = f.exif_jpeg(orientation, (90, 60))
    info = probe_image(data)
    assert info.orientation == orientation
    ref = reference(data)
    assert (info.height, info.width) == ref.shape[:2]
    ours = decode(data)
    assert ours.shape == ref.shape and mae(ours, ref) <= 1.0
    # same through the transform: squash keeps the whole (rotated) picture
    aug = EvalAugment(input_size=(64, 48), crop_pct=1.0, crop_mode="squash")
    upright = f.encode(ref, "PNG")
    exact = build_transform(aug, DecodeConfig(dct_scaling=False))
    assert np.array_equal(exact(data), exact(upright))
    # with DCT scaling, orientation adds no error beyond what scaling itself costs (orientation 1)
    t = build_transform(aug)
    plain = f.exif_jpeg(1, (ref.shape[1], ref.shape[0]))  # same displayed size, no orientation
    base = mae(t(plain), t(f.encode(reference(plain), "PNG")))
    assert mae(t(data), t(upright)) <= base + 0.5


def test_orient_matches_pil_on_arrays():
    arr = f.gradient((7, 5))
    for o in range(1, 9):
        im = Image.fromarray(arr)
        exif = im.getexif()
        exif[0x0112] = o
        buf = io.BytesIO()
        im.save(buf, "PNG", exif=exif)
        np.testing.assert_array_equal(orient(arr, o), reference(buf.getvalue()))


def test_broken_exif_is_ignored():
    data = f.broken_exif_jpeg()
    assert probe_image(data).orientation == 1
    assert decode(data).shape == (48, 64, 3)


def test_probe_reports_header_facts():
    info = probe_image(f.photo_jpeg("chelsea", (320, 240)))
    assert (info.format, info.width, info.height, info.mode, info.orientation) == ("JPEG", 320, 240, "RGB", 1)
    assert probe_image(f.palette_png(True)).mode == "P"
    assert probe_image(f.cmyk_jpeg()).mode == "CMYK"
    assert probe_image(f.gray("JPEG")).mode == "L"


def test_skipimage_validates_reason():
    with pytest.raises(ValueError):
        SkipImage("nope", "x")
    assert str(SkipImage(EMPTY, "0 bytes")) == "empty: 0 bytes"
    assert len(set(REASONS)) == len(REASONS) == 12


def test_decode_buffer_reuse_gives_the_same_pixels():
    from raypipe.kernels.decode import DecodeBuffer, decode_for_crop

    buf = DecodeBuffer()
    cases = [
        (f.photo_jpeg("chelsea"), (10, 5, 490, 370)),  # full decode
        (f.photo_jpeg("coffee", (1000, 750)), (20, 10, 980, 740)),  # 3/8 decode
        (f.gray("JPEG"), (0, 0, 8, 8)),  # grey JPEG, decoded to RGB
        (f.exif_jpeg(6, (90, 60)), (0, 0, 60, 90)),
    ]
    for data, box in cases:
        src = open_image(data, BIG)
        plain, b1 = decode_for_crop(src, box, (32, 32))
        reused, b2 = decode_for_crop(src, box, (32, 32), buffer=buf)
        assert b1 == b2 and plain.shape == reused.shape
        # with a buffer only the part a crop reads is decoded (see test_kernels_region): the box + 2 px
        x0, y0 = max(0, int(b1[0]) - 2), max(0, int(b1[1]) - 2)
        x1, y1 = int(np.ceil(b1[2])) + 2, int(np.ceil(b1[3])) + 2
        assert np.array_equal(plain[y0:y1, x0:x1], reused[y0:y1, x0:x1])
    assert DecodeBuffer(max_bytes=10).get(11) is None


def test_region_decoder_is_built_where_a_compiler_and_libjpeg_headers_exist():
    """The partial-decode extension is optional, so a failed build installs silently; where it could
    have been built, its absence is a lost speed-up this test reports (tests/kernels/test_kernels_region.py
    skips itself without the extension)."""
    import shutil

    from raypipe.kernels import decode

    headers = any(os.path.exists(p) for p in ("/usr/include/jpeglib.h", "/usr/local/include/jpeglib.h"))
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not (headers and compiler):
        pytest.skip("no C compiler or libjpeg headers: the extension is not expected")
    assert decode._decode_region is not None
