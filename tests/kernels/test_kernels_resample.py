"""Pillow's resize in C (``raypipe.kernels._resample``): Pillow's bytes for any size, box, filter and
row stride, with and without the AVX2 passes, and clear errors for what it does not take."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
from PIL import Image

from raypipe.kernels import geometry

R = geometry._resample
needs_ext = pytest.mark.skipif(R is None, reason="the _resample C extension is not built")
BILINEAR, BICUBIC = int(Image.Resampling.BILINEAR), int(Image.Resampling.BICUBIC)


def test_the_extension_is_built_in_this_environment():
    # setup.py builds it optionally; CI installs with a compiler, so a silent fallback would go unnoticed
    assert R is not None


@pytest.fixture(params=[1, 2, 0], ids=["fastest-available", "avx2", "scalar"])
def vector(request):
    if R is None:
        pytest.skip("the _resample C extension is not built")
    on = R.set_vector(request.param)
    if request.param and not on:
        pytest.skip("this CPU has no AVX2")
    yield on
    R.set_vector(True)


def _pillow(src: np.ndarray, box, size, filt) -> np.ndarray:
    return np.asarray(Image.fromarray(np.ascontiguousarray(src)).resize(size, filt, box=box))


def _case(rng: np.random.Generator, i: int):
    """A source (sometimes a strided view), a box inside it and an output size (W, H)."""
    h, w = (int(v) for v in rng.integers(1, 90, 2))
    img = rng.integers(0, 256, (h + 6, w + 8, 3), dtype=np.uint8)
    src = img[3 : 3 + h, 4 : 4 + w] if i % 3 else np.ascontiguousarray(img[:h, :w])
    if i % 2:
        x0, y0 = rng.uniform(0, w * 0.9), rng.uniform(0, h * 0.9)
        box = (x0, y0, rng.uniform(x0 + 0.05, w), rng.uniform(y0 + 0.05, h))
    else:
        box = (0.0, 0.0, float(w), float(h))
    size = (int(rng.integers(1, 160)), int(rng.integers(1, 160)))
    return src, box, size


@pytest.mark.parametrize("filt", [BILINEAR, BICUBIC], ids=["bilinear", "bicubic"])
def test_resample_gives_pillows_bytes(vector, filt):
    rng = np.random.default_rng(filt)
    for i in range(300):
        src, box, size = _case(rng, i)
        out = np.empty((size[1], size[0], 3), np.uint8)
        R.resample(src, out, *box, filt)
        ref = _pillow(src, box, size, filt)
        assert np.array_equal(out, ref), (i, src.shape, box, size, int((out != ref).sum()))


@pytest.mark.parametrize("filt", [BILINEAR, BICUBIC], ids=["bilinear", "bicubic"])
def test_training_sized_crops_and_strided_output(vector, filt):
    # the shapes the pipeline sends: ~0.1-1x of a 500x375 photo to 224 px, written into a region of a
    # larger array (as EvalTransform's border mode does); bytes outside the region stay untouched
    rng = np.random.default_rng(10 + filt)
    photo = rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)
    for _ in range(20):
        w, h = int(rng.integers(120, 501)), int(rng.integers(110, 376))
        x, y = int(rng.integers(0, 501 - w)), int(rng.integers(0, 376 - h))
        canvas = np.full((240, 240, 3), 7, np.uint8)
        R.resample(photo[y : y + h, x : x + w], canvas[8:232, 8:232], 0, 0, w, h, filt)
        ref = _pillow(photo[y : y + h, x : x + w], (0, 0, w, h), (224, 224), filt)
        assert np.array_equal(canvas[8:232, 8:232], ref)
        canvas[8:232, 8:232] = 7
        assert (canvas == 7).all()


@pytest.mark.parametrize("filt", [BILINEAR, BICUBIC], ids=["bilinear", "bicubic"])
def test_a_window_is_the_crop_of_the_whole_resize(vector, filt):
    # resample(..., full_w, full_h, off_x, off_y) = resize((full_w, full_h), box=box).crop(window):
    # timm's eval resize + centre crop; a window may also keep an axis at its size (Pillow skips that
    # pass, here its weights are exactly 1 and 0)
    rng = np.random.default_rng(20 + filt)
    for i in range(150):
        src, box, (fw, fh) = _case(rng, i)
        if i % 4 == 0:
            fh = src.shape[0]  # rows keep their size
        ow, oh = int(rng.integers(1, fw + 1)), int(rng.integers(1, fh + 1))
        ox, oy = int(rng.integers(0, fw - ow + 1)), int(rng.integers(0, fh - oh + 1))
        out = np.empty((oh, ow, 3), np.uint8)
        R.resample(src, out, *box, filt, True, fw, fh, ox, oy)
        ref = _pillow(src, box, (fw, fh), filt)[oy : oy + oh, ox : ox + ow]
        assert np.array_equal(out, ref), (i, src.shape, box, (fw, fh), (ox, oy, ow, oh))


@needs_ext
def test_pass_order_follows_the_installed_pillow():
    # Pillow 13 runs the vertical pass first when rows shrink by more than twice as many as columns
    # (Pillow #9549); each pass rounds to uint8, so the order shows in the bytes. Earlier Pillows always
    # start horizontally: that is a horizontal-only resize followed by a vertical-only one.
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, (116, 21, 3), dtype=np.uint8)
    size = (60, 10)  # 21 -> 60 columns, 116 -> 10 rows: vertical first under the new rule
    old = np.asarray(Image.fromarray(src).resize((60, 116), BILINEAR).resize(size, BILINEAR))
    new = np.asarray(Image.fromarray(src).resize((21, 10), BILINEAR).resize(size, BILINEAR))
    assert not np.array_equal(old, new)
    for rule, ref in ((False, old), (True, new)):
        out = np.empty((10, 60, 3), np.uint8)
        R.resample(src, out, 0, 0, 21, 116, BILINEAR, rule)
        assert np.array_equal(out, ref), rule
    pillow_major = int(importlib.metadata.version("pillow").split(".")[0])
    assert geometry._pillow_vertical_first() == (pillow_major >= 13)


def test_pillow_version_from_pil_when_the_distribution_has_another_name(monkeypatch):
    import PIL

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    monkeypatch.setattr(PIL, "__version__", "9.5.0.post1")  # e.g. Pillow-SIMD: horizontal pass first
    assert geometry._pillow_major() == 9


@needs_ext
def test_bad_arguments_are_value_errors():
    img = np.zeros((20, 30, 3), np.uint8)
    out = np.zeros((10, 10, 3), np.uint8)
    R.resample(img, out, 0, 0, 30, 20, BILINEAR)
    bad = [
        (img.astype(np.float32), out, (0, 0, 30, 20), BILINEAR, "src"),
        (img[:, :, :2], out, (0, 0, 30, 20), BILINEAR, "src"),
        (img[::-1], out, (0, 0, 30, 20), BILINEAR, "src"),  # backward rows
        (img[:, ::2], out, (0, 0, 15, 20), BILINEAR, "src"),  # pixels not packed
        (img, out[:, ::2], (0, 0, 30, 20), BILINEAR, "dst"),
        (img, out, (0, 0, 31, 20), BILINEAR, "inside"),
        (img, out, (-1, 0, 30, 20), BILINEAR, "inside"),
        (img, out, (5, 0, 5, 20), BILINEAR, "empty"),
        (img, out, (0, 0, float("nan"), 20), BILINEAR, "finite"),
        (img, out, (0, 0, 30, 20), 1, "filter"),
    ]
    for src, dst, box, filt, words in bad:
        with pytest.raises(ValueError, match=words):
            R.resample(src, dst, *box, filt)
    for window in ((8, 12, 0, 0), (40, 40, 31, 0), (40, 40, 0, -1)):  # dst (10x10) must fit inside
        with pytest.raises(ValueError, match="window"):
            R.resample(img, out, 0, 0, 30, 20, BILINEAR, True, *window)
    read_only = out.copy()
    read_only.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        R.resample(img, read_only, 0, 0, 30, 20, BILINEAR)


def test_crop_resize_copes_with_views_the_extension_does_not_take():
    # a flipped (negative-stride) decode and a non-contiguous output still give the packed result
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
    box = (4.0, 6.0, 70.0, 50.0)
    plain = geometry.crop_resize(np.ascontiguousarray(img[:, ::-1]), box, (32, 48))
    assert np.array_equal(geometry.crop_resize(img[:, ::-1], box, (32, 48)), plain)
    wide = np.zeros((32, 48, 6), np.uint8)
    res = geometry.crop_resize(img[:, ::-1], box, (32, 48), out=wide[:, :, :3])
    assert np.array_equal(res, plain) and np.array_equal(wide[:, :, :3], plain) and not wide[:, :, 3:].any()
