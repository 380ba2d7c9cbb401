"""Small helpers shared by the CLI commands.

Nothing heavy is imported at module level: ``raypipe --help`` must not pay for Ray, torch or pyarrow.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from raypipe import settings
from raypipe._strict_yaml import load_yaml
from raypipe.config import DATA_SECTION
from raypipe.ray_logs import quiet_ray_startup

__all__ = [
    "PROGRESS_INTERVAL_S",
    "progress",
    "write_json",
    "check_json_path",
    "check_index",
    "listing_from_args",
    "data_from_args",
    "rows_from_args",
    "print_skips",
    "part_shares",
    "print_shares",
    "quiet_ray_startup",
    "connect_quietly",
]

# How often a progress line is written when stderr is not a terminal (a job log, CI, a file).
PROGRESS_INTERVAL_S = 5.0


class _LineProgress:
    """tqdm's ``update``/context-manager surface, written as plain lines: a job log shows no ``\\r``
    updates, so it gets one line every ``interval`` seconds and one at the end."""

    def __init__(self, total: int | None, desc: str, unit: str, interval: float, stream, disabled: bool):
        self.total, self.desc, self.unit, self.interval = total, desc, unit, interval
        self.stream, self.disabled = stream, disabled
        self.n = 0
        self.postfix = ""
        self._t0 = self._last = time.monotonic()

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._write(now)

    def _write(self, now: float) -> None:
        if self.disabled:
            return
        elapsed = now - self._t0
        rate = f", {self.n / elapsed:.0f} {self.unit}/s" if elapsed > 0 else ""
        done = f"{self.n}/{self.total} {self.unit}" if self.total else f"{self.n} {self.unit}"
        share = f" ({100 * self.n / self.total:.0f} %)" if self.total else ""
        extra = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {done}{share}{rate}, {elapsed:.0f} s{extra}", file=self.stream, flush=True)

    def close(self) -> None:
        self._write(time.monotonic())

    def __enter__(self) -> _LineProgress:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:  # an error's own message follows; a last progress line would bury it
            self.close()


def progress(total: int | None, desc: str, unit: str = "img"):
    """A progress bar on stderr: tqdm on a terminal; plain lines every ``PROGRESS_INTERVAL_S`` seconds
    when stderr is not one (a job log or CI, where ``\\r`` updates show as nothing). Off with
    ``RAYPIPE_NO_PROGRESS=1``."""
    disabled = settings.current().no_progress
    if not sys.stderr.isatty():
        return _LineProgress(total, desc, unit, PROGRESS_INTERVAL_S, sys.stderr, disabled)
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5, disable=disabled, file=sys.stderr
    )


def check_json_path(path: str | None) -> None:
    """Make the folder of a report path now, so an unwritable one fails before any work starts."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)


def write_json(path: str | None, payload: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def check_index(data: str, kind: str | None, index: str | None) -> None:
    """``--index`` names a shard index, which only WebDataset shards have: any other source is refused
    before anything is listed or started. Its kind is ``--kind``'s, else what a local path's name and
    files say; a URI whose kind only its store can tell is checked by ``open_source`` (``index=``), once
    the store has answered within its deadline."""
    if index is None or (kind is None and "://" in data):
        return
    from raypipe.sources import detect_kind

    kind = kind or detect_kind(data)
    if kind != "webdataset":
        raise ValueError(f"--index {index}: a shard index is for WebDataset shards, {data} is a {kind} dataset")


def listing_from_args(args):
    """The ``ListingOptions`` of the source flags (``raypipe.flags.add_source_args``)."""
    from raypipe.sources import ListingOptions

    return ListingOptions(
        kind=args.kind,
        image_column=args.image_column,
        label_column=args.label_column,
        path_column=args.path_column,
        root=args.root,
        index=args.index,
        fields=tuple(getattr(args, "fields", ())),
    )


def data_from_args(args):
    """The datasets a command names (``raypipe.sources.data_parts.DataParts``): its positional and
    ``--data`` ones in order, with ``--weights`` and ``--samples-per-epoch``; else the config file's
    ``data:`` section (``--samples-per-epoch`` over its own). Each part's ``--index`` is checked here,
    before anything is listed."""
    from raypipe.sources.data_parts import data_parts, parse_data_section

    paths = [*args.data, *getattr(args, "more_data", ())]
    config = getattr(args, "config", None)
    if paths:
        parts = data_parts(paths, args.weights, args.samples_per_epoch)
    elif config and (section := load_yaml(config).get(DATA_SECTION)):
        if args.weights is not None:
            raise ValueError(f"--weights: {config} names the datasets; their weights are set there")
        parts = parse_data_section(section, where=config)
        if args.samples_per_epoch is not None:
            parts = replace(parts, samples_per_epoch=args.samples_per_epoch)
    else:
        raise ValueError("no dataset: give one (DATA or --data), several for a mixture, or a config's data: section")
    if args.index is not None and len(parts.parts) > 1:
        raise ValueError("--index with several datasets: give each part its index in a config file's data: list")
    for part in parts.parts:
        own = dict(part.options)
        check_index(part.path, own.get("kind", args.kind), own.get("index", args.index))
    return parts


def rows_from_args(args, parts=None):
    """The listing a command reads: ``parts`` (``data_from_args``'s) listed with the source flags."""
    return (parts or data_from_args(args)).open(listing_from_args(args))


def part_shares(parts, rows) -> list[dict]:
    """Each dataset of a mixture with its rows, weight and takes an epoch (empty for one dataset)."""
    if not getattr(rows, "mixture_parts", None):
        return []
    total = max(len(rows), 1)
    return [
        {"path": part.path, "rows": size, "weight": weight, "takes": take, "share": take / total}
        for part, size, weight, take in zip(parts.parts, rows.sizes, rows.weights, rows.takes, strict=True)
    ]


def print_shares(shares: list[dict]) -> None:
    """A line per dataset of a mixture: what an epoch takes of it, and how much of its rows that is."""
    for k, s in enumerate(shares):
        cycles = f"{s['takes'] / s['rows']:.2f}x its rows" if s["rows"] else "no rows"
        print(
            f"  source {k}: {s['path']}: {s['rows']} rows, weight {s['weight']:g}, takes {s['takes']} an epoch "
            f"({100 * s['share']:.1f} %, {cycles})"
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


def connect_quietly(args, **kwargs) -> None:
    """``raypipe.runtime.connect`` with Ray's start-up messages hidden unless ``--verbose``."""
    from raypipe.runtime import connect

    verbose = bool(getattr(args, "verbose", False))
    with quiet_ray_startup(verbose):
        connect(quiet=not verbose, **kwargs)
