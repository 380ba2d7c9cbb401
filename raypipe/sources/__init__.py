"""Sources: turn a dataset description into rows ``(sample_id, label, path, …)``, nothing decoded, and
read the bytes of blocks of those rows (``BlockReader``)."""

from __future__ import annotations

import os

import pyarrow.fs as pafs

from raypipe.sources.cache import CacheConfig
from raypipe.sources.folder import IMG_EXTENSIONS, list_image_folder
from raypipe.sources.manifest import list_manifest
from raypipe.sources.parquet import list_parquet
from raypipe.sources.paths import DatasetRoot, open_root
from raypipe.sources.reader import BlockReader
from raypipe.sources.remote import ReadOptions
from raypipe.sources.table import ROW_SCHEMA, SourceRows
from raypipe.sources.webdataset import has_braces, list_webdataset

__all__ = [
    "IMG_EXTENSIONS",
    "KINDS",
    "ROW_SCHEMA",
    "BlockReader",
    "CacheConfig",
    "DatasetRoot",
    "ReadOptions",
    "SourceRows",
    "detect_kind",
    "list_image_folder",
    "list_manifest",
    "list_parquet",
    "list_webdataset",
    "open_root",
    "open_source",
]

KINDS = ("folder", "parquet", "manifest", "webdataset")


def _by_files(names: list[str]) -> str | None:
    """The kind a folder's files say: Parquet files, or tar shards."""
    if any(n.endswith(".parquet") for n in names):
        return "parquet"
    if any(n.endswith(".tar") for n in names):
        return "webdataset"
    return None


def detect_kind(data: str, *, filesystem: pafs.FileSystem | None = None) -> str:
    """'manifest' for .csv/.jsonl, 'parquet' for a .parquet file or a folder holding them, 'webdataset'
    for a .tar file, a brace pattern, a folder holding .tar files or a prefix of some, else 'folder'."""
    lower = data.lower().rstrip("/")
    if lower.endswith((".csv", ".jsonl", ".ndjson")):
        return "manifest"
    if lower.endswith(".parquet"):
        return "parquet"
    if lower.endswith(".tar") or has_braces(data):
        return "webdataset"
    root = open_root(data, filesystem=filesystem)
    if root.is_local:
        if not os.path.exists(root.root):
            parent, stem = os.path.split(root.root)
            if os.path.isdir(parent) and any(n.startswith(stem) and n.endswith(".tar") for n in os.listdir(parent)):
                return "webdataset"  # a prefix of shards
            raise ValueError(f"dataset {data!r} does not exist")
        if os.path.isdir(root.root):
            with os.scandir(root.root) as it:
                return _by_files([e.name for e in it if e.is_file()]) or "folder"
        return "folder"
    info = root.filesystem.get_file_info(pafs.FileSelector(root.root, recursive=False, allow_not_found=True))
    if not info:  # nothing under it: maybe a prefix of shards
        parent, _, stem = root.root.rpartition("/")
        siblings = root.filesystem.get_file_info(pafs.FileSelector(parent, recursive=False, allow_not_found=True))
        if any(i.base_name.startswith(stem) and i.base_name.endswith(".tar") for i in siblings):
            return "webdataset"
    return _by_files([i.path for i in info if i.type == pafs.FileType.File]) or "folder"


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
    if kind == "webdataset":
        return list_webdataset(data, filesystem=filesystem)
    raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
