"""CPU normalise: the C extension's one-pass kernel against torch's path, and the DeviceLoader reading
the source batch in place when that kernel runs (no ring copy)."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest
import torch
from device_helpers import MEAN, STD, TOL, packed_batches, reference_normalize

from raypipe.device import DeviceLoader, Normalize, RandomErasing

norm = importlib.import_module("raypipe.device.normalize")  # the package exports the function by this name
C_DTYPES = [torch.float32, torch.bfloat16]
# (input layout, channels_last output) the C kernel reads: the same memory order in and out, and NHWC
# into contiguous NCHW (timm's prefetcher layout, transposed in the same pass)
C_ORDERS = [("NHWC", True), ("NCHW", False), ("NHWC", False)]


def _path(monkeypatch, name: str) -> None:
    if name == "torch":
        monkeypatch.setattr(norm, "_cext", None)
    elif norm._cext is None:
        pytest.skip("the _affine C extension is not built")


def _torch_rounds_like_the_extension() -> bool:
    """torch's float kernels fuse the multiply-add exactly when its CPU capability has FMA (x86-64)."""
    capability = torch.backends.cpu.get_cpu_capability()
    return norm._cext.fused() == (capability in ("AVX2", "AVX512"))


def _images(n, h, w, c=3, seed=0, layout="NHWC") -> np.ndarray:
    x = np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8)
    x[0, 0, 0] = 0  # both ends of the range
    x[-1, -1, -1] = 255
    return x if layout == "NHWC" else np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def test_the_extension_is_built_in_this_environment():
    # setup.py builds it optionally; CI installs with a compiler, so a silent fallback would go unnoticed
    assert norm._cext is not None
    assert norm.reads_host_directly(torch.float32, "NHWC", True)
    assert not norm.reads_host_directly(torch.float16, "NHWC", True)  # fp16: torch's path
    assert norm.reads_host_directly(torch.float32, "NHWC", False)  # NHWC -> planar NCHW in one pass
    assert not norm.reads_host_directly(torch.float32, "NCHW", True)  # planar -> channels-last: torch's path


@pytest.mark.parametrize("dtype", C_DTYPES)
@pytest.mark.parametrize("layout,channels_last", C_ORDERS)
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 7), (2, 17, 33), (1, 224, 224)])
def test_extension_equals_torch_path(monkeypatch, dtype, layout, channels_last, shape):
    if norm._cext is None:
        pytest.skip("the _affine C extension is not built")
    n, h, w = shape  # odd sizes: vector loops' tails, one-pixel images
    x = torch.from_numpy(_images(n, h, w, layout=layout, seed=h * w))
    kw = dict(mean=MEAN, std=STD, dtype=dtype, layout=layout, channels_last=channels_last)
    got = norm.normalize(x, **kw)
    exact = _torch_rounds_like_the_extension()
    monkeypatch.setattr(norm, "_cext", None)
    want = norm.normalize(x, **kw)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt) and got.dtype == dtype and got.shape == want.shape
    if exact:
        assert torch.equal(got, want)
    else:  # e.g. ATEN_CPU_CAPABILITY=default: one rounding apart at most
        torch.testing.assert_close(got, want, atol=0, rtol=2 * torch.finfo(dtype).eps)
    nhwc = x.numpy() if layout == "NHWC" else x.numpy().transpose(0, 2, 3, 1)
    assert (got.double() - reference_normalize(nhwc)).abs().max().item() <= TOL[dtype]


@pytest.mark.parametrize("path", ["c", "torch"])
@pytest.mark.parametrize("channels", [1, 3, 4])
def test_channel_counts(monkeypatch, path, channels):
    _path(monkeypatch, path)
    x = _images(2, 6, 5, c=channels, seed=channels)
    mean, std = tuple(np.linspace(0.3, 0.6, channels)), tuple(np.linspace(0.2, 0.3, channels))
    got = norm.normalize(x, mean=mean, std=std, dtype=torch.float32)
    ref = reference_normalize(x, mean=mean, std=std)
    assert (got.double() - ref).abs().max().item() <= TOL[torch.float32]


@pytest.mark.parametrize("path", ["c", "torch"])
def test_read_only_numpy_input_needs_no_copy_by_the_caller_and_warns_nothing(monkeypatch, path):
    _path(monkeypatch, path)
    x = _images(2, 8, 8)
    x.flags.writeable = False  # like a batch in Ray's object store
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on non-writable arrays
        got = norm.normalize(x, mean=MEAN, std=STD, dtype=torch.float32)
    assert (got.double() - reference_normalize(x)).abs().max().item() <= TOL[torch.float32]
    assert not x.flags.writeable


@pytest.mark.parametrize("path", ["c", "torch"])
def test_non_contiguous_input_is_normalised_correctly(monkeypatch, path):
    _path(monkeypatch, path)
    big = _images(4, 10, 12)
    x = big[::2, 1:9, ::3]  # strided view: the C kernel declines, torch's path reads it
    out = norm.normalize(x, mean=MEAN, std=STD, dtype=torch.float32)
    assert (out.double() - reference_normalize(np.ascontiguousarray(x))).abs().max().item() <= TOL[torch.float32]
    t = torch.from_numpy(big).permute(0, 3, 1, 2)  # an NCHW view of NHWC memory, declared NCHW
    out = norm.normalize(t, mean=MEAN, std=STD, dtype=torch.float32, layout="NCHW", channels_last=False)
    assert (out.double() - reference_normalize(big)).abs().max().item() <= TOL[torch.float32]


