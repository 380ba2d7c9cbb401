"""Profile the pipeline on one machine: img/s per epoch, the driver's CPU and the machine's CPU use.

Reproduces the pipeline rows of bench/NOTES.md::

    python bench/pipeline_profile.py DATA --block-size 64 --cpus-per-actor 1      # 1 worker per core
    python bench/pipeline_profile.py DATA --block-size 128 --cpus-per-actor 0.5   # the defaults
    python bench/pipeline_profile.py DATA --device-loader                          # + CPU DeviceLoader
    python bench/pipeline_profile.py --normalise                                   # trainer-side normalise only
"""

from __future__ import annotations

import argparse
import time

import psutil


def profile_pipeline(args: argparse.Namespace) -> None:
    from raypipe.config import PipelineConfig, TrainAugment
    from raypipe.device import DeviceLoader
    from raypipe.pipeline import EpochSource, Pipeline
    from raypipe.runtime import connect

    connect()
    cfg = PipelineConfig(
        batch_size=args.batch_size,
        block_size=args.block_size,
        cpus_per_actor=args.cpus_per_actor,
        num_actors=args.num_actors,
    )
    pipe = Pipeline(args.data, TrainAugment(input_size=args.img_size, color_jitter=None), config=cfg)
    source = EpochSource(pipe, warm_next=not args.no_warm, end_epoch=args.epochs)
    it = DeviceLoader(source, device="cpu", img_dtype=args.img_dtype) if args.device_loader else source
    me = psutil.Process()
    for epoch in range(args.epochs):
        psutil.cpu_percent(None)
        c0, t0, n = me.cpu_times(), time.perf_counter(), 0
        for batch in it:
            n += int(batch["image"].shape[0])
        dt, c1 = time.perf_counter() - t0, me.cpu_times()
        driver = (c1.user - c0.user + c1.system - c0.system) / dt
        machine = psutil.cpu_percent(None)
        print(f"epoch {epoch}: {n / dt:7.0f} img/s  driver {driver:.2f} cores  machine {machine:.0f} %")


def profile_normalise(args: argparse.Namespace) -> None:
    import torch

    from raypipe.config import IMAGENET_MEAN, IMAGENET_STD
    from raypipe.device.normalize import normalize

    torch.set_num_threads(1)
    x = torch.randint(0, 255, (args.batch_size, args.img_size, args.img_size, 3), dtype=torch.uint8)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        normalize(x, mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype=dtype)
        t0 = time.perf_counter()
        for _ in range(3):
            normalize(x, mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype=dtype)
        per_batch = (time.perf_counter() - t0) / 3
        print(f"normalise {dtype}: {args.batch_size / per_batch:6.0f} img/s on one core")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--cpus-per-actor", type=float, default=0.5)
    p.add_argument("--num-actors", type=int)
    p.add_argument("--no-warm", action="store_true", help="do not warm up the next epoch")
    p.add_argument("--device-loader", action="store_true", help="read through a CPU DeviceLoader")
    p.add_argument("--img-dtype", default="float32")
    p.add_argument("--normalise", action="store_true", help="only time the trainer-side normalisation")
    args = p.parse_args()
    if args.normalise:
        profile_normalise(args)
    elif args.data:
        profile_pipeline(args)
    else:
        p.error("DATA is required unless --normalise")


if __name__ == "__main__":
    main()
