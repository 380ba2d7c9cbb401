"""What the training job optimises and how it scores: its loss, and one eval pass's figures."""

from __future__ import annotations

import time

import torch

from raypipe.train.args import TrainJobConfig
from raypipe.train.metrics import RankEpoch

__all__ = ["evaluate", "training_loss"]


def training_loss(job: TrainJobConfig, multi_label: bool = False):
    """The job's loss: cross-entropy (smoothed, or on soft targets with mixup), or a per-class binary
    cross-entropy for label sets."""
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    if multi_label:  # several labels per image: one sigmoid per class, as timm's multi-label recipes
        smoothing = 0.0 if job.soft_targets else job.smoothing  # mixed targets come smoothed already

        def binary(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            y = y.float() * (1.0 - smoothing) + smoothing / y.shape[1]  # as the DeviceLoader smooths
            return torch.nn.functional.binary_cross_entropy_with_logits(out.float(), y)

        return binary
    if job.soft_targets:
        return SoftTargetCrossEntropy()  # the DeviceLoader folds smoothing into the mixed targets
    if job.smoothing > 0:
        return LabelSmoothingCrossEntropy(smoothing=job.smoothing)
    return torch.nn.CrossEntropyLoss()


@torch.no_grad()
def evaluate(model, loader, autocast, num_classes: int, rec: RankEpoch) -> None:
    """One eval pass into ``rec``: loss, top-1 and top-5 hits (for label sets, a hit is a predicted class
    among the image's labels), samples, time."""
    model.eval()
    k = min(5, num_classes)
    t0 = time.perf_counter()
    for batch in loader:
        x, y = batch["image"], batch["label"]
        with autocast():
            out = model(x)
        top = out.topk(k, dim=1).indices
        if y.dim() == 2:  # label sets: a hit is a predicted class among the image's labels
            bce = torch.nn.functional.binary_cross_entropy_with_logits(out.float(), y.float(), reduction="none")
            rec.eval_loss_sum += float(bce.mean(dim=1).sum())
            hit = y.gather(1, top) > 0
        else:
            rec.eval_loss_sum += float(torch.nn.functional.cross_entropy(out.float(), y, reduction="sum"))
            hit = top.eq(y[:, None])
        rec.eval_correct1 += int(hit[:, 0].sum())
        rec.eval_correct5 += int(hit.any(dim=1).sum())
        rec.eval_count += int(y.shape[0])
    rec.eval_s = time.perf_counter() - t0
