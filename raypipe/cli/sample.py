"""``raypipe sample-data``: write the embedded sample dataset (real photos, no download)."""

from __future__ import annotations

import argparse
import os

from raypipe.cli.common import progress


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sample-data",
        help="write an ImageNet-like JPEG image folder made from real photos",
        description="Write an ImageNet-like JPEG image folder (one class per shipped photo); "
        "the same arguments write the same bytes.",
    )
    p.add_argument("out_dir", help="folder to write <class>/<class>_<i>.jpg into")
    p.add_argument("--classes", type=int, default=10, help="number of classes (one per shipped photo)")
    p.add_argument("--per-class", type=int, default=30, help="images per class")
    p.add_argument("--seed", type=int, default=0, help="seed of the crops and colour shifts")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (the same files for any count)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from raypipe.sample_data import PHOTOS, write_sample_data

    if not 1 <= args.classes <= len(PHOTOS):
        raise ValueError(f"--classes {args.classes}: expected 1..{len(PHOTOS)} (one per shipped photo)")
    with progress(args.classes * args.per_class, "sample-data") as bar:
        paths = write_sample_data(
            args.out_dir,
            classes=args.classes,
            per_class=args.per_class,
            seed=args.seed,
            progress=bar.update,
            workers=args.workers,
        )
    print(f"raypipe sample-data: wrote {len(paths)} JPEGs in {args.classes} classes to {args.out_dir}")
    return 0
