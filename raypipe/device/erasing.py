"""Random erasing with timm's semantics, vectorised over the batch.

timm's ``RandomErasing`` loops over samples in Python. Here the random parameters of the whole batch
are drawn at once on the host (a few hundred numbers, ``numpy.random.Generator``), then applied on
the device with one masked write per box slot (``count`` slots, a handful at most) - no loop per sample.

Semantics (timm 1.0 ``RandomErasing(probability=prob, mode, max_count=count, num_splits)``):

- each sample is erased with probability ``prob``; with ``num_splits > 1`` the first
  ``N // num_splits`` samples (the clean split) never are;
- an erased sample gets ``k`` boxes, ``k`` uniform in ``1..count``;
- each box tries up to 10 times: area ``U(min_area, max_area) * H * W / k``, aspect ``exp(U(log
  min_aspect, log max_aspect))``, ``h = round(sqrt(area * aspect))``, ``w = round(sqrt(area / aspect))``;
  the first try with ``h < H and w < W`` is taken (none: no box), top/left uniform over valid positions;
- fill: ``const`` 0 (the mean colour, as images are normalised), ``rand`` one normal value per channel
  per box, ``pixel`` a normal value per pixel. Later boxes overwrite earlier ones, as in timm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from raypipe.device._checks import check_int, check_prob, fail

__all__ = ["ERASE_MODES", "Erasing", "ErasePlan", "draw_erasing", "apply_erasing_", "random_erase_"]

ERASE_MODES = ("const", "rand", "pixel")
_TRIES = 10


@dataclass(frozen=True, kw_only=True)
class Erasing:
    """Validated erasing settings; keyword names in errors are the DeviceLoader's (``re_*``)."""

    prob: float = 0.0
    mode: str = "const"
    count: int = 1
    min_area: float = 0.02
    max_area: float = 1 / 3
    min_aspect: float = 0.3
    max_aspect: float | None = None
    num_splits: int = 0

    def __post_init__(self) -> None:
        check_prob("re_prob", self.prob)
        if not isinstance(self.mode, str) or self.mode.lower() not in ERASE_MODES:
            fail("re_mode", self.mode, f"expected one of {ERASE_MODES}")
        object.__setattr__(self, "mode", self.mode.lower())
        check_int("re_count", self.count, 1)
        check_int("re_num_splits", self.num_splits, 0)
        if not 0.0 < check_prob("re_min_area", self.min_area) <= check_prob("re_max_area", self.max_area):
            fail("re_min_area", self.min_area, "expected 0 < re_min_area <= re_max_area <= 1")
        if not isinstance(self.min_aspect, (int, float)) or not self.min_aspect > 0:
            fail("re_min_aspect", self.min_aspect, "expected a number > 0")
        max_aspect = 1.0 / self.min_aspect if self.max_aspect is None else self.max_aspect
        if not isinstance(max_aspect, (int, float)) or not max_aspect >= self.min_aspect:
            fail("re_max_aspect", self.max_aspect, "expected None or a number >= re_min_aspect")
        object.__setattr__(self, "max_aspect", float(max_aspect))

    @property
    def enabled(self) -> bool:
        return self.prob > 0.0


@dataclass(frozen=True)
class ErasePlan:
    """The random draws for one batch: ``boxes[n, k] = (top, left, h, w, active)``; ``colors[n, k, c]``."""

    boxes: np.ndarray  # int64 (N, count, 5)
    colors: np.ndarray | None  # float32 (N, count, C), "rand" mode only


def draw_erasing(rng: np.random.Generator, cfg: Erasing, n: int, c: int, h: int, w: int) -> ErasePlan:
    """Draw every box of a batch of ``n`` images ``c x h x w`` at once (see the module doc)."""
    count = cfg.count
    start = n // cfg.num_splits if cfg.num_splits > 1 else 0
    erase = rng.random(n) < cfg.prob
    erase[:start] = False
    k = np.full(n, count) if count == 1 else rng.integers(1, count + 1, size=n)
    area = rng.uniform(cfg.min_area, cfg.max_area, size=(n, count, _TRIES)) * (h * w) / k[:, None, None]
    aspect = np.exp(rng.uniform(math.log(cfg.min_aspect), math.log(cfg.max_aspect), size=(n, count, _TRIES)))
    bh = np.round(np.sqrt(area * aspect)).astype(np.int64)  # np.round is half-to-even, like round()
    bw = np.round(np.sqrt(area / aspect)).astype(np.int64)
    ok = (bh < h) & (bw < w)
    first = ok.argmax(axis=-1)[..., None]
    bh = np.take_along_axis(bh, first, -1)[..., 0]
    bw = np.take_along_axis(bw, first, -1)[..., 0]
    active = erase[:, None] & (np.arange(count)[None, :] < k[:, None]) & ok.any(axis=-1)
    bh, bw = np.where(active, bh, 0), np.where(active, bw, 0)
    top = np.floor(rng.random((n, count)) * (h - bh + 1)).astype(np.int64)
    left = np.floor(rng.random((n, count)) * (w - bw + 1)).astype(np.int64)
    boxes = np.stack([top, left, bh, bw, active.astype(np.int64)], axis=-1)
    colors = rng.standard_normal((n, count, c), dtype=np.float32) if cfg.mode == "rand" else None
    return ErasePlan(boxes=boxes, colors=colors)


def box_masks(boxes: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(N, 4+) int boxes ``(top, left, h, w, ...)`` -> (N, 1, H, W) bool masks, built on ``boxes``' device."""
    rows = torch.arange(h, device=boxes.device)
    cols = torch.arange(w, device=boxes.device)
    top, left, bh, bw = boxes[:, 0:1], boxes[:, 1:2], boxes[:, 2:3], boxes[:, 3:4]
    in_rows = (rows >= top) & (rows < top + bh)
    in_cols = (cols >= left) & (cols < left + bw)
    return (in_rows[:, :, None] & in_cols[:, None, :]).unsqueeze(1)


def apply_erasing_(
    x: torch.Tensor, plan: ErasePlan, *, mode: str, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Erase ``plan``'s boxes from the NCHW float batch ``x`` in place; ``generator`` feeds "pixel" noise."""
    active = plan.boxes[..., 4].astype(bool)
    if not active.any():
        return x
    boxes = torch.from_numpy(plan.boxes).to(x.device, non_blocking=True)
    colors = None
    if plan.colors is not None:
        colors = torch.from_numpy(plan.colors).to(x.device, non_blocking=True).to(x.dtype)
    n, _, h, w = x.shape
    for k in range(plan.boxes.shape[1]):
        if not active[:, k].any():
            continue
        mask = box_masks(boxes[:, k], h, w)
        if mode == "const":
            x.masked_fill_(mask, 0)
        elif mode == "rand":
            x.copy_(torch.where(mask, colors[:, k, :, None, None], x))
        else:
            noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
            x.copy_(torch.where(mask, noise, x))
    return x


def random_erase_(
    x: torch.Tensor,
    *,
    rng: np.random.Generator,
    generator: torch.Generator | None = None,
    **settings,
) -> torch.Tensor:
    """Functional entry point: ``random_erase_(x, rng=rng, prob=0.5, mode="pixel", count=2)``.

    ``settings`` are ``Erasing``'s fields. ``x`` is an NCHW normalised float batch, erased in place.
    """
    cfg = Erasing(**settings)
    n, c, h, w = x.shape
    return apply_erasing_(x, draw_erasing(rng, cfg, n, c, h, w), mode=cfg.mode, generator=generator)
