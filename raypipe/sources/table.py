"""The row table every source produces: one row per sample, nothing decoded yet.

Columns: ``sample_id`` int64 (stable for a dataset: its index in a deterministic listing order),
``label`` int64, ``path`` (relative to the root: the image file, the Parquet file or the tar shard),
``row`` int64 (row inside that Parquet file, -1 otherwise), ``error`` (a skip reason already known
when listing, e.g. a manifest line with no integer label; null for good rows), and where the bytes lie:

- ``shard`` int64: the unit that is read as a whole. Rows with the same ``shard`` are cheapest read
  together, in one block: a tar shard (its index among the sorted shards), a Parquet row group (its
  index across all row groups of all files, in file order), and for an image folder or a manifest each
  file on its own (``shard == sample_id``). Shard numbers are dense from 0 and ascend with
  ``sample_id``, so a shard is a contiguous run of ids. An execution layer that shuffles shards, then
  rows inside a window of shards, reads each shard once per epoch; for folders and manifests the same
  algorithm is a plain shuffle of rows.
- ``offset``, ``size`` int64: the byte range of a tar member's data inside its shard (-1 otherwise);
- ``member`` string: a tar member's name, for reports (null otherwise).

Rows that are known bad stay in the table so the epoch's accounting still sees every source row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
from pyarrow.compute import max as pc_max

from raypipe.sources.paths import DatasetRoot

__all__ = ["ROW_SCHEMA", "SourceRows", "make_rows"]

ROW_SCHEMA = pa.schema(
    [
        ("sample_id", pa.int64()),
        ("label", pa.int64()),
        ("path", pa.string()),
        ("row", pa.int64()),
        ("error", pa.string()),
        ("shard", pa.int64()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
        ("member", pa.string()),
    ]
)


@dataclass(frozen=True)
class SourceRows:
    """A listed dataset: the rows plus what a worker needs to read them."""

    kind: str  # "folder" | "parquet" | "manifest" | "webdataset"
    root: DatasetRoot
    table: pa.Table
    classes: tuple[str, ...] = ()
    image_column: str = ""  # Parquet only
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.table.num_rows

    def numbered_like(self, classes: tuple[str, ...]) -> SourceRows:
        """These rows with their labels renumbered to ``classes`` (another split's class names), so the
        same name has the same label in both; a name ``classes`` lacks is a ``ValueError``. Rows
        without class names, or with the same ones, are returned as they are."""
        if not self.classes or not classes or tuple(self.classes) == tuple(classes):
            return self
        index = {name: i for i, name in enumerate(classes)}
        unknown = [name for name in self.classes if name not in index]
        if unknown:
            raise ValueError(
                f"{len(unknown)} class(es) are not among the {len(classes)} given, e.g. {unknown[:5]}: "
                "their labels would mean nothing to a model trained on those"
            )
        remap = np.array([index[name] for name in self.classes], dtype=np.int64)
        labels = self.table.column("label").to_numpy()
        renumbered = np.where(labels >= 0, remap[np.clip(labels, 0, None)], labels)
        table = self.table.set_column(
            self.table.schema.get_field_index("label"), "label", pa.array(renumbered, type=pa.int64())
        )
        return replace(self, table=table, classes=tuple(classes))

    @property
    def num_shards(self) -> int:
        """Shards (units read as a whole, see the module docstring) in the listing."""
        shards = self.table.column("shard")
        return int(pc_max(shards).as_py()) + 1 if len(shards) else 0

    @property
    def num_classes(self) -> int:
        if self.classes:
            return len(self.classes)
        labels = self.table.column("label").to_numpy()
        return int(labels.max()) + 1 if len(labels) else 0


def make_rows(paths: list[str], labels, rows=None, errors=None, *, shards=None, offsets=None, sizes=None,
              members=None) -> pa.Table:
    """The row table of a listing; ``shards`` defaults to one shard per row (files read one by one)."""
    n = len(paths)

    def ints(values, default):
        return pa.array(default if values is None else np.asarray(values, np.int64), type=pa.int64())

    return pa.table(
        {
            "sample_id": pa.array(np.arange(n, dtype=np.int64)),
            "label": pa.array(np.asarray(labels, dtype=np.int64)),
            "path": pa.array(paths, type=pa.string()),
            "row": pa.array(np.full(n, -1, np.int64) if rows is None else np.asarray(rows, np.int64)),
            "error": pa.array([None] * n if errors is None else errors, type=pa.string()),
            "shard": ints(shards, np.arange(n, dtype=np.int64)),
            "offset": ints(offsets, np.full(n, -1, np.int64)),
            "size": ints(sizes, np.full(n, -1, np.int64)),
            "member": pa.array([None] * n if members is None else members, type=pa.string()),
        },
        schema=ROW_SCHEMA,
    )
