"""What a packed batch looks like: parse dicts and ``(image, label, ...)`` tuples, detect the layout.

The first batch of an epoch fixes a ``BatchSpec`` (kind, layout, channels, image size); every later
batch is checked against it with a cheap shape comparison instead of re-detecting anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["LAYOUTS", "BatchSpec", "Parts", "detect_layout", "split_batch", "join_batch"]

LAYOUTS = ("auto", "NHWC", "NCHW")
DEVICE_KEYS = ("image", "label", "sample_id")


@dataclass(frozen=True)
class BatchSpec:
    kind: str  # "dict" or "tuple"
    layout: str  # "NHWC" or "NCHW"
    channels: int
    height: int
    width: int


@dataclass
class Parts:
    """A batch split into what goes to the device and what passes through untouched."""

    kind: str
    image: Any
    label: Any = None
    sample_id: Any = None
    rest: Any = None  # dict (dict batches, original order kept) or tuple of extra items
    fields: dict = None  # a dict batch's other numeric arrays (a field's, one row per image): moved too


def split_batch(batch: Any) -> Parts:
    if isinstance(batch, dict):
        if "image" not in batch:
            raise ValueError(f"batch dict has no 'image' key (keys: {sorted(batch)})")
        label, sid = _array(batch.get("label")), _array(batch.get("sample_id"))
        image = _array(batch["image"])
        fields = {k: v for k, v in batch.items() if k not in DEVICE_KEYS and _rows_of_numbers(v, len(image))}
        return Parts("dict", image, label, sid, batch, fields)
    if isinstance(batch, (tuple, list)) and len(batch) >= 1:
        label = _array(batch[1]) if len(batch) > 1 else None
        return Parts("tuple", _array(batch[0]), label, None, tuple(batch[2:]))
    raise TypeError(f"expected a dict batch or an (image, label, ...) tuple, got {type(batch).__name__}")


def _rows_of_numbers(value: Any, n: int) -> bool:
    """Whether ``value`` is an array of numbers with a row per image (a packed field: moved to the device)."""
    if isinstance(value, torch.Tensor):
        return value.dim() >= 1 and value.shape[0] == n and not value.is_complex()
    return isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == n and value.dtype.kind in "biuf"


def _array(value: Any) -> Any:
    if value is None or isinstance(value, (np.ndarray, torch.Tensor)):
        return value
    return np.asarray(value)


def join_batch(parts: Parts, image: torch.Tensor, label: Any, sample_id: Any, fields: dict | None = None) -> Any:
    """The batch as it came, with its moved parts (``fields``: the moved numeric fields by key)."""
    if parts.kind == "tuple":
        return (image, label, *parts.rest) if label is not None or parts.rest else (image,)
    moved = {"image": image, "label": label, "sample_id": sample_id, **(fields or {})}
    return {key: moved.get(key, value) for key, value in parts.rest.items()}


def detect_layout(shape: tuple, channels: int, declared: str) -> str:
    """ "NHWC" or "NCHW" for a 4-D image batch with ``channels`` channels; ValueError if it can't be."""
    if len(shape) != 4:
        raise ValueError(f"image batch must be 4-D (NHWC or NCHW), got shape {tuple(shape)}")
    nhwc, nchw = shape[3] == channels, shape[1] == channels
    if declared != "auto":
        if not (nhwc if declared == "NHWC" else nchw):
            raise ValueError(f"layout={declared!r} but image shape {tuple(shape)} has no {channels} channels there")
        return declared
    if nhwc and nchw:
        raise ValueError(f"image shape {tuple(shape)} is ambiguous; pass layout='NHWC' or 'NCHW'")
    if not (nhwc or nchw):
        raise ValueError(f"image shape {tuple(shape)} has no dimension of {channels} channels (len(mean))")
    return "NHWC" if nhwc else "NCHW"


def make_spec(parts: Parts, channels: int, declared: str) -> BatchSpec:
    layout = detect_layout(tuple(parts.image.shape), channels, declared)
    _, a, b, _ = parts.image.shape
    h, w = (a, b) if layout == "NHWC" else (b, parts.image.shape[3])
    return BatchSpec(parts.kind, layout, channels, int(h), int(w))


def check_parts(parts: Parts, spec: BatchSpec) -> None:
    """Cheap per-batch check against the epoch's spec; errors name the key and both shapes."""
    img = parts.image
    if not (img.dtype == torch.uint8 if isinstance(img, torch.Tensor) else img.dtype == np.uint8):
        raise ValueError(f"'image' must be uint8, got {img.dtype}")
    c, h, w = spec.channels, spec.height, spec.width
    want = (h, w, c) if spec.layout == "NHWC" else (c, h, w)
    if len(img.shape) != 4 or tuple(img.shape[1:]) != want or parts.kind != spec.kind:
        raise ValueError(f"'image' batch shape {tuple(img.shape)} differs from this epoch's {spec}")
    n = img.shape[0]
    for key, value in (("label", parts.label), ("sample_id", parts.sample_id)):
        if value is not None and tuple(value.shape[:1]) != (n,):
            raise ValueError(f"{key!r} has shape {tuple(value.shape)}, expected ({n},) to match 'image'")
