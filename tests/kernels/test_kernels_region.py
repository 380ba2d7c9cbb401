"""The optional partial JPEG decoder: same pixels as a whole-image decode wherever a crop reads them.

Nodes with and without the C extension must produce identical augmented images (content digests are
compared across nodes), so these tests compare bit for bit, not within a tolerance.
"""

from __future__ import annotations

import io
import os

import image_factory as f
import numpy as np
import pytest
import simplejpeg
from PIL import Image

from raypipe.config import DecodeConfig, TrainAugment
from raypipe.kernels import TRUNCATED, SkipImage, build_transform, decode
from raypipe.kernels import sample_rng as rng_for

region = pytest.importorskip("raypipe.kernels._jpegregion", reason="C extension not built")


def _variants() -> dict[str, bytes]:
    im = Image.fromarray(f.photo("coffee", (333, 251)))
    out = {}
    for name, kw in {
        "420": dict(subsampling=2),
        "422": dict(subsampling=1),
        "444": dict(subsampling=0),
        "progressive": dict(progressive=True),
        "q50": dict(quality=50),
    }.items():
        b = io.BytesIO()
        im.save(b, "JPEG", **{"quality": 90, **kw})
        out[name] = b.getvalue()
    b = io.BytesIO()
    im.convert("L").save(b, "JPEG", quality=90)
    out["gray"] = b.getvalue()
    return out


@pytest.mark.parametrize("name,data", list(_variants().items()))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_region_pixels_equal_a_full_decode(name, data, n):
    h0, w0, _, _ = simplejpeg.decode_jpeg_header(data)
    w, h = -(-w0 * n // 8), -(-h0 * n // 8)
    full = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=w, min_height=h)
    assert full.shape == (h, w, 3)
    rng = np.random.default_rng(n)
    m = decode._REGION_MARGIN
    for _ in range(25):
        cw, ch = int(rng.integers(1, w + 1)), int(rng.integers(1, h + 1))
        cx, cy = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        x0, y0, x1, y1 = max(0, cx - m), max(0, cy - m), min(w, cx + cw + m), min(h, cy + ch + m)
        buf = np.zeros(w * h * 3, np.uint8)
        xs, width = region.decode_region(data, n, x0, y0, x1 - x0, y1 - y0, buf, w * 3)
        assert xs <= x0 and xs + width >= x1
        got = buf.reshape(h, w, 3)
        assert np.array_equal(got[cy : cy + ch, cx : cx + cw], full[cy : cy + ch, cx : cx + cw])
        assert not got[y1:].any(), "rows below the region were written"


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_train_transform_is_identical_with_and_without_the_extension(monkeypatch, interpolation):
    aug = TrainAugment(input_size=96, color_jitter=None, interpolation=interpolation)
    datas = list(_variants().values()) + [f.photo_jpeg(p) for p in ("astronaut", "chelsea", "rocket")]
    with_ext = build_transform(aug, DecodeConfig())
    outs = [with_ext(d, rng_for(0, 0, i * 7 + k)) for i, d in enumerate(datas) for k in range(8)]
    monkeypatch.setattr(decode, "_decode_region", None)
    without = build_transform(aug, DecodeConfig())
    again = [without(d, rng_for(0, 0, i * 7 + k)) for i, d in enumerate(datas) for k in range(8)]
    for a, b in zip(outs, again, strict=True):
        assert np.array_equal(a, b)


def test_truncated_file_is_skipped_even_when_the_crop_lies_above_the_cut():
    data = f.photo_jpeg(size=(320, 480))
    cut = data[: len(data) * 3 // 4]  # the bottom rows are missing
    h, w, _, _ = simplejpeg.decode_jpeg_header(cut)
    buf = np.zeros(w * h * 3, np.uint8)
    region.decode_region(cut, 8, 0, 0, w, 16, buf, w * 3)  # the decoder alone cannot tell...
    with pytest.raises(ValueError, match="libjpeg"):  # ...until it reaches the cut
        region.decode_region(cut, 8, 0, 0, w, h, buf, w * 3)
    src = decode.open_image(cut, 10**9)
    assert decode._decode_crop_region(src, 8, (0.0, 0.0, float(w), 16.0), decode.DecodeBuffer()) is None
    t = build_transform(TrainAugment(input_size=32, scale=(0.01, 0.02), color_jitter=None), DecodeConfig())
    for i in range(20):  # small crops, many above the cut: every one is still a TRUNCATED skip
        with pytest.raises(SkipImage) as e:
            t(cut, rng_for(0, 0, i))
        assert e.value.reason == TRUNCATED


def test_decoder_errors_are_value_errors():
    with pytest.raises(ValueError, match="libjpeg"):
        region.decode_region(b"\xff\xd8\xff\xe0" + bytes(64), 8, 0, 0, 8, 8, np.zeros(10**6, np.uint8), 3000)
    good = f.photo_jpeg()
    with pytest.raises(ValueError, match="outside"):
        region.decode_region(good, 8, 0, 0, 10**4, 8, np.zeros(10**6, np.uint8), 3 * 10**4)
    with pytest.raises(ValueError, match="too small"):
        region.decode_region(good, 8, 0, 0, 8, 8, np.zeros(100, np.uint8), 1500)
    with pytest.raises(TypeError):
        region.decode_region(good, 8, 0, 0, 8, 8, b"read-only", 1500)


def test_a_working_dir_copy_without_the_build_uses_the_installed_one(tmp_path):
    """``ray job submit --working-dir .`` ships the sources without *.so and puts them first on
    sys.path; the copy must still find the node's installed build."""
    import shutil
    import subprocess
    import sys

    import raypipe

    package = os.path.dirname(raypipe.__file__)
    shutil.copytree(package, tmp_path / "raypipe", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    code = (
        "import importlib, raypipe, raypipe.kernels.decode as d, raypipe.kernels.aa_arrays as aa; "
        "import raypipe.kernels.geometry as g; n = importlib.import_module('raypipe.device.normalize'); "
        "print(raypipe.__file__); print(d._decode_region is not None); print(n._cext is not None); "
        "print(aa._warp is not None); print(g._resample is not None)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    where, region_found, affine_found, warp_found, resample_found = out.stdout.split()
    assert where.startswith(str(tmp_path)), "the copy was not the one imported"
    assert region_found == "True"
    assert affine_found == "True", "the CPU normalise extension (raypipe.device._affine) was not found"
    assert warp_found == "True", "the auto-augment warp extension (raypipe.kernels._warp) was not found"
    assert resample_found == "True", "the resize extension (raypipe.kernels._resample) was not found"
