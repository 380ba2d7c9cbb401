"""CSV / JSONL manifests of ``(path, label)``.

Paths are relative to the manifest's folder (or to ``root`` when given); absolute paths and
URIs are allowed only inside that root. Labels are integers, or class names when no label is an
integer, numbered as the folder source numbers its class folders (``class_order``: timm's natural
order by default, or "sorted"; or a ``class_map``), so a manifest of an ImageFolder tree gets the
folder source's labels. timm has no manifest of class names to follow; this keeps the two sources one.
A name the class map lacks is a ``bad_label`` row. A line whose label is
missing, or not an integer among integers, stays a row with error ``bad_label``, so it is counted as
skipped rather than silently dropped.

Listing goes straight into Arrow: pyarrow's CSV reader (paths as a string column, labels
dictionary-encoded) or JSON reader, and the label rules above run once per *distinct* label value,
never per row, so a manifest of ImageNet-21k's 14.2M lines holds no Python object per line. A file
those readers refuse or could read differently from the rules here (rows with too few or too many
fields, a label column of floats or mixed types, a path that is not text, two JSON objects on one
line, text that is not UTF-8) is read line by line in Python instead, which gives the same rows and
the same errors, at that cost.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import posixpath

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from raypipe.kernels.errors import BAD_LABEL
from raypipe.sources.classes import classes_by_index, load_class_map, order_classes
from raypipe.sources.fields import with_value_columns
from raypipe.sources.label_sets import LABELS, is_label_sets, label_sets
from raypipe.sources.table import SourceRows, int64_array, make_file_rows, string_array
from raypipe.sources.transport.paths import DatasetRoot, open_root

__all__ = ["class_labeller", "list_manifest", "number_labels"]


def _open(uri: str, filesystem):
    """The manifest as a binary stream."""
    root = open_root(uri, filesystem=filesystem)
    if root.is_local:
        if os.path.isdir(root.root):  # as open() says it: Arrow's own message names no errno
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), root.root)
        return pa.OSFile(root.root, "rb")
    return root.filesystem.open_input_stream(root.root)


def _read_text(uri: str, filesystem) -> str:
    # utf-8-sig: spreadsheet exports start with a byte-order mark, which would glue onto the first header
    with _open(uri, filesystem) as f:
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


class _NotForArrow(Exception):
    """The manifest is one the Arrow readers would read differently: read it line by line."""


def _header(uri: str, filesystem) -> list[str] | None:
    """The CSV header's column names as written (None: no header line)."""
    with _open(uri, filesystem) as f:
        first = b""
        while b"\n" not in first:
            block = f.read(1 << 16)
            if not block:
                break
            first += block
    line = first.split(b"\n", 1)[0].decode("utf-8-sig")
    if not line.strip():
        return None
    return next(csv.reader([line]))


def _arrow_csv(uri: str, filesystem, columns: tuple[str, str]) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """(paths, labels) of a CSV manifest: strings, and labels dictionary-encoded."""
    raw = _header(uri, filesystem)
    if raw is None:
        raise _NotForArrow
    names = [name.strip() for name in raw]  # "path, label" is a common way to write a header
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"{uri}: no column {missing[0]!r} in the header (columns: {names})")
    if any(names.count(c) > 1 for c in columns) or any("\r" in n or '"' in n for n in raw):
        raise _NotForArrow  # csv.DictReader's rules (the last of two same names wins) are Python's
    path_column, label_column = columns
    placeholders = [f"_{i}" for i in range(len(names))]  # other columns' names may repeat: never read
    path_at, label_at = placeholders[names.index(path_column)], placeholders[names.index(label_column)]
    try:
        with _open(uri, filesystem) as f:
            table = pacsv.read_csv(
                f,
                # one thread: the blocks several threads hold in flight were a third of the peak at
                # ImageNet's 1.28M rows (2.0x the table, 1.7x without), for no faster a listing there
                read_options=pacsv.ReadOptions(skip_rows=1, column_names=placeholders, use_threads=False),
                parse_options=pacsv.ParseOptions(newlines_in_values=True),
                convert_options=pacsv.ConvertOptions(
                    include_columns=[path_at, label_at],
                    column_types={path_at: pa.string(), label_at: pa.dictionary(pa.int32(), pa.string())},
                ),
            )
    except pa.ArrowInvalid:
        raise _NotForArrow from None  # a row of another width, or not UTF-8
    return table.column(path_at), table.column(label_at)


