"""Per-step time (median of repeats, µs/image) of the single-core train transform on the bench JPEGs.

Run: ``PYTHONPATH=. python bench/kernels_profile.py [--n 200] [--repeat 5]``. Steps are timed with
``time.thread_time`` (CPU time) around each call, on the same ~500x375 q90 JPEGs as ``kernels_speed.py``.
"whole t()" is RandomResizedCrop + flip; "colour jitter" applies timm's default ``ColorJitter(0.4, 0.4,
0.4)`` (three blends, drawn factors and order) to the resized crop, and "whole t() + jitter" is the
transform with it, as ``jobs/train.py`` runs without ``--aa``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import simplejpeg
from kernels_speed import make_jpegs  # noqa: E402  (bench/ is on sys.path when run as a script)

from raypipe.config import DecodeConfig, TrainAugment
from raypipe.kernels import build_transform, color, crop_resize, decode_for_crop, open_image, rrc_params, sample_rng


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        datas = [p.read_bytes() for p in make_jpegs(Path(tmp), args.n)]
    aug = TrainAugment(input_size=224, color_jitter=None)
    t = build_transform(aug, DecodeConfig())
    t_jitter = build_transform(TrainAugment(input_size=224, color_jitter=0.4), DecodeConfig())
    out = np.empty((224, 224, 3), np.uint8)
    steps = ["sample_rng", "open_image", "draw params", "decode_for_crop", "crop_resize", "colour jitter",
             "whole t()", "whole t() + jitter", "simplejpeg full decode"]
    runs = {s: [] for s in steps}
    # CPU time of this thread, not wall time: the machine may be shared, and a descheduled thread
    # would otherwise be charged for another process's work.
    pc = time.thread_time
    for _ in range(args.repeat):
        acc = dict.fromkeys(steps, 0.0)
        for i, d in enumerate(datas):
            t0 = pc()
            rng = sample_rng(0, 0, i)
            t1 = pc()
            src = open_image(d, 10**9)
            t2 = pc()
            w, h = src.size
            top, left, ch, cw = rrc_params(w, h, aug.scale, aug.ratio, rng)
            hflip = rng.random() < 0.5
            t3 = pc()
            pixels, box = decode_for_crop(src, (left, top, left + cw, top + ch), aug.input_size)
            t4 = pc()
            crop_resize(pixels, box, aug.input_size, "bilinear", hflip=hflip, out=out)
            t5 = pc()
            color.apply_jitter(out, color.jitter_params((0.4, 0.4, 0.4), rng))
            t6 = pc()
            t(d, sample_rng(0, 0, i), out=out)
            t7 = pc()
            t_jitter(d, sample_rng(0, 0, i), out=out)
            t8 = pc()
            simplejpeg.decode_jpeg(d)
            t9 = pc()
            ends = (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9)
            for s, a, b in zip(steps, ends[:-1], ends[1:], strict=True):
                acc[s] += b - a
        for s in steps:
            runs[s].append(acc[s] / len(datas) * 1e6)
    print(f"{len(datas)} JPEGs, {args.repeat} repeats; median µs/image (min–max)")
    for s in steps:
        v = sorted(runs[s])
        print(f"  {s:24s} {np.median(v):7.1f}  ({v[0]:.1f}–{v[-1]:.1f})")
    for name in ("whole t()", "whole t() + jitter"):
        whole = np.median(runs[name]) + np.median(runs["sample_rng"])
        print(f"  => sample_rng + {name[6:]}: {whole:.1f} µs = {1e6 / whole:.0f} img/s")


if __name__ == "__main__":
    main()
