"""Write a folder of photo-like JPEGs that are not raypipe's sample data, for benchmarks.

Natural photos have a roughly 1/f amplitude spectrum, smooth regions broken by edges, and fine
texture; JPEG decode and resize costs depend on size, quality and how much detail the entropy coder
has to carry. Each image here is a sum of noise octaves (1/f-like), a few hard-edged shapes and some
grain, at a size drawn from ``--sizes`` and a quality from ``--quality``, so a benchmark can be run
on data with other statistics than the data it was tuned on::

    python bench/photolike.py /tmp/photo4k --classes 8 --per-class 500 --sizes 320x240 800x600 --quality 75 95

Deterministic for a seed; images are written by ``--workers`` processes.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def photolike(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """One photo-like RGB image of ``width`` x ``height``."""
    acc = np.zeros((height, width, 3), np.float32)
    amp, cells = 1.0, 2
    while cells < max(width, height):  # octaves: each twice as fine, amplitude halved (1/f)
        small = rng.normal(size=(cells * height // max(width, height) + 2, cells + 2, 3)).astype(np.float32)
        layer = np.stack(
            [
                np.asarray(Image.fromarray(small[..., c]).resize((width, height), Image.Resampling.BICUBIC))
                for c in range(3)
            ],
            axis=-1,
        )
        acc += amp * layer
        amp, cells = amp * 0.5, cells * 2
    base = rng.uniform(60, 190, size=3).astype(np.float32)
    img = np.clip(base + 45 * acc / (np.abs(acc).max() + 1e-6) * 2, 0, 255).astype(np.uint8)
    im = Image.fromarray(img, "RGB")
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(2, 7))):  # hard edges: objects in front of the background
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = x0 + int(rng.integers(10, width // 2 + 11)), y0 + int(rng.integers(10, height // 2 + 11))
        colour = tuple(int(v) for v in rng.integers(0, 256, size=3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=colour)
    grain = rng.normal(0, rng.uniform(2, 8), size=(height, width, 1)).astype(np.float32)
    return Image.fromarray(np.clip(np.asarray(im, np.float32) + grain, 0, 255).astype(np.uint8), "RGB")


def _write(task: tuple[str, int, int, list[tuple[int, int]], tuple[int, int]]) -> None:
    out, cls, index, sizes, quality = task
    rng = np.random.default_rng([cls, index, 0xB0B])
    w, h = sizes[int(rng.integers(len(sizes)))]
    if rng.random() < 0.3:
        w, h = h, w  # some portrait images
    scale = rng.uniform(0.8, 1.2)
    im = photolike(rng, max(16, int(w * scale)), max(16, int(h * scale)))
    q = int(rng.integers(quality[0], quality[1] + 1))
    path = Path(out) / f"class{cls:03d}" / f"img{index:06d}.jpg"
    im.save(path, "JPEG", quality=q)


def write_photolike(
    out: str, *, classes: int, per_class: int, sizes: list[tuple[int, int]], quality: tuple[int, int], workers: int = 2
) -> None:
    for c in range(classes):
        (Path(out) / f"class{c:03d}").mkdir(parents=True, exist_ok=True)
    tasks = [(out, c, i, sizes, quality) for c in range(classes) for i in range(per_class)]
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_write, tasks, chunksize=16))


def _size(text: str) -> tuple[int, int]:
    w, _, h = text.partition("x")
    return int(w), int(h)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--per-class", type=int, default=500)
    p.add_argument("--sizes", type=_size, nargs="+", default=[(500, 375), (640, 480)], help="WxH choices")
    p.add_argument("--quality", type=int, nargs=2, default=(80, 95), help="JPEG quality range")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    write_photolike(
        a.out, classes=a.classes, per_class=a.per_class, sizes=a.sizes, quality=tuple(a.quality), workers=a.workers
    )
    print(f"wrote {a.classes * a.per_class} images to {a.out}")


if __name__ == "__main__":
    main()
