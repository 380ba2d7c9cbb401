"""``raypipe scan``: decode every image and classify it ok / skipped(reason); exit 1 if any is bad.

Datasets of at most ``SCAN_IN_PROCESS_MAX`` images are decoded in this process (no Ray starts);
larger ones, or any with ``--ray``, across Ray.
"""

from __future__ import annotations

import argparse
from collections import Counter

from raypipe.cli.common import (
    check_json_path,
    connect_quietly,
    data_from_args,
    listing_from_args,
    part_shares,
    print_shares,
    print_skips,
    progress,
    write_json,
)
from raypipe.config import DEFAULT_MAX_PIXELS
from raypipe.flags import add_source_args

# Mirrors raypipe.cli.inprocess.SCAN_IN_PROCESS_MAX (not imported here: it pulls in pyarrow and the
# kernels, which --help must not pay for); a test checks they agree.
_IN_PROCESS_MAX = 1000


def add_parser(sub) -> None:
    p = sub.add_parser(
        "scan",
        help="decode every image and report ok / skipped by reason, with paths",
        description="Decode every image fully and report ok / skipped by reason, with paths. Exit status 1 "
        f"when any image is bad. Up to {_IN_PROCESS_MAX} images are decoded in this process; more run on Ray.",
    )
    add_source_args(p)
    p.add_argument(
        "--max-pixels",
        type=int,
        default=DEFAULT_MAX_PIXELS,
        help="images with more pixels are skipped as decompression bombs",
    )
    p.add_argument("--num-tasks", type=int, help="decode tasks at once on Ray (default: the cluster's CPUs / 0.5)")
    p.add_argument(
        "--ray", action="store_true", help=f"decode on Ray even when there are at most {_IN_PROCESS_MAX} images"
    )
    p.add_argument("--json", help="write a machine-readable report here")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from raypipe.config import DecodeConfig, EvalAugment

    if args.num_tasks is not None and args.num_tasks < 1:
        raise ValueError(f"--num-tasks {args.num_tasks}: expected >= 1")
    # A full decode (no DCT scaling) so truncation anywhere in the file is found; tiny output.
    augment = EvalAugment(input_size=16, crop_mode="squash")
    decode = DecodeConfig(max_pixels=args.max_pixels, dct_scaling=False)
    check_json_path(args.json)
    parts = data_from_args(args)
    listed = parts.listed(listing_from_args(args))  # a bad dataset is reported before anything runs
    shares = part_shares(parts, parts.mix(listed))  # and a mixture's parts that do not fit together
    print_shares(shares)
    total, ok, skipped, skipped_paths = 0, 0, Counter(), []
    on_ray = args.ray or sum(len(rows) for rows in listed) > _IN_PROCESS_MAX
    for k, rows in enumerate(listed):  # every row of each dataset once, whatever a mixture's weights
        scan = _scan_on_ray if on_ray else _scan_here
        n, good, reasons, paths = scan(args, rows, augment, decode)
        total, ok = total + n, ok + good
        skipped.update(reasons)
        skipped_paths += [{"source": k} | s for s in paths] if shares else paths
        if shares:
            print(f"  source {k}: {n} files: ok {good}, skipped {len(paths)}")
    print(f"raypipe scan: {total} files: ok {ok}, skipped {len(skipped_paths)}")
    print_skips(dict(skipped), skipped_paths)
    report = {"data": parts.describe(), "total": total, "ok": ok, "skipped": dict(skipped)}
    write_json(args.json, report | {"skipped_paths": skipped_paths} | ({"parts": shares} if shares else {}))
    return 1 if skipped_paths else 0


def _scan_here(args, rows, augment, decode):
    from raypipe.cli.inprocess import ScanTally, scan_blocks

    tally = ScanTally()
    with progress(len(rows), "scan") as bar:
        for block in scan_blocks(rows, augment, decode):
            tally.add(block)
            bar.update(len(block["ok"]))
    return tally.total, tally.ok, dict(tally.skipped), tally.skipped_paths


def _scan_on_ray(args, rows, augment, decode):
    from raypipe.config import ExecutionConfig, PipelineConfig
    from raypipe.pipeline.pipeline import Pipeline

    # Every image is reported, however many are bad: no skip limit.
    config = PipelineConfig(batch_size=1024, shuffle=False, max_skip_ratio=None)
    connect_quietly(args)
    run = Pipeline(
        rows, augment, config=config, execution=ExecutionConfig(num_tasks=args.num_tasks), decode=decode
    ).epoch(0)
    with progress(len(rows), "scan") as bar:
        for batch in run:
            bar.update(len(batch["sample_id"]))
    rep = run.report
    return rep.expected, rep.emitted, dict(rep.skipped), list(rep.skipped_paths)
