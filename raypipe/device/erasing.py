"""Random erasing with timm's semantics, vectorised over the batch.

timm's ``RandomErasing`` loops over samples in Python. Here the random parameters of the whole batch
are drawn at once on the host (a few hundred numbers, ``numpy.random.Generator``), then applied on
the device with one masked write per box slot (``max_count`` slots, a handful at most) - no loop per
sample.

Semantics (timm 1.0 ``RandomErasing``, same argument names and defaults, less ``device``):

- each sample is erased with probability ``probability``; with ``num_splits > 1`` the first
  ``N // num_splits`` samples (the clean split) never are;
- an erased sample gets ``k`` boxes, ``k`` uniform in ``min_count..max_count``;
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

from raypipe._values import check_int, check_prob, fail, is_number

__all__ = ["ERASE_MODES", "RandomErasing", "ErasePlan", "draw_erasing", "apply_erasing_"]

ERASE_MODES = ("const", "rand", "pixel")
_TRIES = 10


@dataclass(frozen=True, kw_only=True)
class RandomErasing:
    """timm's ``RandomErasing`` for a normalised NCHW float batch; call it or let a ``DeviceLoader`` do.

    ``None`` where timm accepts it: ``max_aspect`` (= ``1 / min_aspect``), ``max_count`` (=
    ``min_count``), ``probability`` (= 0, off). ``mode`` ``""`` is ``"const"``, as in timm.

    >>> erase = RandomErasing(probability=1.0, mode="const")
    >>> x = erase(torch.ones(2, 3, 8, 8), rng=np.random.default_rng(0))
    >>> bool((x == 0).any(dim=(1, 2, 3)).all())
    True
    """

    probability: float | None = 0.5
    min_area: float = 0.02
    max_area: float = 1 / 3
    min_aspect: float = 0.3
    max_aspect: float | None = None
    mode: str = "const"
    min_count: int = 1
    max_count: int | None = None
    num_splits: int = 0

    def __post_init__(self) -> None:
        prob = 0.0 if self.probability is None else self.probability
        object.__setattr__(self, "probability", check_prob("probability", prob))
        mode = self.mode.lower() if isinstance(self.mode, str) else self.mode
        mode = "const" if mode == "" else mode
        if mode not in ERASE_MODES:
            fail("mode", self.mode, f"expected one of {ERASE_MODES}")
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "min_count", check_int("min_count", self.min_count, 1))
        max_count = self.min_count if self.max_count is None else self.max_count
        object.__setattr__(self, "max_count", check_int("max_count", max_count, self.min_count))
        object.__setattr__(self, "num_splits", check_int("num_splits", self.num_splits, 0))
        if not 0.0 < check_prob("min_area", self.min_area) <= check_prob("max_area", self.max_area):
            fail("min_area", self.min_area, "expected 0 < min_area <= max_area <= 1")
        if not is_number(self.min_aspect) or not self.min_aspect > 0:
            fail("min_aspect", self.min_aspect, "expected a number > 0")
        max_aspect = 1.0 / self.min_aspect if self.max_aspect is None else self.max_aspect
        if not is_number(max_aspect) or not max_aspect >= self.min_aspect:
            fail("max_aspect", self.max_aspect, "expected None or a number >= min_aspect")
        object.__setattr__(self, "max_aspect", float(max_aspect))

    @property
    def enabled(self) -> bool:
        return self.probability > 0.0

    def draw(self, rng: np.random.Generator, n: int, c: int, h: int, w: int) -> ErasePlan:
        """The random parameters for a batch of ``n`` images ``c x h x w`` (host only, no device work)."""
        return draw_erasing(rng, self, n, c, h, w)

    def apply_(self, x: torch.Tensor, plan: ErasePlan, generator: torch.Generator | None = None) -> torch.Tensor:
        """Erase ``plan``'s boxes from ``x`` in place; ``generator`` (on ``x``'s device) feeds pixel noise."""
        return apply_erasing_(x, plan, mode=self.mode, generator=generator)

    def __call__(
        self, x: torch.Tensor, *, rng: np.random.Generator, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Erase the NCHW normalised float batch ``x`` in place and return it."""
        n, c, h, w = x.shape
        return self.apply_(x, self.draw(rng, n, c, h, w), generator)


@dataclass(frozen=True)
class ErasePlan:
    """The random draws for one batch: ``boxes[n, k] = (top, left, h, w, active)``; ``colors[n, k, c]``."""

    boxes: np.ndarray  # int64 (N, count, 5)
    colors: np.ndarray | None  # float32 (N, count, C), "rand" mode only


def draw_erasing(rng: np.random.Generator, cfg: RandomErasing, n: int, c: int, h: int, w: int) -> ErasePlan:
    """Draw every box of a batch of ``n`` images ``c x h x w`` at once (see the module doc)."""
    count = cfg.max_count
    start = n // cfg.num_splits if cfg.num_splits > 1 else 0
    erase = rng.random(n) < cfg.probability
    erase[:start] = False
    lo = cfg.min_count
    k = np.full(n, count) if lo == count else rng.integers(lo, count + 1, size=n)
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
