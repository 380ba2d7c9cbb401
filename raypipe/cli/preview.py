"""``raypipe preview``: a PNG grid of augmented samples with their labels.

The grid's few images are augmented in this process (``raypipe.cli.inprocess``): no Ray starts, and
the pixels are those a Ray run of the same epoch and seed gives them.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from raypipe.cli.common import check_json_path, data_from_args, part_shares, print_shares, rows_from_args
from raypipe.flags import add_augment_args, add_config_arg, add_source_args, build_configs

# A grid of more images than this is too large to look at; the cap also keeps preview in-process.
MAX_COUNT = 256


def add_parser(sub) -> None:
    p = sub.add_parser(
        "preview",
        help="write a grid of augmented samples with labels to a PNG",
        description="Write a grid of the first --count augmented images of an epoch, with their "
        "labels, to a PNG. Runs in this process: no Ray starts.",
    )
    add_source_args(p)
    add_augment_args(p)
    p.add_argument("--seed", type=int, help="augmentation and shuffle seed (default: 0, as in raypipe run)")
    add_config_arg(p)
    p.add_argument("--out", required=True, help="output PNG path")
    p.add_argument("--count", type=int, default=16, help=f"number of samples in the grid (1..{MAX_COUNT})")
    p.add_argument("--epoch", type=int, default=0, help="epoch whose order and augmentation are shown")
    p.add_argument("--eval", action="store_true", help="show the eval transform")
    p.set_defaults(func=main)


def make_grid(images, captions: list[str], cols: int | None = None):
    """Tile (N, H, W, 3) uint8 images with a caption strip under each; a PIL image."""
    from PIL import Image, ImageDraw

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


def _label_text(label, names) -> str:
    """``3:dog``, or a multi-hot row's ids (``1+4``)."""
    if getattr(label, "ndim", 0) == 1:  # several labels: the row's ids
        return "+".join(str(int(i)) for i in label.nonzero()[0]) or "-"
    return f"{int(label)}:{names[int(label)] if names and 0 <= label < len(names) else ''}"


def _short(value, width: int = 80) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def main(args: argparse.Namespace) -> int:
    if not 1 <= args.count <= MAX_COUNT:
        raise ValueError(f"--count {args.count}: expected 1..{MAX_COUNT}")
    if args.epoch < 0:
        raise ValueError(f"--epoch {args.epoch}: expected >= 0")
    from PIL import Image

    if Path(args.out).suffix.lower() not in Image.registered_extensions():
        raise ValueError(f"--out {args.out}: expected an image file name, e.g. grid.png")
    cfg = build_configs(args)
    check_json_path(args.out)
    parts = data_from_args(args)
    rows = rows_from_args(args, parts)
    print_shares(part_shares(parts, rows))
    from raypipe.cli.inprocess import first_images

    pipe = cfg["pipeline"]
    batch = first_images(
        rows,
        cfg["eval"] if args.eval else cfg["augment"],
        cfg["decode"],
        count=args.count,
        seed=pipe.seed,
        epoch=args.epoch,
        shuffle=pipe.shuffle,
    )
    if batch is None:
        print("raypipe preview: no image could be read", file=sys.stderr)
        return 1
    names = rows.classes
    ids = [str(int(i)) for i in batch["sample_id"]]
    if "source" in batch:  # a mixture's sample: its source and its id there (``1:42``)
        ids = [f"{int(s)}:{i}" for s, i in zip(batch["source"], ids, strict=True)]
    captions = [f"{_label_text(lbl, names)} #{sid}" for lbl, sid in zip(batch["label"], ids, strict=True)]
    make_grid(batch["image"], captions).save(args.out, compress_level=1)  # PNG: fast beats small here
    print(f"raypipe preview: wrote {len(captions)} samples to {args.out}")
    for k, sid in enumerate(ids):  # the fields, which a grid's strip cannot hold
        if rows.fields:
            shown = ", ".join(f"{name}={_short(batch[name][k])}" for name in rows.fields)
            print(f"  #{sid}: {shown}")
    return 0
