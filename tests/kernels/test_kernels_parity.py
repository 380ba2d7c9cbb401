"""Parity with timm / torchvision's Pillow path: fixed-parameter apply steps, eval, RRC statistics."""

from __future__ import annotations

import io
import math
import random

import image_factory as f
import numpy as np
import pytest
import torchvision.transforms.functional as TF
from kernel_checks import mae
from PIL import Image
from timm.data.transforms import RandomResizedCropAndInterpolation
from timm.data.transforms_factory import transforms_imagenet_eval

from raypipe.config import DecodeConfig, EvalAugment
from raypipe.kernels import (
    aa_arrays,
    build_transform,
    color,
    crop_resize,
    decode_for_crop,
    geometry,
    open_image,
    rrc_params,
)

PIL_INTERP = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
# (x0, y0, x1, y1) on a 500x375 photo: 'big' is shrunk ~2x (full decode: only 1/8..4/8 DCT scales are
# faster than a full decode), 'small' is enlarged; 'dct' on a 1000x750 photo is DCT-scaled (3/8).
BOXES = {"big": (10, 5, 490, 370), "mid": (50, 40, 330, 300), "small": (200, 100, 300, 180)}
PHOTO_SIZE = {"dct": (1000, 750)}
BOXES["dct"] = (20, 10, 980, 740)


