"""CSV / JSONL manifests of ``(path, label)``.

Paths are relative to the manifest's folder (or to ``root`` when given); absolute paths and
URIs are allowed only inside that root. Labels are integers, or class names when no label is an
integer, numbered as the folder source numbers its class folders (``class_order``: timm's natural
order by default, or "sorted"; or a ``class_map``), so a manifest of an ImageFolder tree gets the
folder source's labels. timm has no manifest of class names to follow; this keeps the two sources one.
A name the class map lacks is a ``bad_label`` row. A line whose label is
missing, or not an integer among integers, stays a row with error ``bad_label``, so it is counted as
skipped rather than silently dropped.
"""

from __future__ import annotations

import csv
import io
import json
import os
import posixpath

from raypipe.kernels.errors import BAD_LABEL
from raypipe.sources.classes import classes_by_index, load_class_map, order_classes
from raypipe.sources.paths import DatasetRoot, open_root
from raypipe.sources.table import SourceRows, make_rows

__all__ = ["list_manifest"]


def _read_text(uri: str, filesystem) -> str:
    # utf-8-sig: spreadsheet exports start with a byte-order mark, which would glue onto the first header
    root = open_root(uri, filesystem=filesystem)
    if root.is_local:
        with open(root.root, encoding="utf-8-sig") as f:
            return f.read()
    with root.filesystem.open_input_stream(root.root) as f:
        return f.read().decode("utf-8-sig")


def _parse_label(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < 2**63 else None  # an id pasted into the label column is a bad label
    if isinstance(value, float):
        return _parse_label(int(value)) if value.is_integer() and value >= 0 else None
    if isinstance(value, str):
        number = _number(value)  # "3", " 3 ", "3.0" (a float column as pandas writes it)
        return None if number is None else _parse_label(number)
    return None


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _class_names(values: list) -> list[str] | None:
    """The labels as class names, or None: names when no label is an integer and every label given is
    text (``cat``, ``n01440764``); a mix keeps the non-integers as bad labels."""
    given = [v for v in values if v is not None and not (isinstance(v, str) and not v.strip())]
    if not given or not all(isinstance(v, str) for v in given):
        return None
    if any(_number(v) is not None for v in given):  # numbers, even bad ones ("-1", "2.5"), are no names
        return None
    return list({v.strip() for v in given})


def _records(text: str, fmt: str, where: str, columns: tuple[str, str]):
    if fmt == "csv":
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is not None:  # "path, label" is a common way to write a header
            reader.fieldnames = [name.strip() for name in reader.fieldnames]
            missing = [c for c in columns if c not in reader.fieldnames]
            if missing:
                raise ValueError(f"{where}: no column {missing[0]!r} in the header (columns: {reader.fieldnames})")
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
    class_order: str = "natural",
    class_map=None,
) -> SourceRows:
    """List a ``.csv`` (with a header) or ``.jsonl`` manifest into SourceRows (class names: see the
    module doc)."""
    order_classes([], class_order)  # validates class_order
    lower = uri.lower()
    fmt = "csv" if lower.endswith(".csv") else "jsonl"
    if root is None:
        root = posixpath.dirname(uri) if "://" in uri else os.path.dirname(os.path.abspath(uri))
    droot: DatasetRoot = open_root(root, filesystem=filesystem)
    paths: list[str] = []
    raw: list = []
    for n, rec in enumerate(_records(_read_text(uri, filesystem), fmt, uri, (path_column, label_column))):
        if path_column not in rec:
            raise ValueError(f"{uri}: record {n} has no {path_column!r} column (keys: {sorted(rec)})")
        path = rec.get(path_column)
        paths.append("" if path is None else str(path))
        raw.append(rec.get(label_column))
    if not paths:
        raise ValueError(f"manifest {uri!r} has no rows")
    if all(v is None for v in raw) and fmt == "jsonl":
        raise ValueError(f"{uri}: no record has a {label_column!r} key")
    names = _class_names(raw)
    if names is not None:  # class names, numbered as the folder source numbers its class folders
        if class_map is not None:
            index = load_class_map(class_map, droot.root if droot.is_local else None)
            names = list(classes_by_index(index))
        else:
            names = order_classes(names, class_order)
            index = {name: i for i, name in enumerate(names)}
        parsed = [index.get(v.strip()) if isinstance(v, str) else None for v in raw]
    else:
        parsed = [_parse_label(v) for v in raw]
    labels = [-1 if label is None else label for label in parsed]
    errors = [None if label is not None else f"{BAD_LABEL}: label {v!r}" for label, v in zip(parsed, raw, strict=True)]
    table = make_rows(paths, labels, errors=errors)
    return SourceRows(kind="manifest", root=droot, table=table, classes=tuple(names or ()))
