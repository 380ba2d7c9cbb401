"""The augmentation stage in one process: µs/image with and without the partial JPEG decoder, where a
JPEG decode spends its time, and what handing a block to Ray's object store costs.

The first figures run one block again and again (its files and decoder state stay in the CPU's caches);
"every row once" runs the stage over all of DATA in blocks, each image once, as the workers meet them.

Usage::

    python bench/stage_profile.py /tmp/bench2k          # a folder from `raypipe sample-data`

All figures are CPU time of this thread (``time.thread_time``) per image, so other processes on the
machine do not inflate them.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import simplejpeg


def _per_image(fn, n: int, repeat: int) -> float:
    fn()  # warm caches and lazy imports
    runs = []
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        runs.append((time.thread_time() - t0) / n * 1e6)
    return float(np.median(runs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    from raypipe.config import DecodeConfig, TrainAugment
    from raypipe.kernels import decode
    from raypipe.sources import open_source
    from raypipe.stages.augment import AugmentStage, StageSpec

    rows = open_source(args.data)
    table = rows.table.slice(0, args.block_size)
    block = {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}
    n = len(block["sample_id"])
    aug = TrainAugment(input_size=args.img_size, color_jitter=None)
    spec = StageSpec(kind=rows.kind, root=rows.root, augment=aug, decode=DecodeConfig(), seed=0, epoch=0,
                     image_column=rows.image_column)  # fmt: skip

    print(f"augmentation stage, {n}-row block, RRC{args.img_size} + flip, CPU µs/image")
    region = decode._decode_region
    stage = AugmentStage(spec)
    with_region = _per_image(lambda: stage(block), n, args.repeat)
    decode._decode_region = None
    try:
        whole = _per_image(lambda: stage(block), n, args.repeat)
    finally:
        decode._decode_region = region
    print(f"  whole-image decodes   {whole:7.0f}")
    print(f"  partial decodes       {with_region:7.0f}" + ("" if region else "  (extension not built)"))
    every = {c: rows.table.column(c).to_numpy(zero_copy_only=False) for c in rows.table.column_names}
    t0 = time.thread_time()
    for start in range(0, len(rows), args.block_size):
        stage({c: col[start:start + args.block_size] for c, col in every.items()})
    once = (time.thread_time() - t0) / max(1, len(rows)) * 1e6
    print(f"  every row once ({len(rows)} images, partial decodes) {once:7.0f}")

    datas = [rows.root.read_bytes(str(path)) for path in block["path"]]
    heads = [simplejpeg.decode_jpeg_header(d) for d in datas]
    buf = np.empty(max(h * w * 3 for h, w, _, _ in heads), np.uint8)
    print("one JPEG decode, CPU µs/image")
    full = lambda: [simplejpeg.decode_jpeg(d, colorspace="RGB", buffer=buf) for d in datas]
    print(f"  simplejpeg, whole image{'':19}{_per_image(full, n, args.repeat):7.0f}")
    if region is not None:
        parts = {
            "whole image": lambda h, w: (0, 0, w, h),
            "top half": lambda h, w: (0, 0, w, h // 2),
            "bottom half": lambda h, w: (0, h // 2, w, h - h // 2),
            "left half of the columns": lambda h, w: (0, 0, w // 2, h),
            "centre 0.7 x 0.7": lambda h, w: (int(w * 0.15), int(h * 0.15), int(w * 0.7), int(h * 0.7)),
        }
        for name, box in parts.items():

            def run(box=box):
                for d, (h, w, _, _) in zip(datas, heads, strict=True):
                    region(d, 8, *box(h, w), buf, w * 3)

            print(f"  partial decode, {name:<26}{_per_image(run, n, args.repeat):7.0f}")

    import ray
    from ray.data.block import BlockAccessor

    from raypipe.runtime import connect

    connect(num_cpus=1)
    out = BlockAccessor.batch_to_block(stage(block))
    ray.put(out)
    t0 = time.perf_counter()
    for _ in range(args.repeat):
        ray.put(out)
    put_us = (time.perf_counter() - t0) / args.repeat / n * 1e6
    print(f"ray.put of one {n}-image output block: {put_us:.0f} µs/image (wall)")
    ray.shutdown()


if __name__ == "__main__":
    main()
