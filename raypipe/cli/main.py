"""The ``raypipe`` console script."""

from __future__ import annotations

import argparse
import sys

from raypipe.cli import preview, run, sample, scan
from raypipe.pipeline.accounting import SkipLimitError

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raypipe", description="Ray-distributed image preprocessing for PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (sample, scan, run, preview):
        module.add_parser(sub)
    try:
        from raypipe.cli import bench
    except ImportError:
        pass
    else:
        bench.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as e:  # configuration, dataset and file errors: a clear message, no traceback
        print(f"raypipe {args.command}: error: {e}", file=sys.stderr)
        return 2
    except SkipLimitError as e:  # the data is broken, not raypipe: its own short message says what to do
        print(f"raypipe {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"raypipe {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