def pil_rgb(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.mark.parametrize("backend", ["pillow-c", "opencv"])
@pytest.mark.parametrize("interp", ["bilinear", "bicubic"])
@pytest.mark.parametrize("box_name", sorted(BOXES))
def test_crop_resize_matches_pillow(monkeypatch, backend, interp, box_name):
    if backend == "opencv":
        monkeypatch.setattr(geometry, "_resample", None)
    elif geometry._resample is None:
        pytest.skip("the _resample C extension is not built")
    box = BOXES[box_name]
    for name in f.PHOTOS:
        size = PHOTO_SIZE.get(box_name, (500, 375))
        data = f.photo_jpeg(name, size)
        ref = pil_rgb(data).resize((224, 224), PIL_INTERP[interp], box=box)
        pixels, b = decode_for_crop(open_image(data, 10**9), box, (224, 224))
        if box_name == "dct":
            assert pixels.shape[0] < size[1], "expected a DCT-scaled decode for a big crop"
        ours = crop_resize(pixels, b, (224, 224), interp)
        assert mae(ours, ref) <= 2.0, (name, mae(ours, ref))
        # torchvision's resized_crop (what timm's RRC calls) crops first, then resizes
        i, j = box[1], box[0]
        mode = TF.InterpolationMode(interp)
        tv = np.asarray(TF.resized_crop(pil_rgb(data), i, j, box[3] - i, box[2] - j, [224, 224], mode))
        assert mae(ours, tv) <= 2.0
        if backend == "pillow-c" and box_name != "dct":  # full-size decode: timm's very bytes
            assert np.array_equal(ours, tv), (name, int((ours != tv).sum()))


def test_flips_fold_into_the_resize():
    img = f.photo("chelsea", (300, 200))
    box = (20.0, 10.0, 260.0, 190.0)
    plain = crop_resize(img, box, (96, 128))
    assert np.array_equal(crop_resize(img, box, (96, 128), hflip=True), plain[:, ::-1])
    assert np.array_equal(crop_resize(img, box, (96, 128), vflip=True), plain[::-1])


EVAL_CONFIGS = [
    dict(crop_mode="center"),
    dict(crop_mode="center", crop_pct=0.95, input_size=(192, 256)),
    dict(crop_mode="squash", crop_pct=1.0),
    dict(crop_mode="squash", crop_pct=0.9, interpolation="bicubic"),
    dict(crop_mode="border"),
    dict(crop_mode="border", input_size=(256, 160), crop_pct=1.0),
]


def _eval_pair(kw, decode=None):
    aug = EvalAugment(**kw)
    ref_t = transforms_imagenet_eval(
        img_size=aug.input_size,
        crop_pct=aug.crop_pct,
        crop_mode=aug.crop_mode,
        interpolation=aug.interpolation,
        use_prefetcher=True,
    )
    return ref_t, build_transform(aug, decode)


@pytest.mark.parametrize("kw", EVAL_CONFIGS, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_eval_matches_timm(kw):
    ref_t, ours_t = _eval_pair(kw)
    for name in ("astronaut", "chelsea", "coffee"):
        for size in ((500, 375), (300, 420)):
            data = f.photo_jpeg(name, size)
            ref = ref_t(pil_rgb(data)).permute(1, 2, 0).numpy()
            ours = ours_t(data)
            assert ours.shape == ref.shape
            assert mae(ours, ref) <= 2.0, (name, size, mae(ours, ref))


@pytest.mark.skipif(geometry._resample is None, reason="the _resample C extension is not built")
@pytest.mark.parametrize("kw", EVAL_CONFIGS, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_eval_is_timms_bytes_from_a_full_size_decode(kw):
    # with a full-size decode (always, without DCT scaling) the eval image is timm's resize + centre
    # crop / pad byte for byte; a DCT-scaled decode (big images) stays within the MAE bound above
    ref_t, ours_t = _eval_pair(kw, DecodeConfig(dct_scaling=False))
    for name in ("astronaut", "coffee"):
        for size in ((500, 375), (300, 420), (1200, 900)):
            data = f.photo_jpeg(name, size)
            ref = ref_t(pil_rgb(data)).permute(1, 2, 0).numpy()
            ours = ours_t(data)
            assert np.array_equal(ours, ref), (name, size, int((ours != ref).any(-1).sum()))


def _stats(boxes, width, height):
    b = np.asarray(boxes, float)  # (top, left, h, w)
    area = b[:, 2] * b[:, 3] / (width * height)
    log_aspect = np.log(b[:, 3] / b[:, 2])
    centre = (b[:, 1] + b[:, 3] / 2) / width
    return np.array([x for v in (area, log_aspect, centre) for x in (v.mean(), v.std())])


@pytest.mark.parametrize(
    "width,height,scale,ratio",
    [
        (500, 375, (0.08, 1.0), (3 / 4, 4 / 3)),
        (400, 100, (0.3, 1.0), (0.5, 2.0)),
        (640, 480, (0.9, 1.0), (1.0, 1.0)),
    ],
)
def test_rrc_distribution_matches_timm(width, height, scale, ratio):
    n = 5000
    rng = np.random.default_rng(0)
    ours = [rrc_params(width, height, scale, ratio, rng) for _ in range(n)]
    random.seed(0)
    proxy = Image.new("RGB", (width, height))
    theirs = [RandomResizedCropAndInterpolation.get_params(proxy, scale, ratio) for _ in range(n)]
    np.testing.assert_allclose(_stats(ours, width, height), _stats(theirs, width, height), atol=0.02)
    for t, le, h, w in ours:
        assert 0 <= t and t + h <= height and 0 <= le and le + w <= width and h > 0 and w > 0


def test_rrc_fallback_is_timms_centre_crop():
    # scale above what fits with this ratio: all 10 attempts fail, fallback clamps to max(ratio)
    rng = np.random.default_rng(0)
    ours = rrc_params(1000, 100, (1.0, 1.0), (0.5, 2.0), rng)
    random.seed(0)
    proxy = Image.new("RGB", (1000, 100))
    theirs = RandomResizedCropAndInterpolation.get_params(proxy, (1.0, 1.0), (0.5, 2.0))
    assert ours == theirs == (0, 400, 100, 200)


@pytest.mark.parametrize("factor", [0.6, 1.4])
@pytest.mark.parametrize("backend", ["colorops", "opencv"])
def test_colour_ops_match_torchvision(monkeypatch, backend, factor):
    if backend == "opencv":
        monkeypatch.setattr(aa_arrays, "_colorops", None)
    elif not aa_arrays.available():
        pytest.skip("the _colorops C extension is not built")
    img = f.photo("astronaut", (224, 224))
    p = Image.fromarray(img)
    assert mae(color.adjust_hue(img, factor - 1.0), TF.adjust_hue(p, factor - 1.0)) <= 1.0
    sigma = factor
    assert mae(color.gaussian_blur(img, sigma), TF.gaussian_blur(p, color.BLUR_KERNEL, sigma)) <= 0.1
    pairs = [
        (color.adjust_brightness(img, factor), TF.adjust_brightness(p, factor)),
        (color.adjust_contrast(img, factor), TF.adjust_contrast(p, factor)),
        (color.adjust_saturation(img, factor), TF.adjust_saturation(p, factor)),
        (color.to_grayscale(img), TF.rgb_to_grayscale(p, 3)),
    ]
    for ours, theirs in pairs:
        if backend == "colorops":  # Pillow's own arithmetic: torchvision's bytes
            assert np.array_equal(ours, np.asarray(theirs))
        else:
            assert mae(ours, theirs) <= 0.1


@pytest.mark.skipif(not aa_arrays.available(), reason="the _colorops C extension is not built")
def test_jitter_is_torchvisions_color_jitter_on_pillow():
    """Random factors and orders, odd sizes and flat images: ColorJitter(0.4, 0.4, 0.4) byte for byte."""
    rng = np.random.default_rng(5)
    images = [
        f.photo("chelsea", (97, 61)),
        f.photo("coffee", (224, 224)),
        np.full((9, 7, 3), 200, np.uint8),
        rng.integers(0, 256, (33, 17, 3), dtype=np.uint8),
    ]
    for i in range(60):
        img = images[i % len(images)]
        params = color.jitter_params((0.4, 0.4, 0.4), rng)
        theirs = Image.fromarray(img)
        for op in params.order:
            if op == 0:
                theirs = TF.adjust_brightness(theirs, params.brightness)
            elif op == 1:
                theirs = TF.adjust_contrast(theirs, params.contrast)
            elif op == 2:
                theirs = TF.adjust_saturation(theirs, params.saturation)
        assert np.array_equal(color.apply_jitter(img, params), np.asarray(theirs)), (i, params)


def test_jitter_params_like_torchvision():
    rng = np.random.default_rng(0)
    draws = [color.jitter_params((0.4, 0.3, 0.2, 0.1), rng) for _ in range(4000)]
    b = np.array([d.brightness for d in draws])
    h = np.array([d.hue for d in draws])
    assert 0.6 <= b.min() and b.max() <= 1.4 and abs(b.mean() - 1.0) < 0.02
    assert -0.1 <= h.min() and h.max() <= 0.1
    assert sorted(draws[0].order) == [0, 1, 2, 3]
    firsts = np.bincount([d.order[0] for d in draws], minlength=4) / len(draws)
    assert np.all(np.abs(firsts - 0.25) < 0.03)
    assert color.jitter_params((0.4, 0.0, 0.4), rng).contrast is None


def test_scaled_decode_keeps_crop_at_least_output_size():
    data = f.photo_jpeg("astronaut", (512, 512))
    src = open_image(data, 10**9)
    cases = [((0, 0, 512, 512), (64, 64)), ((0, 0, 512, 512), (100, 100)), ((100, 100, 300, 300), (224, 224))]
    for box, out in cases:
        pixels, b = decode_for_crop(src, box, out)
        if pixels.shape[0] < 512:  # scaled: the crop must still cover the output
            assert b[2] - b[0] >= out[1] - 1e-6 and b[3] - b[1] >= out[0] - 1e-6
        else:
            assert b == box
        assert math.isclose((b[2] - b[0]) / (box[2] - box[0]), pixels.shape[1] / 512, rel_tol=0.02)
    assert decode_for_crop(src, (0, 0, 512, 512), (64, 64))[0].shape == (64, 64, 3)
