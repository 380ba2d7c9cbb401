"""A node without an optional C extension gives the same bytes as a node with it.

Each extension (setup.py) is forced off in turn (its loaded module set to None, as ``load_native`` leaves
it when the extension is not built) and the transforms' output compared byte for byte with the native
path's, on a few images that take its code paths: JPEGs (plain and EXIF-rotated), a PNG, train (plain,
colour jitter + grayscale, rand-m9 auto-augment) and eval.
"""

import importlib

import image_factory as f
import numpy as np
import pytest
import torch

from raypipe.config import EvalAugment, TrainAugment
from raypipe.kernels import aa_arrays, build_transform, decode, geometry, sample_rng

norm = importlib.import_module("raypipe.device.normalize")  # the module (the package exports its function)

AUGMENTS = {
    "train": TrainAugment(input_size=96, color_jitter=None),
    "jitter": TrainAugment(input_size=80, color_jitter=(0.4, 0.4, 0.4), grayscale_prob=0.3),
    "randaug": TrainAugment(input_size=80, auto_augment="rand-m9-mstd0.5-inc1"),
    "eval": EvalAugment(input_size=96),
    "eval_bicubic": EvalAugment(input_size=72, interpolation="bicubic", crop_pct=0.9),
}
# extension -> (module holding the loaded extension, attribute)
EXTENSIONS = {
    "_resample": (geometry, "_resample"),
    "_jpegregion": (decode, "_decode_region"),
    "_warp": (aa_arrays, "_warp"),
    "_colorops": (aa_arrays, "_colorops"),
}


def _images() -> list[bytes]:
    return [
        f.photo_jpeg("astronaut", (320, 240)),
        f.photo_jpeg("chelsea", (200, 300)),
        f.exif_jpeg(6, (160, 120)),
        f.encode(f.photo("coffee", (150, 110)), "PNG"),
    ]


def _outputs() -> list[np.ndarray]:
    out = []
    for name, aug in AUGMENTS.items():
        t = build_transform(aug)  # built after patching: a policy picks arrays or PIL images when built
        for i, data in enumerate(_images()):
            for sid in range(3):
                out.append((name, i, sid, t(data, sample_rng(0, 1, 10 * i + sid))))
    return out


def _compare(native, fallback) -> None:
    for (name, i, sid, a), (_, _, _, b) in zip(native, fallback, strict=True):
        assert np.array_equal(a, b), (name, i, sid, int((a != b).sum()))


@pytest.mark.parametrize("ext", sorted(EXTENSIONS) + ["all"])
def test_transforms_without_the_extension_give_the_same_bytes(monkeypatch, ext):
    names = sorted(EXTENSIONS) if ext == "all" else [ext]
    missing = [n for n in names if getattr(*EXTENSIONS[n]) is None]
    if missing:
        pytest.skip(f"not built here, nothing to compare with: {missing}")
    native = _outputs()
    for n in names:
        monkeypatch.setattr(*EXTENSIONS[n], None)
    _compare(native, _outputs())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cpu_normalize_without_affine_gives_the_same_bits(monkeypatch, dtype):
    if norm._cext is None:
        pytest.skip("raypipe.device._affine is not built here")
    x = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (3, 17, 23, 3), dtype=np.uint8))
    kw = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), dtype=dtype)
    native = [norm.normalize(x, channels_last=cl, **kw) for cl in (True, False)]
    monkeypatch.setattr(norm, "_cext", None)
    for cl, a in zip((True, False), native, strict=True):
        b = norm.normalize(x, channels_last=cl, **kw)
        assert torch.equal(
            a.view(torch.int16 if dtype != torch.float32 else torch.int32),
            b.view(torch.int16 if dtype != torch.float32 else torch.int32),
        ), cl
