"""Where a run's first batch goes, after the imports a training script pays anyway, for one loader in
a fresh process (run it once per loader: a second loader in the same process would find warm caches)::

    python bench/first_batch.py /tmp/photo4k                        # raypipe.connect() + FeederSource
    python bench/first_batch.py /tmp/photo4k --loader dropin        # raypipe.timm.create_loader
    python bench/first_batch.py /tmp/photo4k --loader timm          # timm's create_loader
    python bench/first_batch.py /tmp/photo4k --loader timm --device cuda
    python bench/first_batch.py /tmp/photo4k --resume-at 20         # the same, resumed after 20 batches

``feeder`` is the path that waits for Ray: Ray's start (``raypipe.connect()``), the listing
(``Pipeline``), the feeder (``FeederSource``) and the first batch out of a ``DeviceLoader`` (a fresh
worker's start, the first chunk, the feeder's pack). ``dropin`` is the timm drop-in as a training
script that never called ``ray.init`` runs it: local worker processes, its first chunks made in its own
process while they start. ``timm`` is timm's loader with one worker per core, persistent workers, and
pinned memory on CUDA. On CUDA the device is initialised before the clock starts (a training script
has its model there before its first batch), and the first batch is timed once it is on the device.
``--resume-at K`` (raypipe's loaders) loads the position after batch K of epoch 0 before the first
batch, as a run restarted from a mid-epoch checkpoint does (the data must have no bad image: the
position is K batches of rows into the rank's part).
"""

from __future__ import annotations

import argparse
import os
import time

LOADERS = ("feeder", "dropin", "timm")


def timm_args(aug) -> dict:
    """timm's create_loader arguments for ``aug`` (the bench's, ``raypipe.benchmark.contenders``), training."""
    from raypipe.benchmark.contenders import _timm_kwargs

    return dict(is_training=True, use_prefetcher=True, **_timm_kwargs(aug))


def feeder_marks(a, aug, device, marks: list) -> None:
    import raypipe.runtime
    from raypipe import ExecutionConfig, FeederSource, Pipeline, PipelineConfig, from_timm_args

    raypipe.runtime.connect()
    marks.append(("Ray's start", time.perf_counter()))
    pipe = Pipeline(
        a.data, aug, config=PipelineConfig(batch_size=a.batch_size), execution=ExecutionConfig(worker_nice=0)
    )
    marks.append(("listing (Pipeline)", time.perf_counter()))
    source = FeederSource(pipe, end_epoch=1)
    marks.append(("FeederSource", time.perf_counter()))
    with from_timm_args(source, device=device, img_dtype=_dtype(device)) as loader:
        _resume(loader, a.resume_at, a.batch_size)
        _first(loader, device)
        marks.append(("first batch", time.perf_counter()))


def dropin_marks(a, aug, device, marks: list) -> None:
    from raypipe import ExecutionConfig
    from raypipe.timm import create_loader

    loader = create_loader(
        a.data,
        batch_size=a.batch_size,
        device=device,
        img_dtype=_dtype(device),
        pin_memory=device.type == "cuda",
        execution=ExecutionConfig(worker_nice=0),
        **timm_args(aug),
    )
    marks.append(("loader (listing)", time.perf_counter()))
    try:
        _resume(loader, a.resume_at, a.batch_size)
        _first(loader, device)
        marks.append(("first batch", time.perf_counter()))
    finally:
        loader.close()


def timm_marks(a, aug, device, marks: list) -> None:
    from timm.data import create_dataset, create_loader

    dataset = create_dataset("", root=a.data, split="train", is_training=True)
    loader = create_loader(
        dataset,
        batch_size=a.batch_size,
        num_workers=os.cpu_count() or 1,
        device=device,
        img_dtype=_dtype(device),
        pin_memory=device.type == "cuda",
        persistent_workers=True,
        **timm_args(aug),
    )
    marks.append(("loader (listing)", time.perf_counter()))
    _first(loader, device)
    marks.append(("first batch", time.perf_counter()))


def _dtype(device):
    import torch

    return torch.float16 if device.type == "cuda" else torch.float32


def _resume(loader, batches: int, batch_size: int) -> None:
    """Load the position after ``batches`` batches of epoch 0 (a clean dataset: ``batches`` x
    ``batch_size`` rows into the rank's part), as a restarted run loads its checkpoint's."""
    if not batches:
        return
    from dataclasses import replace

    from raypipe.plan.position import Position

    at = Position.from_dict(loader.state_dict())  # epoch 0 from its start: its plan and the rank's part
    ((lo, hi),) = at.remaining
    loader.load_state_dict(replace(at, batches=batches, remaining=((lo + batches * batch_size, hi),)).as_dict())


def _first(loader, device) -> None:
    import torch

    next(iter(loader))
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="any source raypipe reads (timm: an image folder)")
    p.add_argument("--loader", choices=LOADERS, default="feeder")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--resume-at", type=int, default=0, help="resume after this many batches of epoch 0")
    a = p.parse_args()
    if a.resume_at and a.loader == "timm":
        p.error("--resume-at: timm's loader has no position to resume from")

    import torch  # a training script has imported it, and built its model, before its loader starts

    device = torch.device(a.device)
    if device.type == "cuda":
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)
    from raypipe.benchmark import contenders  # noqa: F401 - imported before the clock, as below
    from raypipe.config import TrainAugment

    aug = TrainAugment(input_size=a.img_size, color_jitter=None)  # RandomResizedCrop + flip, for every loader
    # what each loader imports, before the clock: module imports are the script's, not the loader's
    if a.loader == "timm":
        import timm.data  # noqa: F401
    else:
        import raypipe.integrations.timm_loader  # noqa: F401
        import raypipe.pipeline  # noqa: F401

    marks = [("start", time.perf_counter())]
    {"feeder": feeder_marks, "dropin": dropin_marks, "timm": timm_marks}[a.loader](a, aug, device, marks)
    resumed = f", resumed after batch {a.resume_at}" if a.resume_at else ""
    print(f"{a.loader} on {device}, batch {a.batch_size}, {os.cpu_count()} cores{resumed}:")
    for (_, before), (what, at) in zip(marks[:-1], marks[1:], strict=True):
        print(f"  {what:<20} {at - before:6.2f} s")
    print(f"  {'total':<20} {marks[-1][1] - marks[0][1]:6.2f} s")


if __name__ == "__main__":
    main()
