"""Small helpers shared by the CLI commands."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tqdm import tqdm

from raypipe.sources import open_source

__all__ = ["progress", "write_json", "rows_from_args", "print_skips"]


def progress(total: int | None, desc: str, unit: str = "img"):
    """A tqdm bar on a terminal; plain periodic lines under a job or CI (not a TTY)."""
    tty = sys.stderr.isatty()
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        dynamic_ncols=True,
        mininterval=0.5 if tty else 10.0,
        disable=os.environ.get("RAYPIPE_NO_PROGRESS") == "1",
        file=sys.stderr,
        ascii=not tty,
    )


def write_json(path: str | None, payload: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def rows_from_args(args):
    return open_source(
        args.data,
        kind=args.kind,
        image_column=args.image_column,
        label_column=args.label_column,
        path_column=args.path_column,
        root=args.root,
    )


def print_skips(skipped: dict[str, int], paths: list[dict], limit: int = 20) -> None:
    if not skipped:
        print("  skipped: none")
        return
    print("  skipped: " + ", ".join(f"{k}={v}" for k, v in skipped.items()))
    for s in paths[:limit]:
        print(f"    {s['reason']:<13} {s['path']}  {s['detail']}".rstrip())
    if len(paths) > limit:
        print(f"    … {len(paths) - limit} more (see --json)")
