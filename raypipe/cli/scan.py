"""``raypipe scan``: decode every image across Ray and classify it ok / skipped(reason)."""

from __future__ import annotations

import argparse

from raypipe.cli.args import add_source_args
from raypipe.cli.common import print_skips, progress, rows_from_args, write_json
from raypipe.config import DecodeConfig, EvalAugment, PipelineConfig
from raypipe.pipeline.pipeline import Pipeline
from raypipe.runtime import connect


def add_parser(sub) -> None:
    p = sub.add_parser("scan", help="decode every image and report ok / skipped by reason, with paths")
    add_source_args(p)
    p.add_argument("--max-pixels", type=int, default=DecodeConfig().max_pixels)
    p.add_argument("--num-actors", type=int)
    p.add_argument("--json", help="write a machine-readable report here")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    rows = rows_from_args(args)  # a bad dataset is reported before a Ray starts
    connect()
    # A full decode (no DCT scaling) so truncation anywhere in the file is found; tiny output.
    pipe = Pipeline(
        rows,
        EvalAugment(input_size=16, crop_mode="squash"),
        # no skip limit: listing every bad file is what scan is for
        config=PipelineConfig(batch_size=1024, shuffle=False, num_actors=args.num_actors, max_skip_ratio=None),
        decode=DecodeConfig(max_pixels=args.max_pixels, dct_scaling=False),
    )
    run = pipe.epoch(0)
    with progress(len(rows), "scan") as bar:
        for batch in run:
            bar.update(len(batch["sample_id"]))
    rep = run.report
    print(f"raypipe scan: {rep.expected} files: ok {rep.emitted}, skipped {rep.num_skipped}")
    print_skips(rep.skipped, rep.skipped_paths)
    write_json(
        args.json,
        {
            "data": args.data,
            "total": rep.expected,
            "ok": rep.emitted,
            "skipped": rep.skipped,
            "skipped_paths": rep.skipped_paths,
        },
    )
    return 0
