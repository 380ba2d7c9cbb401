"""Sources: turn a dataset description into rows ``(sample_id, label, path)``, nothing decoded."""

from __future__ import annotations

import os

import pyarrow.fs as pafs

from raypipe.sources.folder import IMG_EXTENSIONS, list_image_folder
from raypipe.sources.manifest import list_manifest
from raypipe.sources.parquet import list_parquet
from raypipe.sources.paths import DatasetRoot, open_root
from raypipe.sources.table import ROW_SCHEMA, SourceRows

__all__ = [
    "IMG_EXTENSIONS",
    "ROW_SCHEMA",
    "DatasetRoot",
    "SourceRows",
    "detect_kind",
    "list_image_folder",
    "list_manifest",
    "list_parquet",
    "open_root",
    "open_source",
]

KINDS = ("folder", "parquet", "manifest")


def detect_kind(data: str, *, filesystem: pafs.FileSystem | None = None) -> str:
    """'manifest' for .csv/.jsonl, 'parquet' for a .parquet file or a folder holding them, else 'folder'."""
    lower = data.lower().rstrip("/")
    if lower.endswith((".csv", ".jsonl", ".ndjson")):
        return "manifest"
    if lower.endswith(".parquet"):
        return "parquet"
    root = open_root(data, filesystem=filesystem)
    if root.is_local:
        if not os.path.exists(root.root):
            raise ValueError(f"dataset {data!r} does not exist")
        if os.path.isdir(root.root):
            with os.scandir(root.root) as it:
                if any(e.is_file() and e.name.endswith(".parquet") for e in it):
                    return "parquet"
        return "folder"
    info = root.filesystem.get_file_info(pafs.FileSelector(root.root, recursive=False))
    if any(i.type == pafs.FileType.File and i.path.endswith(".parquet") for i in info):
        return "parquet"
    return "folder"


def open_source(
    data: str,
    *,
    kind: str | None = None,
    image_column: str = "image",
    label_column: str = "label",
    path_column: str = "path",
    root: str | None = None,
    filesystem: pafs.FileSystem | None = None,
    class_order: str = "natural",
    class_map=None,
) -> SourceRows:
    """List any supported dataset (local path or pyarrow filesystem URI) into SourceRows.

    ``filesystem`` (e.g. ``pyarrow.fs.S3FileSystem(endpoint_override=…)``) is used instead of the one
    the URI implies; it travels to the Ray workers with the rows, so its options must be picklable.
    ``class_order`` ("natural", timm's, or "sorted", torchvision's) and ``class_map`` (a dict or a
    .txt/.json/.csv file) number class folders and class-name labels (``sources.classes``).
    """
    if isinstance(data, SourceRows):
        return data
    kind = kind or detect_kind(data, filesystem=filesystem)
    if kind == "folder":
        root_ = open_root(data, filesystem=filesystem)
        return list_image_folder(root_, class_order=class_order, class_map=class_map)
    if kind == "parquet":
        return list_parquet(data, image_column=image_column, label_column=label_column, filesystem=filesystem)
    if kind == "manifest":
        return list_manifest(
            data, root=root, path_column=path_column, label_column=label_column, filesystem=filesystem,
            class_order=class_order, class_map=class_map,
        )  # fmt: skip
    raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