def _arrow_jsonl(uri: str, filesystem, columns: tuple[str, str]) -> tuple[pa.ChunkedArray, pa.ChunkedArray | None]:
    """(paths, labels) of a JSONL manifest (labels None: no record has the key)."""
    path_column, label_column = columns
    try:
        with _open(uri, filesystem) as f:
            table = pajson.read_json(f)
    except pa.ArrowInvalid:
        raise _NotForArrow from None  # not JSON, not objects, or a key's type changes
    if path_column not in table.column_names or table.column(path_column).null_count:
        raise _NotForArrow  # the line-by-line read names the record without a path
    paths = table.column(path_column)
    labels = table.column(label_column) if label_column in table.column_names else None
    if not pa.types.is_string(paths.type):
        raise _NotForArrow  # numbers as paths: str() of the value
    if labels is not None and not (
        pa.types.is_string(labels.type)
        or pa.types.is_int64(labels.type)
        or is_label_sets(labels.type)  # lists of class ids: several labels per image
        or pa.types.is_boolean(labels.type)
        or pa.types.is_null(labels.type)
    ):
        raise _NotForArrow  # floats: a bad label's message shows 2 as Python's JSON reads it, not 2.0
    with _open(uri, filesystem) as f:  # one object per line, as the line-by-line read requires
        lines = sum(1 for line in io.BufferedReader(f) if line.strip())
    if lines != table.num_rows:
        raise _NotForArrow
    return paths, labels


def _int_view(arr: pa.Array) -> np.ndarray:
    """An integer array without nulls as numpy, through its buffer (``to_numpy`` would import pandas)."""
    width = arr.type.bit_width // 8
    return np.frombuffer(arr.buffers()[1], f"<i{width}", count=len(arr), offset=arr.offset * width)


def _distinct(labels: pa.ChunkedArray) -> pa.Array:
    """The distinct non-null values of a dictionary-encoded column, whatever each chunk's dictionary."""
    return pc.unique(pa.concat_arrays([chunk.dictionary for chunk in labels.chunks])).drop_null()


def _per_chunk_codes(labels: pa.ChunkedArray, distinct: pa.Array, null_code: int):
    """Each chunk's rows as indices into ``distinct`` (``null_code`` for a null), int64."""
    for chunk in labels.chunks:
        where = _int_view(pc.index_in(chunk.dictionary, value_set=distinct).cast(pa.int64()))
        where = np.append(where, null_code)  # the last: what a null row points at
        indices = chunk.indices
        if indices.null_count:
            indices = pc.fill_null(indices, len(chunk.dictionary))
        yield where[_int_view(indices)]


def _label_values(values: list, class_order: str, class_map, droot: DatasetRoot) -> tuple[list, list[str] | None]:
    """Each value's label (None: a bad label) and the class names, if the labels are names."""
    names = _class_names(values)
    if names is None:
        return [_parse_label(v) for v in values], None
    # class names, numbered as the folder source numbers its class folders
    if class_map is not None:
        index = load_class_map(class_map, droot.root if droot.is_local else None)
        names = list(classes_by_index(index))
    else:
        names = order_classes(names, class_order)
        index = {name: i for i, name in enumerate(names)}
    return [index.get(v.strip()) if isinstance(v, str) else None for v in values], names


def _bad(value) -> str:
    return f"{BAD_LABEL}: label {value!r}"


def _rows_by_line(uri: str, fmt: str, filesystem, columns: tuple[str, str], labelled):
    """(paths, labels, errors, class names) read line by line (see the module doc)."""
    path_column, label_column = columns
    paths: list[str] = []
    raw: list = []
    for n, rec in enumerate(_records(_read_text(uri, filesystem), fmt, uri, columns)):
        if path_column not in rec:
            raise ValueError(f"{uri}: record {n} has no {path_column!r} column (keys: {sorted(rec)})")
        path = rec.get(path_column)
        paths.append("" if path is None else str(path))
        raw.append(rec.get(label_column))
    if not paths:
        raise ValueError(f"manifest {uri!r} has no rows")
    if all(v is None for v in raw) and fmt == "jsonl":
        raise ValueError(f"{uri}: no record has a {label_column!r} key")
    parsed, names = labelled(raw)
    labels = np.array([-1 if label is None else label for label in parsed], dtype=np.int64)
    errors = string_array([None if label is not None else _bad(v) for label, v in zip(parsed, raw, strict=True)])
    return string_array(paths), labels, errors, names


def _rows_by_arrow(uri: str, fmt: str, filesystem, columns: tuple[str, str], labelled):
    """(paths, labels, errors, class names, label sets or None) through the Arrow readers, the label
    rules run per distinct value."""
    if fmt == "csv":
        paths, labels = _arrow_csv(uri, filesystem, columns)
    else:
        paths, labels = _arrow_jsonl(uri, filesystem, columns)
    n = len(paths)
    if n == 0:
        raise ValueError(f"manifest {uri!r} has no rows")
    if (labels is None or labels.null_count == n) and fmt == "jsonl":
        raise ValueError(f"{uri}: no record has a {columns[1]!r} key")
    if labels is not None and is_label_sets(labels.type):
        return (paths, *_label_set_rows(labels))
    out, errors, names = number_labels(labels, n, labelled)
    # paths stay in the reader's chunks: joining them would copy every path once more at the peak
    return paths, out, errors, names, None


def _label_set_rows(labels: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array | None, None, pa.Array]:
    """(labels: 0, -1 where bad; errors; no class names; the sets) of a JSONL label column of lists of
    class ids."""
    label, sets = label_sets(labels)
    bad = label.is_null().to_numpy(zero_copy_only=False)
    errors = string_array([f"{BAD_LABEL}: a null or negative id in the label set" if b else None for b in bad])
    return np.where(bad, -1, 0).astype(np.int64), (errors if bad.any() else None), None, sets


