"""Shared data factories and checkers for the DeviceLoader tests (imported by tests/test_device*.py)."""

from __future__ import annotations

import threading

import numpy as np
import torch

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5}


def packed_batches(n_batches=3, n=8, h=32, w=32, *, seed=0, num_classes=10, extra=True):
    """Dict batches whose pixels are random but whose ids/labels encode the batch and row."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n_batches):
        batch = {
            "image": rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8),
            "label": (np.arange(n) + b) % num_classes,
            "sample_id": np.arange(n, dtype=np.int64) + b * n,
        }
        if extra:
            batch["path"] = [f"img{b}_{i}.jpg" for i in range(n)]
        out.append(batch)
    return out


def reference_normalize(image_nhwc: np.ndarray, mean=MEAN, std=STD) -> torch.Tensor:
    """float64 NCHW reference of (x - mean*255) / (std*255)."""
    x = torch.from_numpy(image_nhwc.astype(np.float64)).permute(0, 3, 1, 2)
    m = torch.tensor([v * 255 for v in mean], dtype=torch.float64).view(1, -1, 1, 1)
    s = torch.tensor([v * 255 for v in std], dtype=torch.float64).view(1, -1, 1, 1)
    return (x - m) / s


def assert_normalized(out: torch.Tensor, image_nhwc: np.ndarray, dtype: torch.dtype, channels_last=True):
    ref = reference_normalize(image_nhwc)
    assert out.dtype == dtype
    assert tuple(out.shape) == tuple(ref.shape)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=fmt)
    err = (out.cpu().double() - ref).abs().max().item()
    assert err <= TOL[dtype], f"max error {err} > {TOL[dtype]} for {dtype}"


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("raypipe-device-loader")]


def constant_images(n: int, h: int = 16, w: int = 16, c: int = 3, dtype=torch.float32) -> torch.Tensor:
    """NCHW batch where every pixel of sample i equals i + 1 (so a mix is readable from the pixels)."""
    return (torch.arange(n, dtype=dtype) + 1).view(n, 1, 1, 1).expand(n, c, h, w).contiguous()
