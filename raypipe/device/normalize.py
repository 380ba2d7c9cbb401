"""uint8 images -> normalised floating point on the device, in the requested memory format.

``(x - mean*255) / (std*255)``, computed as a multiply-add ``x * (1/(std*255)) + (-mean/std)`` in
``img_dtype``. Results agree with timm's within rounding of the dtype (≤ 1-2 ulp). The output's memory
format is chosen up front: NHWC input viewed as NCHW (``permute(0, 3, 1, 2)``) *is* channels_last, so
the default path never copies to change layout.

- GPU: one kernel (``torch.addcmul`` on the uint8 input) does the conversion, any layout change and the
  arithmetic in one memory pass.
- CPU, float32/bfloat16 with input and output in the same memory order (NHWC -> channels_last, NCHW ->
  contiguous), or NHWC into contiguous NCHW (timm's prefetcher layout, which the timm drop-in yields):
  the optional C extension ``_affine`` (setup.py) does it in one fused pass on the calling thread, the
  transpose included, with the same bits as the torch path below; it reads numpy input (also read-only
  memory, such as a batch in Ray's object store) without a copy. ``bench/pipeline_profile.py
  --normalise`` times both paths.
- CPU otherwise: that mixed-dtype kernel with a per-channel broadcast on the innermost (size-3) dimension
  does not vectorise (430-450 µs/img at 224 px fp32). Two passes are 3-6x faster: an exact uint8 -> float
  copy, then an in-place ``addcmul`` over rows of ``W*C`` values with the channel constants tiled along
  the row. Into a fresh output, page faults add ~200-240 µs/img, which is why the DeviceLoader passes
  ``out=`` buffers it recycles.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raypipe._native import load_native
from raypipe._values import fail
from raypipe.config import IMAGENET_MEAN, IMAGENET_STD

__all__ = [
    "IMG_DTYPES",
    "Normalize",
    "default_img_dtype",
    "normalize",
    "parse_img_dtype",
    "nchw_view",
    "nchw_shape",
    "reads_host_directly",
]

_cext = load_native("raypipe.device._affine")  # None when not built
_AFFINE_KINDS = {torch.float32: 0, torch.bfloat16: 1}

IMG_DTYPES = {
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}


def parse_img_dtype(value: str | torch.dtype, name: str = "img_dtype") -> torch.dtype:
    """Accept a torch floating dtype or one of ``IMG_DTYPES``' names; ValueError names ``name``."""
    if isinstance(value, torch.dtype) and value in (torch.float16, torch.bfloat16, torch.float32):
        return value
    if isinstance(value, str) and value.lower() in IMG_DTYPES:
        return IMG_DTYPES[value.lower()]
    raise ValueError(f"{name}={value!r}: expected float16, bfloat16 or float32")


def default_img_dtype(device: torch.device) -> torch.dtype:
    """float16 on CUDA (what AMP models take, half the memory traffic); float32 elsewhere: a CPU model
    is fp32, and fp16 input to it fails in its first layer."""
    return torch.float16 if device.type == "cuda" else torch.float32


