"""How a dataset is listed: the options ``open_source`` takes, as one frozen value.

``ListingOptions`` is checked on construction (``ValueError`` naming the field) and travels whole from
the entry points (``open_source``, ``Pipeline(source, listing=…)``, ``convert``, the command line) to
the reader of the dataset's kind, which takes the fields it uses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from raypipe._values import fail, one_value
from raypipe.sources.classes import CLASS_ORDERS
from raypipe.sources.fields import check_fields

__all__ = ["KINDS", "ListingOptions"]

KINDS = ("folder", "parquet", "manifest", "webdataset")


def _path_like(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike)) and bool(os.fspath(value))


@dataclass(frozen=True, kw_only=True)
class ListingOptions:
    """The options a dataset is listed with; each default is what ``open_source`` does without it.

    Args:
        kind: one of ``KINDS`` (None: detected from the data).
        image_column, label_column, path_column: the columns of a Parquet file, a manifest or a Ray
            Dataset.
        root: the folder or URI a manifest's (or a Ray Dataset's) paths lie under.
        filesystem: a ``pyarrow.fs.FileSystem`` used instead of the one the URI implies.
        class_order, class_map: "natural" or "sorted", and a ``{name: index}`` mapping or a
            .txt/.json/.csv file: how the classes are numbered.
        index, by_shard: a WebDataset's shard index (a path, a list of DALI .idx paths, or "dali") and
            whether it is listed by shard (None: by its size).
        block_rows, max_bytes: a Ray Dataset's listing pass (rows per block put in the object store;
            the most image bytes put, None: half this node's store).
        fields: per-sample data to carry beside the image into every batch, under its own name: a
            WebDataset's members by extension (``"txt"``, ``"json"``), other kinds' columns by name
            (``raypipe.sources.fields``).

    Raises:
        ValueError: an invalid field, named.
    """

    kind: str | None = None
    image_column: str = "image"
    label_column: str = "label"
    path_column: str = "path"
    root: str | None = None
    filesystem: Any = None
    class_order: str = "natural"
    class_map: Any = None
    index: str | tuple[str, ...] | None = None
    by_shard: bool | None = None
    block_rows: int = 256
    max_bytes: int | None = None
    fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", check_fields(self.fields))
        if self.kind is not None and self.kind not in KINDS:
            fail("kind", self.kind, f"expected one of {KINDS} or None (detected)")
        for name in ("image_column", "label_column", "path_column"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                fail(name, getattr(self, name), "expected a column name")
        if self.root is not None:
            if not _path_like(self.root):
                fail("root", self.root, "expected a folder or URI, or None")
            object.__setattr__(self, "root", os.fspath(self.root))
        if self.filesystem is not None:
            import pyarrow.fs as pafs

            if not isinstance(self.filesystem, pafs.FileSystem):
                fail("filesystem", self.filesystem, "expected a pyarrow.fs.FileSystem or None")
        if self.class_order not in CLASS_ORDERS:
            fail("class_order", self.class_order, f"expected one of {CLASS_ORDERS}")
        if self.class_map is not None and not (isinstance(self.class_map, Mapping) or _path_like(self.class_map)):
            fail("class_map", self.class_map, "expected a {name: index} mapping, a .txt/.json/.csv file, or None")
        if isinstance(self.index, (list, tuple)):
            if not self.index or not all(isinstance(p, str) and p for p in self.index):
                fail("index", self.index, "expected a non-empty list of .idx paths")
            object.__setattr__(self, "index", tuple(self.index))
        elif self.index is not None and not (isinstance(self.index, str) and self.index):
            fail("index", self.index, "expected a .parquet path, 'dali', .idx paths, or None")
        if self.by_shard is not None and not isinstance(self.by_shard, bool):
            fail("by_shard", self.by_shard, "expected true, false or None (by size)")
        if isinstance(self.block_rows, bool) or not isinstance(self.block_rows, int) or self.block_rows < 1:
            fail("block_rows", self.block_rows, "expected an int >= 1")
        if self.max_bytes is not None and (
            isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 1
        ):
            fail("max_bytes", self.max_bytes, "expected an int >= 1, or None (half this node's object store)")

    @classmethod
    def of(cls, options: ListingOptions | None = None, **keywords: Any) -> ListingOptions:
        """``options``, or the same fields given as keywords (``open_source(data, kind=…)``) made into one;
        both at once is refused."""
        return one_value(cls, options, keywords, name="options", what="listing keywords")

    def changed(self, *names: str) -> list[str]:
        """Those of ``names`` whose value is not the default."""
        defaults = {f.name: f.default for f in fields(self)}
        return [name for name in names if getattr(self, name) != defaults[name]]
