"""Parquet datasets: an image-bytes column and a label column.

Only labels and row counts are read when listing (columnar reads: cheap). Image bytes stay in
the files and are read by the workers, one row group at a time, so a dataset larger than any
machine's memory works. ``sample_id`` is the row's index across the files in sorted order; ``shard``
is the row group's index across the files in the same order (a row group is the smallest unit a
Parquet reader can read, so it is the unit to read once per epoch). The image column may hold raw
bytes or Hugging Face's ``{bytes, path}`` image struct.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raypipe.kernels.errors import BAD_LABEL, NULL_IMAGE, SkipImage
from raypipe.sources.fields import with_value_columns
from raypipe.sources.label_sets import LABELS, is_label_sets, label_sets
from raypipe.sources.table import SourceRows, listed_stamp, make_rows
from raypipe.sources.transport.paths import DatasetRoot, open_root

__all__ = ["ParquetGroups", "list_parquet", "parquet_files"]


def parquet_files(root: DatasetRoot, single_file: bool) -> list[str]:
    """Relative paths of the Parquet files of a dataset, sorted."""
    return [""] if single_file else list(_listed_files(root))


def _listed_files(root: DatasetRoot) -> dict[str, tuple[int, int]]:
    """The Parquet files under a dataset's root folder, sorted, each with its (size, mtime_ns) as a remote
    listing gave them (-1 for local files)."""
    unknown = (-1, -1)
    if root.is_local:
        found = []
        for dirpath, dirnames, filenames in os.walk(root.root):
            dirnames.sort()
            found += [os.path.relpath(os.path.join(dirpath, f), root.root) for f in filenames if f.endswith(".parquet")]
        return dict.fromkeys(sorted(found), unknown)
    infos = root.filesystem.get_file_info(pafs.FileSelector(root.root, recursive=True))
    stamps = {
        root.relative(i.path): listed_stamp(i)
        for i in infos
        if i.type == pafs.FileType.File and i.path.endswith(".parquet")
    }
    return {rel: stamps[rel] for rel in sorted(stamps)}


def _open(root: DatasetRoot, rel: str) -> pq.ParquetFile:
    path = root.root if rel == "" else root.resolve(rel)
    if root.is_local:
        return pq.ParquetFile(path)
    return pq.ParquetFile(root.filesystem.open_input_file(path))


def list_parquet(
    uri: str,
    *,
    image_column: str = "image",
    label_column: str = "label",
    filesystem: pafs.FileSystem | None = None,
    fields: tuple[str, ...] = (),
) -> SourceRows:
    """List Parquet file(s) at ``uri`` (a file or a folder of ``*.parquet``) into SourceRows; ``fields``:
    columns whose values the rows carry (``raypipe.sources.fields``), read here as the labels are."""
    probe = open_root(uri, filesystem=filesystem)
    if probe.is_local:
        single = os.path.isfile(probe.root)
        files = {"": (-1, -1)} if single else _listed_files(probe)
    else:
        info = probe.filesystem.get_file_info(probe.root)
        single = info.type == pafs.FileType.File
        files = {"": listed_stamp(info)} if single else _listed_files(probe)
    root = probe
    if not files:
        raise ValueError(f"no .parquet files under {uri!r}")
    paths: list[str] = []
    rows: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    shards: list[np.ndarray] = []
    errors: list[str | None] = []
    object_sizes: list[np.ndarray] = []
    object_mtimes: list[np.ndarray] = []
    field_values: dict[str, list] = {name: [] for name in fields}
    label_set_pieces: list[pa.Array] = []
    groups_before = 0
    for rel, stamp in files.items():
        pf = _open(root, rel)
        names = pf.schema_arrow.names
        for col in (image_column, label_column, *fields):
            if col not in names:
                raise ValueError(f"{root.display(rel) if rel else uri}: no column {col!r} (columns: {names})")
        read = pf.read(columns=list(dict.fromkeys((label_column, *fields))))
        for name in fields:
            field_values[name].append(read.column(name))
        lab = read.column(label_column)
        if is_label_sets(lab.type):  # several labels per image: kept as their sets, ``label`` 0 or bad
            lab, sets = label_sets(lab)
            label_set_pieces.append(sets)
        elif label_set_pieces:
            where = root.display(rel) if rel else uri
            raise ValueError(f"{where}: label column {label_column!r} holds {lab.type}, other files hold lists")
        if not pa.types.is_integer(lab.type):
            raise ValueError(f"{uri}: label column {label_column!r} has type {lab.type}, expected integers")
        if pa.types.is_unsigned_integer(lab.type):  # uint8 and friends: no room for the -1 of a bad row
            lab = pc.cast(lab, pa.int64(), safe=False)  # a uint64 past int64's range turns negative: bad
        bad = pc.or_(pc.is_null(lab), pc.less(pc.fill_null(lab, 0), 0)).to_numpy(zero_copy_only=False)
        n = len(lab)
        paths += [rel] * n
        object_sizes.append(np.full(n, stamp[0], np.int64))
        object_mtimes.append(np.full(n, stamp[1], np.int64))
        rows.append(np.arange(n, dtype=np.int64))
        sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
        shards.append(np.repeat(np.arange(len(sizes), dtype=np.int64) + groups_before, sizes))
        groups_before += len(sizes)
        labels.append(np.where(bad, -1, pc.fill_null(lab, -1).to_numpy()).astype(np.int64))
        errors += [f"{BAD_LABEL}: null or negative label" if b else None for b in bad]
    table = make_rows(
        paths,
        np.concatenate(labels),
        rows=np.concatenate(rows),
        errors=errors,
        shards=np.concatenate(shards),
        object_sizes=np.concatenate(object_sizes),
        object_mtimes=np.concatenate(object_mtimes),
    )
    table = with_value_columns(table, field_values, uri)
    if label_set_pieces:
        if len(label_set_pieces) != len(files):
            raise ValueError(f"{uri}: label column {label_column!r} holds lists in some files only")
        table = table.append_column(LABELS, pa.chunked_array(label_set_pieces, pa.list_(pa.int64())))
    extra = {"single_file": single, "fields": tuple(fields)}
    return SourceRows(kind="parquet", root=root, table=table, image_column=image_column, extra=extra)


class ParquetGroups:
    """Reads the image cells of a Parquet dataset, one whole row group per call.

    File footers are read once per process (``metadata``); each thread opens its own ``ParquetFile``
    over them, as a ``ParquetFile`` must not be read from two threads at once while remote row groups
    are fetched concurrently. ``opener`` (given a remote file's full path and its ``listed`` (size,
    mtime_ns) as the caller's rows carry them, returns what ``pq.ParquetFile`` reads) replaces the
    filesystem's ``open_input_file``: the reader's cache.
    """

    def __init__(self, root: DatasetRoot, column: str, *, opener=None):
        self.root, self.column, self._opener = root, column, opener
        self._meta: dict[str, tuple[pq.FileMetaData, np.ndarray]] = {}
        self._local = threading.local()
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"root": self.root, "column": self.column}

    def __setstate__(self, state):
        self.__init__(state["root"], state["column"])

    def path(self, rel: str) -> str:
        """The full path of file ``rel`` (inside the root), as ``opener`` is given it."""
        return self.root.root if rel == "" else self.root.resolve(rel)

    def _source(self, rel: str, listed: tuple[int, int]):
        path = self.path(rel)
        if self.root.is_local:
            return path
        return self._opener(path, listed) if self._opener is not None else self.root.filesystem.open_input_file(path)

    def group_starts(self, rel: str, listed: tuple[int, int] = (-1, -1)) -> np.ndarray:
        """First row of each row group of file ``rel``, plus its row count at the end (footer read once);
        ``listed``: the file's (size, mtime_ns) as listed, for the opener (-1s: not known)."""
        with self._lock:
            found = self._meta.get(rel)
        if found is None:
            meta = pq.ParquetFile(self._source(rel, listed)).metadata
            sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            found = (meta, np.cumsum([0] + sizes))
            with self._lock:
                self._meta[rel] = found
        return found[1]

    def read_group(
        self, rel: str, group: int, offsets: list[int], listed: tuple[int, int] = (-1, -1)
    ) -> list[bytes | SkipImage]:
        """The cells at ``offsets`` (rows counted from the group's first) of row group ``group``."""
        files = getattr(self._local, "files", None)
        if files is None or len(files) > 64:
            files = self._local.files = {}
        pf = files.get(rel)
        if pf is None:
            self.group_starts(rel, listed)
            pf = files[rel] = pq.ParquetFile(self._source(rel, listed), metadata=self._meta[rel][0])
        col = pf.read_row_group(group, columns=[self.column]).column(self.column)
        out: list[bytes | SkipImage] = []
        for offset, cell in zip(offsets, col.take(pa.array(offsets, type=pa.int64())).to_pylist(), strict=True):
            if isinstance(cell, dict):  # Hugging Face image struct {bytes, path}
                cell = cell.get("bytes")
            if cell is None:
                row = int(self._meta[rel][1][group]) + offset
                out.append(SkipImage(NULL_IMAGE, f"row {row} has a null {self.column!r} cell"))
            else:
                out.append(bytes(cell))
        return out