@dataclass(frozen=True, kw_only=True)
class Normalize:
    """uint8 batch -> ``(x - mean*255) / (std*255)`` NCHW on the batch's device (see the module doc).

    ``mean`` / ``std`` per channel on timm's 0-1 scale; ``dtype`` float16/bfloat16/float32 or None for
    the device's default (:func:`default_img_dtype`); ``channels_last`` picks the output memory format.

    >>> norm = Normalize(mean=(0.5,) * 3, std=(0.5,) * 3)
    >>> y = norm(torch.full((1, 2, 2, 3), 255, dtype=torch.uint8))
    >>> y.dtype, round(float(y.max()), 5)
    (torch.float32, 1.0)
    """

    mean: Sequence[float] = IMAGENET_MEAN
    std: Sequence[float] = IMAGENET_STD
    dtype: str | torch.dtype | None = None
    channels_last: bool = True

    def __post_init__(self) -> None:
        mean, std = _channel_values("mean", self.mean), _channel_values("std", self.std)
        if len(mean) != len(std):
            fail("std", self.std, f"has {len(std)} values but mean has {len(mean)}")
        if any(v <= 0 for v in std):
            fail("std", self.std, "values must be > 0")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        if self.dtype is not None:
            object.__setattr__(self, "dtype", parse_img_dtype(self.dtype, "dtype"))
        if not isinstance(self.channels_last, bool):
            fail("channels_last", self.channels_last, "expected True or False")

    def dtype_on(self, device: torch.device) -> torch.dtype:
        """The output dtype on ``device``."""
        return self.dtype if self.dtype is not None else default_img_dtype(device)

    def __call__(
        self, x: torch.Tensor | np.ndarray, *, layout: str = "NHWC", out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Normalise the uint8 batch ``x`` in ``layout``; ``out`` (optional) receives the result."""
        device = torch.device("cpu") if isinstance(x, np.ndarray) else x.device
        return normalize(
            x,
            mean=self.mean,
            std=self.std,
            dtype=self.dtype_on(device),
            layout=layout,
            channels_last=self.channels_last,
            out=out,
        )


def _channel_values(name: str, values: Any) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        fail(name, values, "expected a sequence of numbers (0-1 scale, one per channel)")
    if not out or any(v != v for v in out):
        fail(name, values, "expected a non-empty sequence of numbers")
    return out


def nchw_view(x: torch.Tensor, layout: str) -> torch.Tensor:
    """View a 4-D batch as NCHW without copying (NHWC -> channels_last strides)."""
    return x.permute(0, 3, 1, 2) if layout == "NHWC" else x


def nchw_shape(shape: Sequence[int], layout: str) -> tuple[int, int, int, int]:
    """The NCHW shape of a 4-D batch of ``shape`` in ``layout``."""
    if len(shape) != 4:
        raise ValueError(f"expected a 4-D image batch ({layout}), got shape {tuple(shape)}")
    n, a, b, c = shape
    return (n, c, a, b) if layout == "NHWC" else (n, a, b, c)


def reads_host_directly(dtype: torch.dtype, layout: str, channels_last: bool) -> bool:
    """True when :func:`normalize` on the CPU reads its input in place, numpy (even read-only) or torch,
    in one pass (the C extension, for this dtype, from NHWC to either memory format or from NCHW to
    contiguous NCHW)."""
    return _cext is not None and dtype in _AFFINE_KINDS and (layout == "NHWC" or not channels_last)


def normalize(
    x: torch.Tensor | np.ndarray,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    dtype: torch.dtype = torch.float16,
    layout: str = "NHWC",
    channels_last: bool = True,
    scale: float = 255.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Return ``(x - mean*scale) / (std*scale)`` as an NCHW tensor of ``dtype`` on ``x``'s device.

    ``x`` is a uint8 batch in ``layout`` ("NHWC" or "NCHW"): a tensor, or a numpy array (CPU; may be
    read-only); ``mean``/``std`` are on timm's 0-1 scale. The result is channels_last when
    ``channels_last`` else contiguous NCHW. ``x`` is not modified.

    >>> x = torch.full((1, 2, 2, 3), 255, dtype=torch.uint8)
    >>> y = normalize(x, mean=(0.5,) * 3, std=(0.5,) * 3, dtype=torch.float32)
    >>> y.shape, round(float(y.max()), 5), y.is_contiguous(memory_format=torch.channels_last)
    (torch.Size([1, 3, 2, 2]), 1.0, True)
    """
    device = torch.device("cpu") if isinstance(x, np.ndarray) else x.device
    shape = nchw_shape(x.shape, layout)
    c = shape[1]
    if len(mean) != c or len(std) != c:
        raise ValueError(f"mean/std have {len(mean)}/{len(std)} values but the images have {c} channels")
    key = (tuple(mean), tuple(std), scale, dtype, device)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=device, memory_format=fmt)
    elif (tuple(out.shape), out.dtype, out.device) != (shape, dtype, device) or not out.is_contiguous(
        memory_format=fmt
    ):
        got, want = f"{out.dtype} {tuple(out.shape)} on {out.device}", f"{dtype} {shape} ({fmt})"
        raise ValueError(f"out is {got}, expected {want}")
    if device.type != "cpu":
        mul, add = _affine(*key)
        return torch.addcmul(add, nchw_view(x, layout), mul, out=out)
    if reads_host_directly(dtype, layout, channels_last) and _normalize_fused(x, out, key, layout, channels_last):
        return out
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x if x.flags.writeable else x.copy())  # torch refuses read-only memory
    v = nchw_view(x, layout)
    n, c, h, w = out.shape
    if channels_last:  # memory order is NHWC: rows of W*C values, constants tiled W times
        mul, add = _affine_tiled(*key, w)
        # Pieces of under torch's parallel grain (32768 values): each op then runs on this thread
        # alone. With torch's intra-op threads, on cores the augmentation workers keep busy, the
        # threads wait on each other at every op, and the CPU per image grows by 40 % or more
        # (``python bench/pipeline_profile.py --normalise --threads N`` shows it).
        # Per image, so the source is sliced as a view in either input layout (never copied whole).
        src, dst = v.permute(0, 2, 3, 1), out.permute(0, 2, 3, 1)  # (N, H, W, C) views
        step = max(1, (_SERIAL_ELEMENTS - 1) // (w * c))
        for i in range(n):
            for r in range(0, h, step):
                part = dst[i, r : r + step]
                part.copy_(src[i, r : r + step])  # exact: every uint8 value is representable in fp16/bf16/fp32
                flat = part.view(-1, w * c)
                torch.addcmul(add, flat, mul, out=flat)
        return out
    # NCHW: rows of H*W values of one channel, one constant per row. A few images at a time, so the
    # second pass reads what the first just wrote from cache (fp32: -18 %).
    mul, add = (t.view(1, c, 1) for t in _affine(*key))
    step = max(1, _CHUNK_BYTES // max(1, c * h * w * out.element_size()))
    for i in range(0, n, step):
        part = out[i : i + step]
        part.copy_(v[i : i + step])  # exact: every uint8 value is representable in fp16/bf16/fp32
        rows = part.view(-1, c, h * w)
        torch.addcmul(add, rows, mul, out=rows)
    return out


def _normalize_fused(
    x: torch.Tensor | np.ndarray, out: torch.Tensor, key: tuple, layout: str, channels_last: bool
) -> bool:
    """One pass through the C extension when ``x`` is C-contiguous uint8 memory; False to fall back."""
    if isinstance(x, torch.Tensor):
        if x.dtype != torch.uint8 or not x.is_contiguous():
            return False
        x = x.detach().numpy()
    elif x.dtype != np.uint8 or not x.flags.c_contiguous:
        return False
    dtype, kind = key[3], _AFFINE_KINDS[key[3]]
    dst = out.permute(0, 2, 3, 1) if channels_last else out  # memory order, contiguous by the check above
    dst = (dst.view(torch.int16) if dtype == torch.bfloat16 else dst).detach().numpy()
    n, c, h, w = out.shape
    if channels_last == (layout == "NHWC"):  # the same memory order in and out
        mul, add = _host_constants(*key, w * c if channels_last else c)
        _cext.affine_u8(x, dst, mul, add, 1 if channels_last else h * w, kind)
    else:  # NHWC in, planar NCHW out: the transpose in the same pass
        mul, add = _host_constants(*key, c)
        _cext.affine_u8_planar(x, dst, mul, add, h * w, kind)
    return True


_CHUNK_BYTES = 2**21
_SERIAL_ELEMENTS = 32768  # at::internal::GRAIN_SIZE: smaller TensorIterator ops run single-threaded


@functools.lru_cache(maxsize=64)
def _affine(mean: tuple, std: tuple, scale: float, dtype: torch.dtype, device: torch.device):
    # Cached: one tiny host->device copy per (values, dtype, device), not one per batch. Never written.
    # Folded in float64, rounded once to the dtype.
    mul = [1.0 / (s * scale) for s in std]
    add = [-m / s for m, s in zip(mean, std, strict=True)]
    as_t = lambda vals: torch.tensor(vals, dtype=torch.float64).to(dtype).view(1, -1, 1, 1).to(device)
    return as_t(mul), as_t(add)


@functools.lru_cache(maxsize=64)
def _affine_tiled(mean: tuple, std: tuple, scale: float, dtype: torch.dtype, device: torch.device, width: int):
    mul, add = _affine(mean, std, scale, dtype, device)
    return mul.view(-1).repeat(width), add.view(-1).repeat(width)


@functools.lru_cache(maxsize=64)
def _host_constants(mean: tuple, std: tuple, scale: float, dtype: torch.dtype, device: torch.device, period: int):
    # The dtype-rounded constants (as the torch path uses them), widened to float32 for the C pass,
    # tiled to ``period`` values (W*C for channels-last rows, C for planes). Never written.
    mul, add = _affine(mean, std, scale, dtype, device)
    reps = period // mul.numel()
    as_np = lambda t: t.view(-1).float().repeat(reps).numpy()
    return as_np(mul), as_np(add)
