"""Mixup / CutMix with timm's semantics, vectorised on the device on normalised float images.

The random parameters (lam, mixup-or-cutmix, boxes) are drawn on the host with a
``numpy.random.Generator`` exactly as timm's ``Mixup`` draws them (``_params_per_batch`` /
``_params_per_elem``, ``rand_bbox`` / ``rand_bbox_minmax``, lam correction from the clipped box), then
applied to the whole batch at once: sample ``i`` is mixed with sample ``N-1-i`` (``x.flip(0)``).

- ``batch``: one lam / box for the batch; arithmetic identical to timm's ``_mix_batch``.
- ``elem``: per-sample lam / box; ``x*lam + x_flip*(1-lam)`` with lam as an (N,1,1,1) tensor in the
  image dtype (so within that dtype's precision of the target's lam), cut boxes by one masked select.
- ``pair``: per-pair params, mirrored so ``i`` and ``N-1-i`` share them (timm's ``_mix_pair``).

Odd batches: timm asserts an even batch size. Here an odd batch is accepted: the middle sample pairs
with itself, so it is unchanged and its target is its own (smoothed) label - the same as timm would
give that sample with lam = 1. Targets: ``lam * onehot_smooth + (1-lam) * onehot_smooth.flip(0)``,
float32, rows summing to 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from raypipe._values import check_int, check_nonneg, check_prob, fail, is_number
from raypipe.device.erasing import box_masks

__all__ = ["MIX_MODES", "Mixup", "MixPlan", "draw_mixing", "apply_mixing_", "mixup_target"]

MIX_MODES = ("batch", "pair", "elem")


@dataclass(frozen=True, kw_only=True)
class Mixup:
    """timm's ``Mixup``: same argument names and defaults (``multi_label`` aside), applied on the device.

    Mixup or cutmix must be on (``mixup_alpha > 0``, ``cutmix_alpha > 0`` or ``cutmix_minmax``): with
    neither, timm builds no ``Mixup`` and leaves targets as class indices (label smoothing then belongs
    to the loss, e.g. timm's ``LabelSmoothingCrossEntropy``), and so does a ``DeviceLoader`` given
    ``mixup=None``. ``None`` for ``prob`` / ``switch_prob`` / ``label_smoothing`` means timm's default.

    >>> mix = Mixup(mixup_alpha=0.8, num_classes=4, label_smoothing=0.0)
    >>> x, y = mix(torch.zeros(2, 3, 8, 8), torch.tensor([0, 3]), rng=np.random.default_rng(0))
    >>> tuple(y.shape), round(float(y.sum()), 5)
    ((2, 4), 2.0)
    """

    mixup_alpha: float = 1.0
    cutmix_alpha: float = 0.0
    cutmix_minmax: Sequence[float] | None = None
    prob: float | None = 1.0
    switch_prob: float | None = 0.5
    mode: str = "batch"
    correct_lam: bool = True
    label_smoothing: float | None = 0.1
    num_classes: int = 1000

    def __post_init__(self) -> None:
        defaults = {"prob": 1.0, "switch_prob": 0.5, "label_smoothing": 0.0}
        for name, default in defaults.items():
            value = getattr(self, name)
            object.__setattr__(self, name, check_prob(name, default if value is None else value))
        check_nonneg("mixup_alpha", self.mixup_alpha)
        check_nonneg("cutmix_alpha", self.cutmix_alpha)
        if self.mode not in MIX_MODES:
            fail("mode", self.mode, f"expected one of {MIX_MODES}")
        if not isinstance(self.correct_lam, bool):
            fail("correct_lam", self.correct_lam, "expected True or False")
        if self.cutmix_minmax is not None:
            mm = tuple(self.cutmix_minmax) if isinstance(self.cutmix_minmax, (list, tuple)) else ()
            ok = len(mm) == 2 and all(is_number(v) for v in mm) and 0 <= mm[0] < mm[1] <= 1
            if not ok:
                fail("cutmix_minmax", self.cutmix_minmax, "expected None or (min, max), 0 <= min < max <= 1")
            object.__setattr__(self, "cutmix_minmax", (float(mm[0]), float(mm[1])))
            object.__setattr__(self, "cutmix_alpha", 1.0)  # as timm: minmax forces cutmix on, alpha 1
        if not (self.mixup_alpha > 0 or self.cutmix_alpha > 0):
            fail("mixup_alpha", self.mixup_alpha, "mixup_alpha or cutmix_alpha must be > 0 (or pass no Mixup)")
        object.__setattr__(self, "num_classes", check_int("num_classes", self.num_classes, 1))

    def draw(self, rng: np.random.Generator, n: int, h: int, w: int) -> MixPlan:
        """The random parameters for a batch of ``n`` images ``h x w`` (host only, no device work)."""
        return draw_mixing(rng, self, n, h, w)

    def apply_(self, x: torch.Tensor, plan: MixPlan) -> torch.Tensor:
        """Mix ``x`` in place following ``plan``; returns ``x``."""
        return apply_mixing_(x, plan)

    def target(self, label: torch.Tensor, plan: MixPlan | None = None) -> torch.Tensor:
        """Soft targets for ``plan``; without one (mixing switched off) the smoothed one-hot, as timm."""
        if plan is None:
            return mixup_target(label, self.num_classes, 1.0, self.label_smoothing)
        return plan_target(label, plan, self)

    def __call__(
        self, x: torch.Tensor, target: torch.Tensor, *, rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix the NCHW float batch ``x`` in place; return ``(x, soft_target)`` (float32, N x num_classes)."""
        plan = self.draw(rng, x.shape[0], x.shape[2], x.shape[3])
        return self.apply_(x, plan), self.target(target, plan)


@dataclass(frozen=True)
class MixPlan:
    """Per-sample draws of one batch.

    ``lam`` (N,) after correction (float64 in batch mode, else float32, as timm); ``cut`` / ``mix`` (N,)
    bool; ``boxes`` (N, 4) int64 ``(top, left, h, w)``; ``batch``: one set of params for the batch.
    """

    lam: np.ndarray
    cut: np.ndarray
    mix: np.ndarray
    boxes: np.ndarray
    batch: bool


def _rand_boxes(rng, cfg: Mixup, lam: np.ndarray, h: int, w: int) -> np.ndarray:
    """timm's ``rand_bbox`` / ``rand_bbox_minmax`` for every entry of ``lam`` -> (M, 4) top/left/h/w."""
    m = lam.shape[0]
    if cfg.cutmix_minmax is not None:
        lo, hi = cfg.cutmix_minmax
        cut_h = rng.integers(int(h * lo), int(h * hi), size=m)
        cut_w = rng.integers(int(w * lo), int(w * hi), size=m)
        yl = rng.integers(0, h - cut_h + 1)
        xl = rng.integers(0, w - cut_w + 1)
        return np.stack([yl, xl, cut_h, cut_w], axis=-1).astype(np.int64)
    ratio = np.sqrt(1.0 - lam)
    cut_h, cut_w = (h * ratio).astype(np.int64), (w * ratio).astype(np.int64)
    cy, cx = rng.integers(0, h, size=m), rng.integers(0, w, size=m)
    yl, yh = np.clip(cy - cut_h // 2, 0, h), np.clip(cy + (cut_h + 1) // 2, 0, h)
    xl, xh = np.clip(cx - cut_w // 2, 0, w), np.clip(cx + (cut_w + 1) // 2, 0, w)
    return np.stack([yl, xl, yh - yl, xh - xl], axis=-1).astype(np.int64)


def _draw_lams(rng, cfg: Mixup, m: int) -> tuple[np.ndarray, np.ndarray]:
    """timm's ``_params_per_elem`` (also used, with m=1, for ``_params_per_batch``'s distribution)."""
    if cfg.mixup_alpha > 0 and cfg.cutmix_alpha > 0:
        cut = rng.random(m) < cfg.switch_prob
        lam_cut = rng.beta(cfg.cutmix_alpha, cfg.cutmix_alpha, m)
        lam_mix = np.where(cut, lam_cut, rng.beta(cfg.mixup_alpha, cfg.mixup_alpha, m))
    elif cfg.mixup_alpha > 0:
        cut, lam_mix = np.zeros(m, bool), rng.beta(cfg.mixup_alpha, cfg.mixup_alpha, m)
    else:
        cut, lam_mix = np.ones(m, bool), rng.beta(cfg.cutmix_alpha, cfg.cutmix_alpha, m)
    on = rng.random(m) < cfg.prob
    return np.where(on, lam_mix, 1.0), cut & on


def draw_mixing(rng: np.random.Generator, cfg: Mixup, n: int, h: int, w: int) -> MixPlan:
    """Draw the mixing parameters of a batch of ``n`` images ``h x w`` (see the module doc)."""
    if cfg.prob <= 0:
        ones = np.ones(n, np.float32)
        return MixPlan(ones, np.zeros(n, bool), np.zeros(n, bool), np.zeros((n, 4), np.int64), batch=True)
    m = 1 if cfg.mode == "batch" else (n if cfg.mode == "elem" else n // 2)
    lam, cut = _draw_lams(rng, cfg, m)
    if cfg.mode != "batch":  # timm: float lam per batch, float32 array per element
        lam = lam.astype(np.float32)
    cut &= lam != 1.0
    mix = ~cut & (lam != 1.0)
    boxes = np.zeros((m, 4), np.int64)
    if cut.any():
        boxes[cut] = _rand_boxes(rng, cfg, lam[cut], h, w)
        if cfg.correct_lam or cfg.cutmix_minmax is not None:
            area = boxes[cut, 2] * boxes[cut, 3]
            lam[cut] = 1.0 - area / float(h * w)
    if cfg.mode == "batch":
        lam, cut, mix, boxes = (np.repeat(a, n, axis=0) for a in (lam, cut, mix, boxes))
    elif cfg.mode == "pair":
        mid = n - 2 * m  # 1 for an odd batch: the middle sample pairs with itself
        lam = np.concatenate([lam, np.ones(mid, lam.dtype), lam[::-1]])
        cut = np.concatenate([cut, np.zeros(mid, bool), cut[::-1]])
        mix = np.concatenate([mix, np.zeros(mid, bool), mix[::-1]])
        boxes = np.concatenate([boxes, np.zeros((mid, 4), np.int64), boxes[::-1]])
    return MixPlan(lam=lam, cut=cut, mix=mix, boxes=boxes, batch=cfg.mode == "batch")


def apply_mixing_(x: torch.Tensor, plan: MixPlan) -> torch.Tensor:
    """Mix the NCHW float batch ``x`` in place with ``x.flip(0)`` following ``plan``; returns ``x``."""
    if not (plan.cut.any() or plan.mix.any()):
        return x
    if plan.batch:  # timm's _mix_batch, same arithmetic
        lam = float(plan.lam[0])
        if plan.cut[0]:
            top, left, bh, bw = (int(v) for v in plan.boxes[0])
            region = x[:, :, top : top + bh, left : left + bw]
            region.copy_(region.flip(0))
        else:
            x_flipped = x.flip(0).mul_(1.0 - lam)
            x.mul_(lam).add_(x_flipped)
        return x
    x_flip = x.flip(0)
    if plan.mix.any():
        weights = np.where(plan.mix, plan.lam, np.float32(1.0)).astype(np.float32)
        wts = torch.from_numpy(np.stack([weights, 1.0 - weights], axis=1)).to(x.device, non_blocking=True)
        wts = wts.to(x.dtype).view(-1, 2, 1, 1, 1)
        mixed = x * wts[:, 0] + x_flip * wts[:, 1]
    else:
        mixed = x
    if plan.cut.any():
        boxes = torch.from_numpy(np.where(plan.cut[:, None], plan.boxes, 0)).to(x.device, non_blocking=True)
        mixed = torch.where(box_masks(boxes, x.shape[2], x.shape[3]), x_flip, mixed)
    return x.copy_(mixed) if mixed is not x else x


def mixup_target(
    target: torch.Tensor, num_classes: int, lam: float | torch.Tensor = 1.0, smoothing: float = 0.0
) -> torch.Tensor:
    """timm's ``mixup_target``: smoothed one-hot mixed with its flip; ``lam`` a float or (N,) tensor.
    A ``(N, num_classes)`` multi-hot ``target`` (several labels per image) is smoothed as timm smooths
    a one-hot, each 1 to ``on`` and each 0 to ``off``."""
    off = smoothing / num_classes
    on = 1.0 - smoothing + off
    if target.dim() == 2:
        y1 = target.to(torch.float32) * (on - off) + off
    else:
        y1 = torch.full((target.shape[0], num_classes), off, device=target.device, dtype=torch.float32)
        y1.scatter_(1, target.long().view(-1, 1), on)
    if isinstance(lam, torch.Tensor):
        lam = lam.to(device=target.device, dtype=torch.float32).view(-1, 1)
    elif lam == 1.0:
        return y1
    return y1 * lam + y1.flip(0) * (1.0 - lam)


def plan_target(target: torch.Tensor, plan: MixPlan, cfg: Mixup) -> torch.Tensor:
    """Soft targets for ``plan`` (scalar lam in batch mode, as timm; per-sample lam otherwise)."""
    if plan.batch:
        return mixup_target(target, cfg.num_classes, float(plan.lam[0]), cfg.label_smoothing)
    lam = torch.from_numpy(plan.lam).to(target.device, non_blocking=True)
    return mixup_target(target, cfg.num_classes, lam, cfg.label_smoothing)
