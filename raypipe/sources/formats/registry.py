"""The table of formats a dataset named by a path can be: each kind, the endings of a path (or of the files
in a folder) that say it, and how it is listed. ``detect_kind`` and ``open_source`` read it; a new format
is a module beside the others and a row here.

A Ray Dataset is not named by a path, so it has no row: ``open_source`` lists it by its type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from raypipe.sources.formats.folder import list_image_folder
from raypipe.sources.formats.manifest import list_manifest
from raypipe.sources.formats.parquet import list_parquet
from raypipe.sources.formats.shard_listing import ShardListing
from raypipe.sources.formats.shard_paths import has_braces
from raypipe.sources.formats.webdataset import list_webdataset
from raypipe.sources.indexes.shard_index import INDEX_NAME
from raypipe.sources.options import ListingOptions
from raypipe.sources.table import SourceRows
from raypipe.sources.transport.paths import open_root

__all__ = ["FORMATS", "Format", "kind_by_files", "kind_by_name"]


@dataclass(frozen=True)
class Format:
    """One kind of dataset. ``names``: path endings (lower case) that say it; ``files``: endings of the
    files of a folder that say it (a folder of Parquet files, of tar shards); ``list``: its listing, from
    the path and the ``ListingOptions``."""

    kind: str
    names: tuple[str, ...]
    files: tuple[str, ...]
    list: Callable[[str, ListingOptions], SourceRows | ShardListing]


def _folder(data: str, o: ListingOptions) -> SourceRows:
    if o.fields:
        raise ValueError(
            f"fields={list(o.fields)}: {data!r} is a folder of image files, which has no fields "
            "(they are a WebDataset's members, or a Parquet file's, a manifest's or a Ray Dataset's columns)"
        )
    return list_image_folder(open_root(data, filesystem=o.filesystem), class_order=o.class_order, class_map=o.class_map)


def _parquet(data: str, o: ListingOptions) -> SourceRows:
    return list_parquet(
        data, image_column=o.image_column, label_column=o.label_column, filesystem=o.filesystem, fields=o.fields
    )


def _manifest(data: str, o: ListingOptions) -> SourceRows:
    return list_manifest(
        data,
        root=o.root,
        path_column=o.path_column,
        label_column=o.label_column,
        filesystem=o.filesystem,
        class_order=o.class_order,
        class_map=o.class_map,
        fields=o.fields,
    )


def _webdataset(data: str, o: ListingOptions) -> SourceRows | ShardListing:
    return list_webdataset(data, filesystem=o.filesystem, index=o.index, by_shard=o.by_shard, fields=o.fields)


# In the order detection asks: a path's ending first; a folder by its files, Parquet before tar shards.
FORMATS: dict[str, Format] = {
    f.kind: f
    for f in (
        Format("manifest", names=(".csv", ".jsonl", ".ndjson"), files=(), list=_manifest),
        Format("parquet", names=(".parquet",), files=(".parquet",), list=_parquet),
        Format("webdataset", names=(".tar", ".json"), files=(".tar",), list=_webdataset),  # .json: wids
        Format("folder", names=(), files=(), list=_folder),
    )
}


def kind_by_name(data: str) -> str | None:
    """The kind ``data``'s own name says (its ending; a brace pattern is WebDataset shards), or None."""
    lower = data.lower().rstrip("/")
    for f in FORMATS.values():
        if f.names and lower.endswith(f.names):
            return f.kind
    return "webdataset" if has_braces(data) else None


def kind_by_files(names: list[str]) -> str | None:
    """The kind a folder's files say (raypipe's shard index is no Parquet dataset), or None."""
    names = [n for n in names if n.rpartition("/")[2] != INDEX_NAME]
    for f in FORMATS.values():
        if f.files and any(n.endswith(f.files) for n in names):
            return f.kind
    return None
