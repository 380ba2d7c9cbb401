"""``raypipe sample-data``: write the embedded sample dataset (real photos, no download)."""

from __future__ import annotations

import argparse
import os

from raypipe.cli.common import progress
from raypipe.sample_data import write_sample_data


def add_parser(sub) -> None:
    p = sub.add_parser("sample-data", help="write an ImageNet-like JPEG image folder made from real photos")
    p.add_argument("out_dir")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (same files for any count)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
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
