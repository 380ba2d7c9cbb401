"""CSV / JSONL manifests of ``(path, label)``.

Paths are relative to the manifest's folder (or to ``root`` when given); absolute paths and
URIs are allowed only inside that root. A line whose label is missing or not an integer stays a
row with error ``bad_label``, so it is counted as skipped rather than silently dropped.
"""

from __future__ import annotations

import csv
import io
import json
import os
import posixpath

from raypipe.kernels.errors import BAD_LABEL
from raypipe.sources.paths import DatasetRoot, open_root
from raypipe.sources.table import SourceRows, make_rows

__all__ = ["list_manifest"]


def _read_text(uri: str, filesystem) -> str:
    root = open_root(uri, filesystem=filesystem)
    if root.is_local:
        with open(root.root, encoding="utf-8") as f:
            return f.read()
    with root.filesystem.open_input_stream(root.root) as f:
        return f.read().decode("utf-8")


def _parse_label(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and value >= 0 else None
    if isinstance(value, str):
        v = value.strip()
        return int(v) if v.isdigit() else None
    return None


def _records(text: str, fmt: str, where: str):
    if fmt == "csv":
        reader = csv.DictReader(io.StringIO(text))
        yield from reader
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{where}:{lineno}: expected a JSON object per line")
        yield rec


def list_manifest(
    uri: str,
    *,
    root: str | None = None,
    path_column: str = "path",
    label_column: str = "label",
    filesystem=None,
) -> SourceRows:
    """List a ``.csv`` (with a header) or ``.jsonl`` manifest into SourceRows."""
    lower = uri.lower()
    fmt = "csv" if lower.endswith(".csv") else "jsonl"
    if root is None:
        root = posixpath.dirname(uri) if "://" in uri else os.path.dirname(os.path.abspath(uri))
    droot: DatasetRoot = open_root(root, filesystem=filesystem)
    paths: list[str] = []
    labels: list[int] = []
    errors: list[str | None] = []
    for n, rec in enumerate(_records(_read_text(uri, filesystem), fmt, uri)):
        if path_column not in rec:
            raise ValueError(f"{uri}: record {n} has no {path_column!r} column (keys: {sorted(rec)})")
        path = rec.get(path_column)
        label = _parse_label(rec.get(label_column))
        paths.append("" if path is None else str(path))
        labels.append(-1 if label is None else label)
        errors.append(None if label is not None else f"{BAD_LABEL}: label {rec.get(label_column)!r}")
    if not paths:
        raise ValueError(f"manifest {uri!r} has no rows")
    return SourceRows(kind="manifest", root=droot, table=make_rows(paths, labels, errors=errors))
