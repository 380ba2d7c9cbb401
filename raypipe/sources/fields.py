"""Fields: per-sample data carried beside the image (a caption, JSON metadata, any column or member).

``ListingOptions(fields=("txt", "json"))`` names them: a WebDataset's members by extension, a Parquet
file's, a manifest's or a Ray Dataset's columns by name. The listing records where each row's field
lies, never what it holds where that would grow with the dataset's bytes:

- a column's value is in the row table itself, as column ``field:NAME`` (a Parquet file's or a
  manifest's column is read when listing, as the labels are);
- a tar member's place is, as columns ``field:NAME:offset``, ``:size`` and ``:crc`` (its data's byte
  range and its header's digest; -1 where the sample has no such member), and the worker reads it
  with the image, in the same ranged requests (``member_rows``).

On the worker a row's field becomes its value (``decode_member``): ``txt``/``text`` members as ``str``,
``json`` parsed, ``cls`` and other id members as ``int``, any other member as ``bytes``; a column's
cell as it is. A row without a named field is skipped as ``missing_field``, one whose member is not
what its extension says (a ``.json`` that does not parse, text that is not UTF-8) as ``bad_field``.
Fields never change an image's pixels, its row's id or the order: the order and the listing's digest
do not look at them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from raypipe._values import fail
from raypipe.kernels.errors import BAD_FIELD, MISSING_FIELD, SkipImage

__all__ = [
    "RESERVED",
    "check_fields",
    "decode_member",
    "cells",
    "member_columns",
    "member_rows",
    "value_column",
    "with_value_columns",
]

# Names a batch already holds (a mixture's batches carry ``source`` and ``take``): a field cannot take them.
RESERVED = ("image", "label", "sample_id", "source", "take")

_TEXT = ("txt", "text", "transcript", "caption")
_JSON = ("json", "jsn")
_INT = ("cls", "cls2", "class", "count", "index", "inx", "id")


def check_fields(value) -> tuple[str, ...]:
    """``value`` (a name or a sequence of names) as a tuple of distinct field names, checked.

    Raises:
        ValueError: a name that is empty, not a string, repeated, or one of ``RESERVED``.
    """
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n for n in names):
        fail("fields", value, "expected field names (a WebDataset member's extension or a column's name)")
    names = tuple(n.lower() if n.startswith(".") else n for n in names)
    names = tuple(n[1:] if n.startswith(".") else n for n in names)  # ".txt" names the member "txt"
    if clash := [n for n in names if n in RESERVED]:
        fail("fields", value, f"{clash[0]!r} is what every batch holds already ({', '.join(RESERVED)})")
    if len(set(names)) != len(names):
        fail("fields", value, "a field is named twice")
    return names


def value_column(name: str) -> str:
    """The row table's column that holds field ``name``'s values (tabular sources)."""
    return f"field:{name}"


def member_columns(name: str) -> tuple[str, str, str]:
    """The row table's columns that place field ``name``'s tar member: offset, size, header digest."""
    return f"field:{name}:offset", f"field:{name}:size", f"field:{name}:crc"


def decode_member(name: str, data: bytes) -> object:
    """A tar member's bytes as field ``name``'s value, by its extension (the last part of ``name``).

    Raises:
        SkipImage: ``bad_field``, bytes that are not what the extension says.
    """
    ext = name.rsplit(".", 1)[-1].lower()
    if ext in _TEXT or ext in _JSON or ext in _INT:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SkipImage(BAD_FIELD, f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if ext in _TEXT:
            return text
        if ext in _JSON:
            try:
                return json.loads(text)
            except ValueError as e:
                raise SkipImage(BAD_FIELD, f"{name}: not JSON ({e})") from None
        try:
            return int(text.strip())
        except ValueError:
            raise SkipImage(BAD_FIELD, f"{name}: not an integer ({text.strip()[:32]!r})") from None
    return bytes(data)


def cells(rows: Mapping[str, np.ndarray], name: str) -> list:
    """Column field ``name``'s value per row of a block, or the ``SkipImage`` of a null cell."""
    return [SkipImage(MISSING_FIELD, f"no {name!r}") if _missing(c) else c for c in rows[value_column(name)]]


def _missing(cell) -> bool:
    return cell is None or (isinstance(cell, float | np.floating) and bool(np.isnan(cell)))


def member_rows(rows: Mapping[str, np.ndarray], names: tuple[str, ...], *, images: bool) -> dict[str, np.ndarray]:
    """A WebDataset block's rows as ``BlockReader.read_block`` reads members: each named field's member
    per row after (``images``) the rows' own image members, ``len(rows) * (images + len(names))`` rows
    in all. Members of a sample lie next to each other in its shard, so one call reads a sample's image
    and fields in the same ranged requests.

    A field's row is its member's (``offset``, ``size``, its header digest as ``header_crc``, no
    ``member`` name: the digest identifies the header); a row without the member is a
    ``missing_field`` skip, and a row known bad keeps its own reason."""
    n = len(rows["sample_id"])
    known = rows.get("error")
    known = np.full(n, None, dtype=object) if known is None else np.asarray(known, dtype=object)
    bad = np.array([bool(e) for e in known], dtype=bool)
    own = ("path", "object_size", "object_mtime_ns")
    parts: dict[str, list] = {k: [] for k in (*own, "offset", "size", "header_crc", "error")}
    if images:
        for k in parts:
            if k in rows:
                parts[k].append(np.asarray(rows[k]))
            elif k == "header_crc":
                parts[k].append(np.full(n, -1, np.int64))
            elif k == "error":
                parts[k].append(known)
    for name in names:
        offset, size, crc = (np.asarray(rows[c]) for c in member_columns(name))
        errors = known.copy()
        errors[(offset < 0) & ~bad] = f"{MISSING_FIELD}: no {name!r} member"
        for k in own:
            if k in rows:
                parts[k].append(np.asarray(rows[k]))
        parts["offset"].append(offset)
        parts["size"].append(size)
        parts["header_crc"].append(crc)
        parts["error"].append(errors)
    out = {k: np.concatenate(v) for k, v in parts.items() if v}
    if images and "member" in rows:  # the images' names for the read's header check; fields' by digest
        out["member"] = np.concatenate(
            [np.asarray(rows["member"], dtype=object), np.full(n * len(names), None, object)]
        )
    return out


def with_value_columns(table, values: Mapping[str, list], where: str):
    """``table`` (a ``pyarrow.Table``) with each field's values (pieces: arrays, chunked arrays or lists
    of Python values, in row order) as its column ``field:NAME``.

    Raises:
        ValueError: a field whose pieces are not of one type (named, with ``where``).
    """
    import pyarrow as pa

    for name, pieces in values.items():
        try:
            arrays = [p if isinstance(p, pa.Array | pa.ChunkedArray) else pa.array(p) for p in pieces]
            column = pa.chunked_array(
                [c for a in arrays for c in (a.chunks if isinstance(a, pa.ChunkedArray) else [a])]
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise ValueError(f"{where}: field {name!r} holds values of different types ({e})") from None
        table = table.append_column(value_column(name), column)
    return table
