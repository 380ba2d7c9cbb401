"""Eval by default is timm's ``transforms_imagenet_eval`` byte for byte: no DCT-scaled decode unless asked."""

from __future__ import annotations

import io

import image_factory as f
import numpy as np
import pytest
from PIL import Image
from timm.data import create_transform

from raypipe.config import DecodeConfig, EvalAugment
from raypipe.kernels import build_transform, geometry

# 4 photos x 6 sizes: 24 images, several big enough (>= 2x the resize) for a DCT-scaled decode
SIZES = ((1200, 900), (900, 1200), (1000, 750), (640, 480), (500, 375), (300, 420))


def _images():
    return [f.photo_jpeg(name, size) for name in f.PHOTOS for size in SIZES]


def _timm_uint8(data: bytes, aug: EvalAugment) -> np.ndarray:
    t = create_transform(
        aug.input_size,
        is_training=False,
        interpolation=aug.interpolation,
        crop_pct=aug.crop_pct,
        crop_mode=aug.crop_mode,
        use_prefetcher=True,
    )  # use_prefetcher: uint8 tensor, no normalise
    img = Image.open(io.BytesIO(data)).convert("RGB")
    return t(img).permute(1, 2, 0).numpy()


def test_decode_default_is_dct_for_train_only():
    assert DecodeConfig().dct_scaling is None
    assert DecodeConfig().dct_for(True) and not DecodeConfig().dct_for(False)
    assert DecodeConfig(dct_scaling=True).dct_for(False) and not DecodeConfig(dct_scaling=False).dct_for(True)
    with pytest.raises(ValueError, match="dct_scaling"):
        DecodeConfig(dct_scaling="yes")


@pytest.mark.skipif(geometry._resample is None, reason="the _resample C extension is not built")
@pytest.mark.parametrize("crop_pct", [0.875, 1.0])
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_eval_default_is_timms_bytes(crop_pct, interpolation):
    aug = EvalAugment(input_size=224, crop_pct=crop_pct, interpolation=interpolation)
    ours_t = build_transform(aug)  # default DecodeConfig
    images = _images()
    assert len(images) >= 20
    for i, data in enumerate(images):
        ref = _timm_uint8(data, aug)
        ours = ours_t(data)
        assert ours.shape == ref.shape and ours.dtype == ref.dtype == np.uint8
        assert np.array_equal(ours, ref), (i, int((ours != ref).any(-1).sum()))


def test_eval_dct_scaling_only_when_asked():
    aug = EvalAugment(input_size=224)
    data = f.photo_jpeg("coffee", (1200, 900))
    ref = _timm_uint8(data, aug)
    assert np.array_equal(build_transform(aug)(data), ref)
    scaled = build_transform(aug, DecodeConfig(dct_scaling=True))(data)
    assert not np.array_equal(scaled, ref)  # the scaled decode is close to timm's, not equal
    assert np.abs(scaled.astype(int) - ref).mean() <= 2.0
