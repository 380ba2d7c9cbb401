"""``raypipe preview``: a PNG grid of augmented samples with their labels."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from raypipe.cli.args import add_augment_args, add_pipeline_args, add_source_args, build_configs
from raypipe.cli.common import rows_from_args
from raypipe.pipeline.pipeline import Pipeline
from raypipe.runtime import connect


def add_parser(sub) -> None:
    p = sub.add_parser("preview", help="write a grid of augmented samples with labels to a PNG")
    add_source_args(p)
    add_augment_args(p)
    add_pipeline_args(p)
    p.add_argument("--out", required=True, help="output PNG path")
    p.add_argument("--count", type=int, default=16, help="number of samples in the grid")
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--eval", action="store_true", help="show the eval transform")
    p.set_defaults(func=main)


def make_grid(images: np.ndarray, captions: list[str], cols: int | None = None) -> Image.Image:
    """Tile (N, H, W, 3) uint8 images with a caption strip under each."""
    n, h, w, _ = images.shape
    cols = cols or max(1, math.ceil(math.sqrt(n)))
    rows = math.ceil(n / cols)
    strip = 14
    grid = Image.new("RGB", (cols * w, rows * (h + strip)), "white")
    draw = ImageDraw.Draw(grid)
    for i in range(n):
        x, y = (i % cols) * w, (i // cols) * (h + strip)
        grid.paste(Image.fromarray(images[i]), (x, y))
        draw.text((x + 2, y + h + 1), captions[i][: max(4, w // 6)], fill="black")
    return grid


def main(args: argparse.Namespace) -> int:
    from dataclasses import replace

    cfg = build_configs(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # before the pipeline runs, as --json does
    rows = rows_from_args(args)  # a bad dataset is reported before a Ray starts
    connect()
    augment = cfg["eval"] if args.eval else cfg["augment"]
    pipe_cfg = replace(cfg["pipeline"], batch_size=args.count, drop_last=False)
    pipe = Pipeline(rows, augment, config=pipe_cfg, execution=cfg["execution"], decode=cfg["decode"])
    run = pipe.epoch(args.epoch)
    batch = next(iter(run), None)
    if batch is None:
        print("raypipe preview: no image could be read")
        return 1
    names = rows.classes
    captions = [
        f"{int(lbl)}:{names[int(lbl)] if names and 0 <= lbl < len(names) else ''} #{int(sid)}"
        for lbl, sid in zip(batch["label"], batch["sample_id"], strict=True)
    ]
    make_grid(np.asarray(batch["image"]), captions).save(args.out)
    print(f"raypipe preview: wrote {len(captions)} samples to {args.out}")
    return 0
