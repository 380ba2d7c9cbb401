"""Generate the embedded sample dataset: ImageNet-like JPEGs from the real photos shipped in
``raypipe/sample_photos`` (public domain or CC0; sources and licences in its ``LICENSES.md``).

One class per source photo; each image is a random crop of it (scale, aspect, position), flipped
or not, colour-shifted, resized to about 500×375 (some portrait) and saved as a JPEG of quality
85–95 — real-photo statistics and a real, learnable task, with no download. Deterministic for a
seed: the same arguments write byte-identical files.
"""

from __future__ import annotations

import contextlib
import functools
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

__all__ = ["PHOTOS", "PHOTO_DIR", "load_photo", "write_sample_data"]

# Colour photos first, then greyscale ones (stored as RGB JPEGs like many ImageNet images).
PHOTOS = (
    "astronaut.jpg",
    "chelsea.jpg",
    "coffee.jpg",
    "rocket.jpg",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "camera.jpg",
    "brick.jpg",
    "grass.jpg",
    "gravel.jpg",
    "cell.jpg",
    "clock_motion.jpg",
)
PHOTO_DIR = Path(__file__).parent / "sample_photos"


def load_photo(name: str) -> Image.Image:
    """One of the shipped photos (``PHOTOS``; the extension may be left out) as an RGB image."""
    if "." not in name:
        name += ".jpg"
    if name not in PHOTOS:
        raise ValueError(f"photo {name!r}: expected one of {PHOTOS}")
    with Image.open(PHOTO_DIR / name) as im:
        return im.convert("RGB")


def _variant(src: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, int]:
    w, h = src.size
    area = w * h * rng.uniform(0.3, 1.0)
    aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
    cw = int(min(w, round((area * aspect) ** 0.5)))
    ch = int(min(h, round((area / aspect) ** 0.5)))
    x0 = int(rng.integers(0, w - cw + 1))
    y0 = int(rng.integers(0, h - ch + 1))
    im = src.crop((x0, y0, x0 + cw, y0 + ch))
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    long_side = int(rng.integers(450, 551))
    out = (long_side, round(long_side * 0.75)) if rng.random() < 0.8 else (round(long_side * 0.75), long_side)
    im = im.resize(out, Image.Resampling.BICUBIC, reducing_gap=3.0)
    im = ImageEnhance.Brightness(im).enhance(rng.uniform(0.75, 1.25))
    im = ImageEnhance.Contrast(im).enhance(rng.uniform(0.75, 1.25))
    im = ImageEnhance.Color(im).enhance(rng.uniform(0.7, 1.3))
    return im, int(rng.integers(85, 96))


def _write_chunk(out: Path, seed: int, chunk: tuple[int, int, int]) -> list[Path]:
    """Images ``start..stop-1`` of class ``c`` (``chunk``); each one's randomness depends only on
    (seed, c, i)."""
    c, start, stop = chunk
    name = PHOTOS[c]
    label = f"{c:02d}_{name.split('.')[0]}"
    (out / label).mkdir(parents=True, exist_ok=True)
    src = load_photo(name)
    written = []
    for i in range(start, stop):
        rng = np.random.default_rng([seed, c, i])
        im, quality = _variant(src, rng)
        path = out / label / f"{label}_{i:05d}.jpg"
        im.save(path, "JPEG", quality=quality)
        written.append(path)
    return written


def write_sample_data(
    out_dir: str | os.PathLike,
    *,
    classes: int = 10,
    per_class: int = 30,
    seed: int = 0,
    progress=None,
    workers: int = 1,
) -> list[Path]:
    """Write ``classes`` × ``per_class`` JPEGs to ``out_dir/<class>/<class>_<i>.jpg``; return the paths.

    ``workers`` > 1 writes in that many processes; the files are the same bytes either way."""
    if not 1 <= classes <= len(PHOTOS):
        raise ValueError(f"classes={classes}: expected 1..{len(PHOTOS)} (one per shipped photo)")
    if per_class < 1:
        raise ValueError(f"per_class={per_class}: expected >= 1")
    if workers < 1:
        raise ValueError(f"workers={workers}: expected >= 1")
    out = Path(out_dir)
    # Chunks small enough to spread over the workers and to report progress, big enough that
    # loading the source photo (once per chunk) stays a small share.
    step = max(1, min(200, -(-classes * per_class // (4 * workers))))
    chunks = [(c, i, min(i + step, per_class)) for c in range(classes) for i in range(0, per_class, step)]
    written: list[Path] = []
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else contextlib.nullcontext() as pool:
        run = pool.map if pool is not None else map  # results in chunk order either way
        write = functools.partial(_write_chunk, out, seed)
        for (_, start, stop), paths in zip(chunks, run(write, chunks), strict=True):
            written += paths
            if progress is not None:
                progress(stop - start)
    return written
