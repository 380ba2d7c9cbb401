"""Class names -> label indices: timm's natural order by default, torchvision's plain sort, or a class map.

- ``"natural"`` (default): timm's order (``timm.utils.misc.natural_key``, used by its folder and tar
  readers): case-insensitive, runs of digits compared as numbers, so ``c1, c2, c10``. Names that tie
  under that key (``A``/``a``, ``c1``/``c01``) are ordered by their plain text, so the order never
  depends on a set's iteration order (timm's does, for such names).
- ``"sorted"``: torchvision's ``ImageFolder`` order, plain string sort: ``c1, c10, c2``.
- a class map (timm's ``--class-map``): a dict ``{name: index}`` or a file: ``.txt`` one class name per
  line (index = line number, as timm's ``load_class_map``), ``.json`` (an object ``{name: index}`` or a
  list of names), ``.csv`` (rows ``name,index``, or one column of names; a first row whose index is
  not an integer is a header). Pickle files are refused: unpickling a user's file can run code.
"""

from __future__ import annotations

import csv
import io
import json
import os
import posixpath
import re
from collections.abc import Iterable, Mapping

__all__ = ["CLASS_ORDERS", "natural_key", "order_classes", "load_class_map", "classes_by_index"]

CLASS_ORDERS = ("natural", "sorted")
_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> list:
    """timm's ``natural_key``: lower-cased, digit runs as ints (``"C10b"`` -> ``["c", 10, "b"]``)."""
    return [int(part) if i % 2 else part for i, part in enumerate(_DIGITS.split(name.lower()))]


def order_classes(names: Iterable[str], class_order: str = "natural") -> list[str]:
    """``names`` (distinct) in ``class_order``; the index of a name is its position."""
    if class_order == "natural":
        return sorted(names, key=lambda n: (natural_key(n), n))
    if class_order == "sorted":
        return sorted(names)
    raise ValueError(f"class_order={class_order!r}: expected one of {CLASS_ORDERS}")


def load_class_map(class_map: Mapping | str | os.PathLike, root: str | None = None) -> dict[str, int]:
    """A validated ``{name: index}`` from a dict or a .txt/.json/.csv file (see the module doc).

    A relative path that does not exist is looked up under ``root`` (a local folder), as timm does.
    """
    if isinstance(class_map, Mapping):
        return _validated(dict(class_map), "class_map")
    path = os.fspath(class_map)
    if not os.path.exists(path) and root is not None and not os.path.isabs(path):
        joined = os.path.join(root, path)
        path = joined if os.path.exists(joined) else path
    ext = posixpath.splitext(path.lower())[1]
    if ext in (".pkl", ".pickle"):
        why = "pickle files are not read (unpickling can run code); use .txt, .json or .csv"
        raise ValueError(f"class_map={path!r}: {why}")
    if ext not in (".txt", ".json", ".csv"):
        raise ValueError(f"class_map={path!r}: expected a .txt, .json or .csv file, or a dict")
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"class_map={path!r}: cannot read it ({exc.strerror or exc})") from None
    if ext == ".txt":
        # timm: index = line number (blank lines count but name no class)
        mapping = _pairs(((line.strip(), i) for i, line in enumerate(text.splitlines()) if line.strip()), path)
    elif ext == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"class_map={path!r}: not valid JSON ({exc.msg})") from None
        if isinstance(data, list):
            data = _pairs(((name, i) for i, name in enumerate(data)), path)
        if not isinstance(data, dict):
            raise ValueError(f"class_map={path!r}: expected a JSON object {{name: index}} or a list of names")
        mapping = data
    else:
        mapping = _pairs(_csv_pairs(text, path), path)
    return _validated(mapping, f"class_map={path!r}")


def _csv_pairs(text: str, path: str):
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r)]
    if rows and len(rows[0]) >= 2 and not rows[0][1].strip().lstrip("-").isdigit():
        rows = rows[1:]  # header
    for i, row in enumerate(rows):
        if len(row) == 1:
            yield row[0].strip(), i
        elif len(row) == 2 and row[1].strip().lstrip("-").isdigit():
            yield row[0].strip(), int(row[1])
        else:
            raise ValueError(f"class_map={path!r}: row {row!r}: expected name,index or a name")


def _pairs(pairs: Iterable[tuple[str, int]], path: str) -> dict:
    out: dict = {}
    for name, index in pairs:
        if name in out:
            raise ValueError(f"class_map={path!r}: class {name!r} is listed twice")
        out[name] = index
    return out


def _validated(mapping: dict, where: str) -> dict[str, int]:
    if not mapping:
        raise ValueError(f"{where}: the class map is empty")
    seen: dict[int, str] = {}
    for name, index in mapping.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: class names must be non-empty strings, got {name!r}")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"{where}: class {name!r} has index {index!r}, expected an int >= 0")
        if index in seen:
            raise ValueError(f"{where}: classes {seen[index]!r} and {name!r} share index {index}")
        seen[index] = name
    return dict(mapping)


def classes_by_index(mapping: Mapping[str, int]) -> tuple[str, ...]:
    """The class names by index (``""`` for an index the map does not use)."""
    names = [""] * (max(mapping.values()) + 1)
    for name, index in mapping.items():
        names[index] = name
    return tuple(names)
