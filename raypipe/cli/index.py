"""``raypipe index``: write raypipe's shard index for existing WebDataset shards, in parallel across Ray."""

from __future__ import annotations

import argparse

from raypipe.cli.common import check_json_path, connect_quietly, write_json


def add_parser(sub) -> None:
    p = sub.add_parser("index", help="index WebDataset shards, so that listing them reads one small file")
    p.add_argument("data", help="WebDataset shards: a folder, prefix, .tar, brace pattern or wids .json")
    p.add_argument(
        "--out",
        help="where to write the index (default: raypipe-index.parquet beside the shards; "
        "other commands read one elsewhere with --index PATH, open_source with "
        "index=PATH)",
    )
    p.add_argument("--json", help="write a machine-readable report here")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from raypipe.sources.indexes.indexer import index_shards

    if args.out is not None and not args.out.endswith(".parquet"):
        raise ValueError(f"--out {args.out}: expected a .parquet path")
    check_json_path(args.json)
    report = index_shards(args.data, args.out, connect=lambda: connect_quietly(args))
    print(
        f"raypipe index: {report.samples} samples in {report.shards} shards ({report.shard_bytes / 1e6:.1f} MB) "
        f"indexed into {report.index}, {report.seconds:.1f}s"
    )
    write_json(
        args.json,
        {
            "data": args.data,
            "index": report.index,
            "shards": report.shards,
            "samples": report.samples,
            "shard_bytes": report.shard_bytes,
        },
    )
    return 0
