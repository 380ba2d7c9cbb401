"""A training script shaped like timm's ``train.py`` (written for these tests, not copied): the loader
is touched exactly where and how timm's script touches it, so a loader that runs here runs there.

What timm's script does with its loaders, and where it is mirrored below:
- ``_set_loader_epoch``: ``loader.dataset`` (``set_epoch`` when it has one), then ``loader.batch_sampler``,
  else ``loader.sampler`` ``.set_epoch(epoch)``;
- ``train_one_epoch``: ``loader.mixup_enabled = False`` from ``--mixup-off-epoch`` (prefetcher on);
  ``len(loader)`` for the accumulation steps; ``for batch_idx, (input, target) in enumerate(loader)``;
  ``input.contiguous(memory_format=torch.channels_last)`` when asked;
- ``validate``: ``len(loader) - 1`` as the last index, the same unpacking, loss/top-1/top-5 per batch
  all-reduced (averaged over ranks) when distributed, averaged weighted by batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Args:
    prefetcher: bool = True
    mixup_off_epoch: int = 0
    channels_last: bool = False
    grad_accum_steps: int = 1
    distributed: bool = False
    world_size: int = 1


def set_loader_epoch(loader, epoch: int) -> None:
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(epoch)
    if hasattr(loader.batch_sampler, "set_epoch"):
        loader.batch_sampler.set_epoch(epoch)
    elif hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)


def reduce_mean(t: torch.Tensor, world_size: int) -> torch.Tensor:
    t = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t / world_size


class Meter:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, value: float, n: int) -> None:
        self.sum += value * n
        self.count += n

    @property
    def avg(self) -> float:
        return self.sum / max(1, self.count)


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args: Args) -> dict:
    if args.mixup_off_epoch and epoch >= args.mixup_off_epoch and args.prefetcher and loader.mixup_enabled:
        loader.mixup_enabled = False
    model.train()
    accum = args.grad_accum_steps
    n_batches = len(loader)
    last_idx = n_batches - 1
    losses = Meter()
    seen = 0
    optimizer.zero_grad()
    for batch_idx, (input, target) in enumerate(loader):
        if args.channels_last:
            input = input.contiguous(memory_format=torch.channels_last)
        loss = loss_fn(model(input), target)
        (loss / accum).backward()
        if batch_idx == last_idx or (batch_idx + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
        losses.update(loss.item(), input.shape[0])
        seen += 1
        if args.distributed:  # timm reduces the running loss at its log interval: a collective per rank
            reduce_mean(loss.detach().reshape(1), args.world_size)
    return {"loss": losses.avg, "batches": seen, "len": n_batches}


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1, 5)) -> list[torch.Tensor]:
    k = min(max(topk), output.shape[1])
    pred = output.topk(k, 1, True, True).indices.t()
    correct = pred.eq(target.reshape(1, -1).expand_as(pred))
    return [correct[: min(t, k)].reshape(-1).float().sum(0) * 100.0 / target.shape[0] for t in topk]


def validate(model, loader, loss_fn, args: Args) -> dict:
    model.eval()
    losses, top1, top5 = Meter(), Meter(), Meter()
    last_idx = len(loader) - 1
    batches = 0
    with torch.inference_mode():
        for batch_idx, (input, target) in enumerate(loader):
            if args.channels_last:
                input = input.contiguous(memory_format=torch.channels_last)
            output = model(input)
            loss = loss_fn(output, target)
            acc1, acc5 = accuracy(output, target)
            if args.distributed:
                loss = reduce_mean(loss, args.world_size)
                acc1 = reduce_mean(acc1, args.world_size)
                acc5 = reduce_mean(acc5, args.world_size)
            n = output.shape[0]
            losses.update(loss.item(), n)
            top1.update(acc1.item(), n)
            top5.update(acc5.item(), n)
            batches += 1
            assert batch_idx <= last_idx
    return {"loss": losses.avg, "top1": top1.avg, "top5": top5.avg, "batches": batches}