def test_streaming_and_plain_stores_give_the_same_bits():
    """fp32 channels-last rows of a multiple of 8 values into 32-byte aligned memory take the streaming
    loop; any other destination the plain one. Both must write the same bits."""
    if norm._cext is None:
        pytest.skip("the _affine C extension is not built")
    src = _images(3, 7, 8).reshape(-1)  # rows of 8 x 3 = 24 values
    mul = np.random.default_rng(1).uniform(0.01, 0.05, 24).astype(np.float32)
    add = np.random.default_rng(2).uniform(-2.5, 2.5, 24).astype(np.float32)
    raw = np.zeros(src.size * 4 + 128, np.uint8)
    outs = []
    for misalign in (0, 4):  # bytes past a 64-byte boundary
        start = -raw.ctypes.data % 64 + misalign
        dst = raw[start : start + src.size * 4].view(np.float32)
        norm._cext.affine_u8(src, dst, mul, add, 1, 0)
        outs.append(dst.copy())
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    want = src.reshape(-1, 24).astype(np.float32) * mul + add  # numpy rounds each op: fused differs slightly
    np.testing.assert_allclose(outs[0].reshape(-1, 24), want, rtol=1e-6, atol=1e-6)


def test_extension_rejects_mismatched_buffers():
    if norm._cext is None:
        pytest.skip("the _affine C extension is not built")
    src, dst = np.zeros(12, np.uint8), np.zeros(12, np.float32)
    mul = add = np.ones(3, np.float32)
    norm._cext.affine_u8(src, dst, mul, add, 1, 0)
    assert (dst == 1).all()
    bad = [
        ((src, np.zeros(11, np.float32), mul, add, 1, 0), "one output value per src byte"),
        ((src, dst, mul, np.ones(2, np.float32), 1, 0), "same, non-zero length"),
        ((src, dst, mul, add, 5, 0), "multiple of its period"),
        ((src, dst, mul, add, 1, 2), "kind"),
        ((src, np.zeros(12, np.int16), mul, add, 1, 0), "one output value per src byte"),
    ]
    for args, message in bad:
        with pytest.raises(ValueError, match=message):
            norm._cext.affine_u8(*args)
    with pytest.raises(TypeError):
        norm._cext.affine_u8(src, src.copy().tobytes(), mul, add, 1, 0)  # read-only output
    for args, message in bad:  # the planar entry point checks the same (its period is the plane)
        with pytest.raises(ValueError, match=message):
            norm._cext.affine_u8_planar(*args)


def test_planar_kernel_transposes_every_channel_count():
    """affine_u8_planar: images of ``plane`` pixels, interleaved in, one plane per channel out; sizes
    across its pixel blocks (1024) and channel counts besides the specialised 3."""
    if norm._cext is None:
        pytest.skip("the _affine C extension is not built")
    for n, plane, c in [(2, 1, 3), (3, 1500, 3), (2, 2048, 1), (1, 1030, 4), (2, 7, 2)]:
        rng = np.random.default_rng(plane * c)
        src = rng.integers(0, 256, (n, plane, c), dtype=np.uint8)
        mul = rng.uniform(0.01, 0.05, c).astype(np.float32)
        add = rng.uniform(-2.5, 2.5, c).astype(np.float32)
        dst = np.full((n, c, plane), np.nan, np.float32)
        norm._cext.affine_u8_planar(src.reshape(-1), dst.reshape(-1), mul, add, plane, 0)
        want = src.transpose(0, 2, 1).astype(np.float32) * mul[:, None] + add[:, None]
        np.testing.assert_allclose(dst, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_cpu_loader_reads_the_source_in_place_only_when_the_extension_runs(dtype):
    src = packed_batches(3, n=4, h=6, w=5)
    for batch in src:
        batch["image"].flags.writeable = False
    with DeviceLoader(src, normalize=Normalize(dtype=dtype)) as loader:
        outs = list(loader)
        staged = {key for slot in loader._staging.slots for key in slot.buffers}
    direct = norm.reads_host_directly(outs[0]["image"].dtype, "NHWC", True)
    assert ("image" in staged) != direct  # no ring copy of the image when normalise reads it in place
    assert {"label", "sample_id"} <= staged
    for out, batch in zip(outs, src, strict=True):
        err = (out["image"].double() - reference_normalize(batch["image"])).abs().max().item()
        assert err <= TOL[out["image"].dtype]


def test_cpu_loader_results_do_not_depend_on_the_path(monkeypatch):
    src = packed_batches(2, n=3, h=7, w=9, seed=5)
    exact = norm._cext is None or _torch_rounds_like_the_extension()
    with DeviceLoader(src, erasing=RandomErasing(probability=0.5), seed=1) as loader:
        fast = [b["image"] for b in loader]
    monkeypatch.setattr(norm, "_cext", None)
    with DeviceLoader(src, erasing=RandomErasing(probability=0.5), seed=1) as loader:
        slow = [b["image"] for b in loader]
    for a, b in zip(fast, slow, strict=True):
        if exact:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, atol=0, rtol=2 * torch.finfo(torch.float32).eps)


def test_a_batch_that_is_not_4d_is_a_clear_error():
    with pytest.raises(ValueError, match="4-D image batch"):
        norm.normalize(np.zeros((8, 8, 3), np.uint8), mean=MEAN, std=STD, dtype=torch.float32)
