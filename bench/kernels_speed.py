"""Single-core images/s of raypipe's kernels vs Pillow + timm on ~200 ImageNet-like JPEGs.

Run: ``PYTHONPATH=. python bench/kernels_speed.py [--n 200]``. The JPEGs are crops of the shipped sample
photos resized to about 500x375 and saved at quality 90 (no downloads).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from PIL import Image
from timm.data.transforms_factory import transforms_imagenet_eval, transforms_imagenet_train

from raypipe.config import EvalAugment, TrainAugment
from raypipe.kernels import build_transform, sample_rng
from raypipe.kernels.autoaug import _patch_posterize
from raypipe.sample_data import load_photo


def make_jpegs(folder: Path, n: int) -> list[Path]:
    rng = np.random.default_rng(0)
    photos = [np.asarray(load_photo(name)) for name in ("astronaut", "chelsea", "coffee")]
    paths = []
    for i in range(n):
        src = photos[i % len(photos)]
        h, w = src.shape[:2]
        ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        size = (500, 375) if i % 4 else (375, 500)
        im = Image.fromarray(src[y : y + ch, x : x + cw]).resize(size, Image.BICUBIC)
        p = folder / f"{i:04d}.jpg"
        im.save(p, "JPEG", quality=90)
        paths.append(p)
    return paths


def rate(fn, datas: list[bytes], repeat: int = 3) -> tuple[float, float]:
    """(img/s by this thread's CPU time, img/s by wall time); each the median over ``repeat`` passes.

    CPU time is the figure to quote: the box is shared, and wall time also counts the periods another
    process held the core."""
    for d in datas[:10]:
        fn(d, 0)
    cpu, wall = [], []
    for r in range(repeat):
        t0, c0 = time.perf_counter(), time.thread_time()
        for i, d in enumerate(datas):
            fn(d, r * len(datas) + i)
        cpu.append(len(datas) / (time.thread_time() - c0))
        wall.append(len(datas) / (time.perf_counter() - t0))
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--only", help="comma-separated substrings of the row names to run (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        datas = [p.read_bytes() for p in make_jpegs(Path(tmp), args.n)]

    train = build_transform(TrainAugment(color_jitter=None))  # RRC 224 + hflip
    train_cj = build_transform(TrainAugment())  # + colour jitter 0.4 (timm's default)
    train_ra = build_transform(TrainAugment(auto_augment="rand-m9-mstd0.5-inc1"))
    evalt = build_transform(EvalAugment())
    timm_train = transforms_imagenet_train(
        224, color_jitter=None, interpolation="bilinear", use_prefetcher=True
    )
    timm_cj = transforms_imagenet_train(224, interpolation="bilinear", use_prefetcher=True)
    timm_ra = transforms_imagenet_train(
        224, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bilinear", use_prefetcher=True
    )
    for t in timm_ra.transforms:  # timm's posterize(0 bits) fails on Pillow >= 12; same fix as ours
        _patch_posterize(t)
    timm_eval = transforms_imagenet_eval(224, use_prefetcher=True)
    out = np.empty((224, 224, 3), np.uint8)

    def pil(d):
        return Image.open(io.BytesIO(d)).convert("RGB")

    rows = [
        ("simplejpeg full decode", lambda d, i: simplejpeg.decode_jpeg(d)),
        ("Pillow full decode", lambda d, i: pil(d)),
        ("raypipe train (RRC224+hflip)", lambda d, i: train(d, sample_rng(0, 0, i), out=out)),
        ("timm/Pillow train (RRC224+hflip)", lambda d, i: timm_train(pil(d))),
        ("raypipe train + jitter 0.4", lambda d, i: train_cj(d, sample_rng(0, 0, i), out=out)),
        ("timm/Pillow train + jitter 0.4", lambda d, i: timm_cj(pil(d))),
        ("raypipe train rand-m9-mstd0.5-inc1", lambda d, i: train_ra(d, sample_rng(0, 0, i), out=out)),
        ("timm/Pillow train rand-m9-mstd0.5", lambda d, i: timm_ra(pil(d))),
        ("raypipe eval (center 0.875)", lambda d, i: evalt(d, None, out=out)),
        ("timm/Pillow eval (center 0.875)", lambda d, i: timm_eval(pil(d))),
    ]
    only = [r for r in rows if args.only is None or any(k in r[0] for k in args.only.split(","))]
    results = {name: rate(fn, datas) for name, fn in only}
    print(f"{len(datas)} JPEGs ~500x375 q90, single core (cv2/torch threads = 1); median of 3 passes")
    print(f"{'kernel':40s} {'img/s CPU':>10s} {'img/s wall':>11s} {'µs/img CPU':>11s}")
    for name, (cpu, wall) in results.items():
        print(f"{name:40s} {cpu:10.0f} {wall:11.0f} {1e6 / cpu:11.0f}")
    for ours, theirs in [(2, 3), (4, 5), (6, 7), (8, 9)]:
        a, b = rows[ours][0], rows[theirs][0]
        if a in results and b in results:
            print(f"speed-up {a!r} (CPU time): {results[a][0] / results[b][0]:.2f}x")


if __name__ == "__main__":
    main()
