"""Parquet datasets: an image-bytes column and a label column.

Only labels and row counts are read when listing (columnar reads: cheap). Image bytes stay in
the files and are read by the workers, one row group at a time, so a dataset larger than any
machine's memory works. ``sample_id`` is the row's index across the files in sorted order.
The image column may hold raw bytes or Hugging Face's ``{bytes, path}`` image struct.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raypipe.kernels.errors import BAD_LABEL
from raypipe.sources.paths import DatasetRoot, open_root
from raypipe.sources.table import SourceRows, make_rows

__all__ = ["list_parquet", "parquet_files"]


def parquet_files(root: DatasetRoot, single_file: bool) -> list[str]:
    """Relative paths of the Parquet files of a dataset, sorted."""
    if single_file:
        return [""]
    if root.is_local:
        found = []
        for dirpath, dirnames, filenames in os.walk(root.root):
            dirnames.sort()
            found += [os.path.relpath(os.path.join(dirpath, f), root.root) for f in filenames if f.endswith(".parquet")]
        return sorted(found)
    infos = root.filesystem.get_file_info(pafs.FileSelector(root.root, recursive=True))
    return sorted(root.relative(i.path) for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet"))


def _open(root: DatasetRoot, rel: str) -> pq.ParquetFile:
    path = root.root if rel == "" else root.resolve(rel)
    if root.is_local:
        return pq.ParquetFile(path)
    return pq.ParquetFile(root.filesystem.open_input_file(path))


def list_parquet(
    uri: str, *, image_column: str = "image", label_column: str = "label", filesystem: pafs.FileSystem | None = None
) -> SourceRows:
    """List Parquet file(s) at ``uri`` (a file or a folder of ``*.parquet``) into SourceRows."""
    probe = open_root(uri, filesystem=filesystem)
    if probe.is_local:
        single = os.path.isfile(probe.root)
    else:
        single = probe.filesystem.get_file_info(probe.root).type == pafs.FileType.File
    root = probe
    files = parquet_files(root, single)
    if not files:
        raise ValueError(f"no .parquet files under {uri!r}")
    paths: list[str] = []
    rows: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    errors: list[str | None] = []
    for rel in files:
        pf = _open(root, rel)
        names = pf.schema_arrow.names
        for col in (image_column, label_column):
            if col not in names:
                raise ValueError(f"{root.display(rel) if rel else uri}: no column {col!r} (columns: {names})")
        lab = pf.read(columns=[label_column]).column(label_column)
        if not pa.types.is_integer(lab.type):
            raise ValueError(f"{uri}: label column {label_column!r} has type {lab.type}, expected integers")
        if pa.types.is_unsigned_integer(lab.type):  # uint8 and friends: no room for the -1 of a bad row
            lab = pc.cast(lab, pa.int64(), safe=False)  # a uint64 past int64's range turns negative: bad
        bad = pc.or_(pc.is_null(lab), pc.less(pc.fill_null(lab, 0), 0)).to_numpy(zero_copy_only=False)
        n = len(lab)
        paths += [rel] * n
        rows.append(np.arange(n, dtype=np.int64))
        labels.append(np.where(bad, -1, pc.fill_null(lab, -1).to_numpy()).astype(np.int64))
        errors += [f"{BAD_LABEL}: null or negative label" if b else None for b in bad]
    table = make_rows(paths, np.concatenate(labels), rows=np.concatenate(rows), errors=errors)
    return SourceRows(kind="parquet", root=root, table=table, image_column=image_column,
                      extra={"single_file": single})
