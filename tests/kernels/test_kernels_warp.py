"""The auto-augment affine warps in C (``raypipe.kernels._warp``) give Pillow's bytes, and timm's
policies run through them give the same images as with Pillow alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from raypipe.kernels import aa_arrays, autoaug

BILINEAR, BICUBIC = Image.Resampling.BILINEAR, Image.Resampling.BICUBIC
needs_warp = pytest.mark.skipif(aa_arrays._warp is None, reason="the _warp C extension is not built")


def test_the_extension_is_built_in_this_environment():
    # setup.py builds it optionally; CI installs with a compiler, so a silent fallback would go unnoticed
    assert aa_arrays._warp is not None


def _matrices(rng: np.random.Generator, w: int, h: int):
    angle = -math.radians(rng.uniform(-45, 45))
    rot = [math.cos(angle), math.sin(angle), 0.0, -math.sin(angle), math.cos(angle), 0.0]
    rot[2] = rot[0] * -w / 2 + rot[1] * -h / 2 + w / 2  # about the centre, as Image.rotate
    rot[5] = rot[3] * -w / 2 + rot[4] * -h / 2 + h / 2
    general = list(rng.uniform(-2, 2, 6))
    general[2], general[5] = general[2] * w, general[5] * h
    return [
        rot,
        (1, rng.uniform(-0.5, 0.5), 0, 0, 1, 0),  # shear x
        (1, 0, 0, rng.uniform(-0.5, 0.5), 1, 0),  # shear y
        (1, 0, rng.uniform(-w, w), 0, 1, rng.uniform(-h, h)),  # translate, partly outside
        (1, 0, 3 * w, 0, 1, 0),  # entirely outside: all fill
        (0, 0, 0, 0, 0, 0),  # every point maps to (0, 0)
        general,
    ]


@needs_warp
@pytest.mark.parametrize("vector", [1, 2, 0], ids=["fastest-available", "avx2-where-available", "scalar"])
def test_affine_gives_pillows_bytes(vector):
    warp = aa_arrays._warp
    warp.set_vector(vector)
    try:
        rng = np.random.default_rng(7)
        sizes = [(1, 1), (1, 9), (9, 1), (3, 5), (17, 13), (64, 48), (224, 224)]
        for k, (w, h) in enumerate(sizes):
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            plain = Image.fromarray(img, "RGB")
            for a in _matrices(rng, w, h):
                for out_size in [(w, h), (w + 3, max(1, h - 1))]:
                    for resample in (BILINEAR, BICUBIC):
                        for fillcolor in (None, (int(rng.integers(256)), 7, 255)):
                            want = Image.Image.transform(
                                plain, out_size, Image.Transform.AFFINE, a, resample, fillcolor=fillcolor
                            )
                            got = aa_arrays.affine_array(img, out_size, Image.Transform.AFFINE, a, resample, fillcolor)
                            assert got is not None  # it ran in C, not Pillow
                            assert np.array_equal(got, np.asarray(want)), (k, a, out_size, resample)
    finally:
        warp.set_vector(True)


@needs_warp
def test_cases_it_does_not_reproduce_go_to_pillow():
    img = np.random.default_rng(1).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    a = (1, 0.2, 0, 0, 1, 0)
    cases = [
        dict(resample=Image.Resampling.NEAREST),
        dict(resample=BILINEAR, fillcolor=5),  # Pillow's colour parsing
        dict(resample=BILINEAR, fillcolor="red"),
    ]
    for kw in cases:
        resample, fill = kw["resample"], kw.get("fillcolor")
        assert aa_arrays.affine_array(img, (30, 20), Image.Transform.AFFINE, a, resample, fill) is None, kw
    short = (1, 0, 0, 0, 1)  # five coefficients: Pillow refuses it, and so does the fast path
    assert aa_arrays.affine_array(img, (30, 20), Image.Transform.AFFINE, short, BILINEAR, None) is None


@needs_warp
def test_extension_rejects_bad_arguments():
    warp = aa_arrays._warp
    src, dst = bytes(2 * 3 * 3), np.zeros((2, 3, 3), np.uint8)
    ok = (src, 3, 2, dst, 3, 2, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 2, b"\0\0\0")
    warp.affine_rgb(*ok)
    for i, bad, message in [
        (1, 4, "packed"),
        (4, 0, "positive"),
        (12, 1, "filter"),
        (13, b"\0", "fill"),
        (6, math.nan, "finite"),
    ]:
        args = list(ok)
        args[i] = bad
        with pytest.raises(ValueError, match=message):
            warp.affine_rgb(*args)


@pytest.mark.parametrize(
    "policy,interpolation",
    [
        ("rand-m9-mstd0.5-inc1", "bilinear"),
        ("rand-m9-mstd0.5-inc1", "bicubic"),
        ("rand-m7-n3-mstd0.5", "random"),
        ("original", "bilinear"),
        ("augmix-m5-w3-d2", "bilinear"),
    ],
)
def test_policies_give_the_same_images_as_with_pillow_alone(monkeypatch, sample_photo, policy, interpolation):
    """Through the C warps (array policies; AugMix runs on PIL images) and with Pillow running every op."""
    img = sample_photo
    mean = (0.485, 0.456, 0.406)
    fast = autoaug.build_auto_augment(policy, (224, 224), mean, interpolation)
    calls = []
    built = aa_arrays._warp is not None
    if built:
        real = aa_arrays._warp

        class Counting:
            def affine_rgb(self, *args):
                calls.append(args[12])  # the filter
                return real.affine_rgb(*args)

        monkeypatch.setattr(aa_arrays, "_warp", Counting())
    got = [autoaug.apply_auto_augment(fast, img, seed) for seed in range(80)]
    for name in ("_warp", "_colorops"):
        monkeypatch.setattr(aa_arrays, name, None)
    slow = autoaug.build_auto_augment(policy, (224, 224), mean, interpolation)
    assert not slow._raypipe_arrays
    want = [autoaug.apply_auto_augment(slow, img, seed) for seed in range(80)]
    for seed, (g, w) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(g, w), f"seed {seed}"
    if built and fast._raypipe_arrays:  # array policies: the geometric ops did run in C (some draws pick them)
        assert calls, "no warp ran in C"
        if interpolation == "random":
            assert {2, 3} <= set(calls)


@pytest.fixture(scope="module")
def sample_photo() -> np.ndarray:
    from raypipe.sample_data import load_photo

    photo = load_photo("astronaut").resize((224, 224), Image.Resampling.BILINEAR)
    return np.ascontiguousarray(np.asarray(photo.convert("RGB")))