def class_labeller(class_order: str = "natural", class_map=None, root: DatasetRoot | None = None):
    """The manifest's label rules as ``labelled(values) -> (label or None per value, class names or
    None)``; ``root``: where a relative ``class_map`` file is looked up (a local root only)."""
    order_classes([], class_order)  # validates class_order
    droot = root if root is not None else DatasetRoot(root="", filesystem=None)

    def labelled(values: list) -> tuple[list, list[str] | None]:
        return _label_values(values, class_order, class_map, droot)

    return labelled


def number_labels(
    labels: pa.ChunkedArray | pa.Array | None, n: int, labelled
) -> tuple[np.ndarray, pa.ChunkedArray | None, list[str] | None]:
    """Each of ``n`` rows' label (-1 where bad), its error (a chunked string column, null where good; None
    when no row is bad) and the class names when the labels are names, from a label column of integers
    or strings (None or all null: every label bad). ``labelled``: :func:`class_labeller`'s rules, run once
    per distinct value, never per row."""
    if labels is None or labels.null_count == n:
        labels = pa.chunked_array([pa.nulls(n, pa.string())])
    if isinstance(labels, pa.Array):
        labels = pa.chunked_array([labels])
    if not pa.types.is_dictionary(labels.type):
        labels = pc.dictionary_encode(labels)
    distinct = _distinct(labels)
    values = distinct.to_pylist() + ([None] if labels.null_count else [])
    parsed, names = labelled(values)  # once per distinct value, not per row
    label_of = np.array([-1 if label is None else label for label in parsed], dtype=np.int64)
    messages = string_array([_bad(v) if label is None else None for v, label in zip(values, parsed, strict=True)])
    out = np.empty(n, dtype=np.int64)
    error_chunks, start = [], 0
    for codes in _per_chunk_codes(labels, distinct, len(values) - 1):
        out[start : start + len(codes)] = label_of[codes]
        error_chunks.append(messages.take(int64_array(codes)) if messages.null_count < len(messages) else None)
        start += len(codes)
    errors = pa.chunked_array(error_chunks, pa.string()) if error_chunks and error_chunks[0] is not None else None
    return out, errors, names


def list_manifest(
    uri: str,
    *,
    root: str | None = None,
    path_column: str = "path",
    label_column: str = "label",
    filesystem=None,
    class_order: str = "natural",
    class_map=None,
    fields: tuple[str, ...] = (),
) -> SourceRows:
    """List a ``.csv`` (with a header) or ``.jsonl`` manifest into SourceRows (class names: see the
    module doc); ``fields``: columns (JSON keys) whose values the rows carry (``raypipe.sources.fields``):
    a CSV's as text, a JSON line's as JSON gives them, a missing one as null."""
    lower = uri.lower()
    fmt = "csv" if lower.endswith(".csv") else "jsonl"
    if root is None:
        root = posixpath.dirname(uri) if "://" in uri else os.path.dirname(os.path.abspath(uri))
    droot: DatasetRoot = open_root(root, filesystem=filesystem)
    labelled = class_labeller(class_order, class_map, droot)
    columns = (path_column, label_column)
    try:
        paths, labels, errors, names, sets = _rows_by_arrow(uri, fmt, filesystem, columns, labelled)
    except _NotForArrow:  # (a list of labels there is a bad label: the typed reader alone reads sets)
        paths, labels, errors, names = _rows_by_line(uri, fmt, filesystem, columns, labelled)
        sets = None
    table = make_file_rows(paths, labels, errors)
    if sets is not None:
        table = table.append_column(LABELS, sets)
    if fields:
        table = with_value_columns(table, _field_values(uri, fmt, filesystem, fields, table.num_rows), uri)
    pa.default_memory_pool().release_unused()  # the reader's blocks: freed, but kept by the allocator
    extra = {"fields": tuple(fields)} if fields else {}
    return SourceRows(kind="manifest", root=droot, table=table, classes=tuple(names or ()), extra=extra)


def _field_values(uri: str, fmt: str, filesystem, fields: tuple[str, ...], rows: int) -> dict[str, list]:
    """Each field's value per record (None where a record lacks it), read line by line: a field may be
    any JSON value, which the typed Arrow readers would refuse or retype."""
    values: dict[str, list] = {name: [] for name in fields}
    records = _records(_read_text(uri, filesystem), fmt, uri, fields if fmt == "csv" else ())
    for rec in records:
        for name in fields:
            values[name].append(rec.get(name))
    if any(len(v) != rows for v in values.values()):
        raise ValueError(f"{uri}: {len(next(iter(values.values())))} records hold fields, {rows} were listed")
    if fmt == "jsonl":
        absent = [name for name, v in values.items() if all(x is None for x in v)]
        if absent:
            raise ValueError(f"{uri}: no record has a {absent[0]!r} key (fields={list(fields)})")
    return {name: [v] for name, v in values.items()}
