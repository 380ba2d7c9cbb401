"""``raypipe convert``: write a dataset as WebDataset tar shards or Parquet files, in parallel across Ray."""

from __future__ import annotations

import argparse

from raypipe.cli.common import check_index, check_json_path, connect_quietly, listing_from_args, progress, write_json
from raypipe.flags import add_index_arg

# Restated here (not imported) so that `raypipe --help` imports no pyarrow; tests check they agree with
# raypipe.sources.KINDS and raypipe.sources.writing.convert.FORMATS.
KINDS = ("folder", "parquet", "manifest", "webdataset")
FORMATS = ("webdataset", "parquet")


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="write any dataset raypipe reads as WebDataset shards or Parquet files")
    p.add_argument("src", help="image folder, Parquet, manifest or WebDataset shards (local path or URI)")
    p.add_argument("dst", help="output folder (local path or URI); must hold no shards yet")
    p.add_argument("--format", choices=FORMATS, required=True, help="what to write")
    p.add_argument("--kind", choices=KINDS, help="source kind (detected if omitted)")
    p.add_argument("--shard-size", default="256MB", help="target bytes per output shard (e.g. 256MB, 1GiB)")
    p.add_argument("--max-side", type=int, help="re-encode (JPEG q90) images whose longer side exceeds this")
    p.add_argument("--image-column", default="image", help="Parquet image-bytes column of the source")
    p.add_argument("--label-column", default="label", help="Parquet/manifest label column of the source")
    p.add_argument("--path-column", default="path", help="manifest path column of the source")
    p.add_argument("--root", help="manifest dataset root (default: the manifest's folder)")
    add_index_arg(p)
    p.add_argument("--json", help="write a machine-readable report here")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from raypipe.sources.writing.convert import convert

    if args.max_side is not None and args.max_side < 1:
        raise ValueError(f"--max-side {args.max_side}: expected >= 1")
    check_index(args.src, args.kind, args.index)
    check_json_path(args.json)
    connect_quietly(args)
    options = listing_from_args(args)
    bar = None

    def shown(done: int, total: int, samples: int) -> None:
        nonlocal bar
        if bar is None:
            bar = progress(total, "convert", unit="shard")
        bar.update(done - bar.n)
        bar.set_postfix_str(f"{samples} samples", refresh=False)

    try:
        report = convert(
            args.src,
            args.dst,
            format=args.format,
            shard_size=args.shard_size,
            max_side=args.max_side,
            progress=shown,
            options=options,
        )
    finally:
        if bar is not None:
            bar.close()
    print(
        f"raypipe convert: {report.samples} samples in {len(report.shards)} {args.format} shards "
        f"under {args.dst} ({report.pattern}), {report.seconds:.1f}s"
    )
    if args.max_side:
        print(f"  resized {report.resized}, kept undecodable {report.undecodable}")
    if report.skipped:
        print(f"  left out {len(report.skipped)} unreadable samples:")
        for s in report.skipped[:20]:
            print(f"    {s['reason']:<13} {s['path']}  {s['detail']}".rstrip())
    write_json(
        args.json,
        {
            "src": args.src,
            "dst": args.dst,
            "format": args.format,
            "shards": list(report.shards),
            "pattern": report.pattern,
            "samples": report.samples,
            "skipped": list(report.skipped),
            "resized": report.resized,
            "undecodable": report.undecodable,
            "classes": report.extra.get("classes", []),
        },
    )
    return 0
