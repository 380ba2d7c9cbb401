"""timm's auto-augment ops on arrays (``raypipe.kernels.aa_arrays`` + the ``_colorops`` extension) give
the bytes of timm's ops on Pillow: op by op, for whole policies, with and without AVX2."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
from PIL import Image

from raypipe.kernels import aa_arrays, autoaug

needs_colorops = pytest.mark.skipif(not aa_arrays.available(), reason="the _colorops C extension is not built")
MEAN = (0.485, 0.456, 0.406)


def test_the_extension_is_built_in_this_environment():
    # setup.py builds it optionally; CI installs with a compiler, so a silent fallback would go unnoticed
    assert aa_arrays.available()


@pytest.fixture(params=[1, 2, 0], ids=["fastest", "avx2", "scalar"])
def vector(request):
    ops = aa_arrays._colorops
    if ops is None:
        pytest.skip("the _colorops C extension is not built")
    ops.set_vector(request.param)
    yield ops.vector_path()
    ops.set_vector(1)


def _images(rng: np.random.Generator) -> list[np.ndarray]:
    """Odd sizes (vector tails, 3x3-filter borders, images under 3x3; 260x300 runs the vector luma sum
    past one flush of its int32 lanes), flat and two-level images (the tables' special cases) and a
    photo-like gradient."""
    sizes = [(1, 1), (2, 9), (3, 3), (7, 5), (31, 37), (64, 48), (260, 300)]
    noise = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    flat = np.full((9, 11, 3), 77, np.uint8)
    two = np.where(rng.random((10, 12, 1)) < 0.5, 30, 200).astype(np.uint8).repeat(3, axis=2)
    narrow = rng.integers(100, 140, (16, 16, 3), dtype=np.uint8)  # autocontrast stretches a lot
    grad = np.broadcast_to(np.linspace(0, 255, 96, dtype=np.uint8)[None, :, None], (80, 96, 3)).copy()
    grad[..., 1] = grad[..., 1][::-1]
    return [*noise, flat, two, narrow, grad]


def _timm():
    return autoaug.timm_auto_augment()


def _pil_op(fn, img: np.ndarray, *args) -> np.ndarray:
    out = fn(Image.fromarray(img, "RGB"), *args)
    return np.asarray(out.convert("RGB"))


def _array_op(fn, img: np.ndarray, *args) -> np.ndarray:
    return aa_arrays.array_ops(_timm(), autoaug._posterize)[fn](aa_arrays.ArrayImage(img), *args).array


@needs_colorops
def test_colour_ops_give_pillows_bytes(vector):
    t = _timm()
    rng = np.random.default_rng(3)
    factors = [0.0, 0.1, 0.37, 0.5, 1.0, 1.3, 1.9, 2.5, -0.4]
    cases = [(t.auto_contrast, ()), (t.equalize, ()), (t.invert, ())]
    cases += [(t.solarize, (v,)) for v in (0, 1, 77, 128, 200.5, 255, 256)]
    cases += [(t.solarize_add, (v,)) for v in (0, 30, 110, 300, 12.5)]
    cases += [(t.solarize_add, (40, 200))]
    cases += [(autoaug._posterize, (b,)) for b in (0, 1, 3, 4, 7, 8)]
    cases += [(fn, (f,)) for fn in (t.brightness, t.contrast, t.color, t.sharpness) for f in factors]
    for img in _images(rng):
        for fn, args in cases:
            want = _pil_op(fn, img, *args)
            got = _array_op(fn, img, *args)
            assert got.dtype == np.uint8 and got.shape == img.shape
            assert np.array_equal(got, want), (fn.__name__, args, img.shape)


@needs_colorops
def test_geometric_ops_on_array_images_give_pillows_bytes():
    """timm's own rotate / shear / translate functions, handed an ArrayImage: Pillow's rotate code builds
    the matrix (fast paths at 0/90/180/270 degrees included), the warp runs in _warp or Pillow."""
    t = _timm()
    rng = np.random.default_rng(5)
    fills = [(124, 116, 104), (0, 0, 0)]
    cases = [(t.rotate, (d,)) for d in (0, 90, 180, 270, -90, 12.5, -29.9, 360)]
    cases += [(t.shear_x, (0.27,)), (t.shear_y, (-0.3,)), (t.translate_x_rel, (0.45,)), (t.translate_y_rel, (-0.2,))]
    cases += [(t.translate_x_abs, (10.5,))]
    for img in _images(rng)[3:]:
        for fn, args in cases:
            for resample in (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC, Image.Resampling.NEAREST):
                fill = fills[int(rng.integers(2))]
                want = np.asarray(fn(Image.fromarray(img, "RGB"), *args, resample=resample, fillcolor=fill))
                got = fn(aa_arrays.ArrayImage(img), *args, resample=resample, fillcolor=fill).array
                assert np.array_equal(got, want), (fn.__name__, args, resample, img.shape)


def _reference(policy: str, interpolation: str):
    """timm's policy object on Pillow alone (raypipe's posterize, which only differs at 0 bits)."""
    return autoaug.timm_policy(policy, (224, 224), MEAN, interpolation)


def _run_reference(ref, img: np.ndarray, seed: int) -> np.ndarray:
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    return np.asarray(ref(Image.fromarray(img, "RGB")).convert("RGB"))


POLICIES = [
    ("rand-m9-mstd0.5-inc1", "bilinear", True),
    ("rand-m9-mstd0.5-inc1", "bicubic", True),
    ("rand-m15-mstd0.5-inc1-mmax15", "random", True),
    ("rand-m7-n3-mstd0.5", "random", True),
    ("rand-m9-mstd101", "bilinear", True),  # uniform magnitudes
    ("original", "bilinear", True),
    ("v0r", "random", True),
    ("3a", "bilinear", False),  # GaussianBlur, Desaturate: PIL images
    ("augmix-m5-w3-d2", "bilinear", False),  # AugMix blends PIL images itself
]


@pytest.mark.parametrize("policy,interpolation,on_arrays", POLICIES)
def test_policies_give_timms_images(sample_photo, policy, interpolation, on_arrays):
    ours = autoaug.build_auto_augment(policy, (224, 224), MEAN, interpolation)
    assert ours._raypipe_arrays is (on_arrays and aa_arrays.available())
    ref = _reference(policy, interpolation)
    images = [sample_photo, *_images(np.random.default_rng(11))[4:]]
    for k, img in enumerate(images):
        for seed in range(60 if k == 0 else 12):
            got = autoaug.apply_auto_augment(ours, img, seed)
            want = _run_reference(ref, img, seed)
            assert got.shape == want.shape and np.array_equal(got, want), (k, seed)


@needs_colorops
def test_policy_falls_back_to_pil_images_when_an_op_reaches_past_the_array_image(monkeypatch, sample_photo, caplog):
    """A newer Pillow/timm touching PIL internals the ArrayImage lacks: the sample still gets timm's image
    (the PIL path, re-seeded), with one warning, and the policy stays on PIL images."""
    ours = autoaug.build_auto_augment("rand-m9-mstd0.5-inc1", (224, 224), MEAN, "bilinear")
    ref = _reference("rand-m9-mstd0.5-inc1", "bilinear")

    def missing(self, *args, **kwargs):
        raise AttributeError("'ArrayImage' object has no attribute 'im'")

    monkeypatch.setattr(aa_arrays.ArrayImage, "transform", missing)
    monkeypatch.setattr(aa_arrays.ArrayImage, "rotate", missing)
    with caplog.at_level(logging.WARNING, logger="raypipe.kernels.autoaug"):
        for seed in range(40):
            got = autoaug.apply_auto_augment(ours, sample_photo, seed)
            assert np.array_equal(got, _run_reference(ref, sample_photo, seed)), seed
    assert ours._raypipe_arrays is False  # some seed drew a geometric op
    assert len([r for r in caplog.records if "fall back to PIL" in r.message]) == 1


def test_without_the_extension_policies_run_on_pil_images(monkeypatch, sample_photo):
    monkeypatch.setattr(aa_arrays, "_colorops", None)
    ours = autoaug.build_auto_augment("rand-m9-mstd0.5-inc1", (224, 224), MEAN, "bilinear")
    assert ours._raypipe_arrays is False
    ref = _reference("rand-m9-mstd0.5-inc1", "bilinear")
    for seed in range(20):
        want = _run_reference(ref, sample_photo, seed)
        assert np.array_equal(autoaug.apply_auto_augment(ours, sample_photo, seed), want)


@needs_colorops
def test_extension_rejects_bad_arguments():
    ops = aa_arrays._colorops
    img, out = np.zeros((4, 5, 3), np.uint8), np.zeros((4, 5, 3), np.uint8)
    with pytest.raises(ValueError, match="768"):
        ops.lut(img, out, bytes(256))
    with pytest.raises(ValueError, match="like src"):
        ops.lut(img, np.zeros((4, 4, 3), np.uint8), bytes(768))
    with pytest.raises(ValueError, match="multiple of 3"):
        ops.minmax(bytes(4))
    with pytest.raises(ValueError, match="empty"):
        ops.minmax(b"")
    with pytest.raises(ValueError, match="768 int64"):
        ops.histogram(img, np.zeros(256, np.int64))
    with pytest.raises(ValueError, match="0..255"):
        ops.blend_const(img, out, 256, 0.5)
    with pytest.raises(ValueError, match="is not"):
        ops.blend_smooth(img, out, 4, 5 + 1, 0.5)
    with pytest.raises(ValueError, match="must not be src"):
        ops.blend_smooth(img, img, 5, 4, 0.5)
    with pytest.raises(TypeError):
        ops.lut(img, bytes(60), bytes(768))  # dst must be writable


@pytest.fixture(scope="module")
def sample_photo() -> np.ndarray:
    from raypipe.sample_data import load_photo

    photo = load_photo("astronaut").resize((224, 224), Image.Resampling.BILINEAR)
    return np.ascontiguousarray(np.asarray(photo.convert("RGB")))
