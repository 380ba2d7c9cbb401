"""Sources: turn a dataset description (a path or URI, or a Ray Dataset) into rows ``(sample_id, label,
path, …)``, nothing decoded, and read the bytes of blocks of those rows (``BlockReader``)."""

from __future__ import annotations

import os

import pyarrow.fs as pafs

from raypipe import settings, timeouts
from raypipe.sources.formats.folder import IMG_EXTENSIONS, list_image_folder
from raypipe.sources.formats.manifest import list_manifest
from raypipe.sources.formats.parquet import list_parquet
from raypipe.sources.formats.raydata import is_ray_dataset, list_ray_dataset
from raypipe.sources.formats.registry import FORMATS, kind_by_files, kind_by_name
from raypipe.sources.formats.shard_listing import ShardListing
from raypipe.sources.formats.tar_members import ShardChangedError
from raypipe.sources.formats.webdataset import list_webdataset
from raypipe.sources.options import KINDS, ListingOptions
from raypipe.sources.reader import BlockReader
from raypipe.sources.table import ROW_SCHEMA, SourceRows
from raypipe.sources.transport.cache_config import CacheConfig
from raypipe.sources.transport.paths import DatasetRoot, is_uri, open_root
from raypipe.sources.transport.remote import ReadOptions

__all__ = [
    "IMG_EXTENSIONS",
    "KINDS",
    "ROW_SCHEMA",
    "BlockReader",
    "CacheConfig",
    "DatasetRoot",
    "ListingOptions",
    "ReadOptions",
    "ShardChangedError",
    "ShardListing",
    "SourceRows",
    "detect_kind",
    "list_image_folder",
    "list_manifest",
    "list_parquet",
    "list_ray_dataset",
    "list_webdataset",
    "open_root",
    "open_source",
]


def detect_kind(data: str, *, filesystem: pafs.FileSystem | None = None) -> str:
    """'manifest' for .csv/.jsonl, 'parquet' for a .parquet file or a folder holding them, 'webdataset'
    for a .tar file, a wids shard list (.json), a brace pattern, a folder holding .tar files or a prefix of
    some, else 'folder'."""
    named = kind_by_name(data)
    if named is not None:
        return named
    root = open_root(data, filesystem=filesystem)
    if root.is_local:
        if not os.path.exists(root.root):
            parent, stem = os.path.split(root.root)
            if os.path.isdir(parent) and any(n.startswith(stem) and n.endswith(".tar") for n in os.listdir(parent)):
                return "webdataset"  # a prefix of shards
            raise ValueError(f"dataset {data!r} does not exist")
        if os.path.isdir(root.root):
            with os.scandir(root.root) as it:
                return kind_by_files([e.name for e in it if e.is_file()]) or "folder"
        return "folder"
    info = root.filesystem.get_file_info(pafs.FileSelector(root.root, recursive=False, allow_not_found=True))
    if not info:  # nothing under it: maybe a prefix of shards
        parent, _, stem = root.root.rpartition("/")
        siblings = root.filesystem.get_file_info(pafs.FileSelector(parent, recursive=False, allow_not_found=True))
        if any(i.base_name.startswith(stem) and i.base_name.endswith(".tar") for i in siblings):
            return "webdataset"
    return kind_by_files([i.path for i in info if i.type == pafs.FileType.File]) or "folder"


def open_source(data, *, options: ListingOptions | None = None, **keywords) -> SourceRows | ShardListing:
    """List any supported dataset (local path or pyarrow filesystem URI, or a ``ray.data.Dataset``) into
    SourceRows, with ``options`` (``ListingOptions``) or the same fields as keywords
    (``open_source(data, kind="manifest", root=…)``).

    ``filesystem`` (e.g. ``pyarrow.fs.S3FileSystem(endpoint_override=…)``) is used instead of the one
    the URI implies; it travels to the Ray workers with the rows, so its options must be picklable.
    ``class_order`` ("natural", timm's, or "sorted", torchvision's) and ``class_map`` (a dict or a
    .txt/.json/.csv file) number class folders and class-name labels (``sources.classes``).
    ``index`` names a WebDataset shard index (``list_webdataset``); raypipe's own beside the shards is
    found without it. ``by_shard``: an indexed WebDataset listed by shard (``ShardListing``: True, or
    None above ``Settings.by_shard_rows`` samples), its sample rows read from the index as chunks need them.
    A Ray Dataset is listed by ``list_ray_dataset`` (its image column, ``image_column``
    or else ``path_column``, holds bytes, or paths under ``root``): the pass that numbers its rows.

    Args:
        data: a local path (``str`` or ``os.PathLike``) or URI, a ``ray.data.Dataset``, or a listing
            (returned as it is).
        options: a ``ListingOptions`` (None: the defaults, or ``keywords``).
        **keywords: ``ListingOptions``' fields, instead of ``options``.

    Returns:
        ``SourceRows``, or a ``ShardListing`` for a WebDataset listed by shard.

    Raises:
        ValueError: an invalid option (named), ``options`` and keywords both, options that do not fit
            ``data``, a path that names no dataset, or a dataset its lister refuses.
        TypeError: ``data`` of another type, or a keyword that is not a ``ListingOptions`` field.
        ConnectionError: a remote store's first request failed (credentials, endpoint).
        TimeoutError: a remote store did not answer, or the listing did not finish, in time
            (``Settings.first_answer_s``, ``listing_s``).
        OSError: a file that cannot be read (a missing manifest, say).
    """
    given = options is not None
    options = ListingOptions.of(options, **keywords)
    from raypipe.sources.mixture import Mixture, MixtureListing, list_mixture

    if isinstance(data, Mixture | MixtureListing):  # each part is listed with its own options
        if given or keywords:
            raise ValueError("options= are each part's in a Mixture: give them as (source, weight, ListingOptions)")
        return data if isinstance(data, MixtureListing) else list_mixture(data, open_source)
    if isinstance(data, SourceRows | ShardListing):
        if given:
            raise ValueError("options= are for listing a dataset: a listing given as data is taken as it is")
        return data
    if is_ray_dataset(data):
        if options.changed("kind", "index"):
            raise ValueError("kind= and index= are for datasets named by a path; a Ray Dataset's kind is its rows'")
        return list_ray_dataset(data, options=options)
    if not isinstance(data, str | os.PathLike):
        raise TypeError(f"expected a path or URI, a listing or a ray.data.Dataset as data, not {type(data).__name__}")
    data = os.fspath(data)  # a pathlib.Path names the dataset its string names
    if ray_only := options.changed("block_rows", "max_bytes"):
        raise ValueError(f"{'= and '.join(ray_only)}= are for a Ray Dataset's listing; {data!r} is named by a path")
    filesystem = options.filesystem
    if options.by_shard and (options.kind or detect_kind(data, filesystem=filesystem)) != "webdataset":
        raise ValueError(f"by_shard=True: only an indexed WebDataset is listed by shard, {data!r} is not one")
    if filesystem is None and not is_uri(data):
        return _list(data, options)
    # Remote: a missing credential or a silent endpoint must end in seconds (raypipe.timeouts)
    _first_answer(data, filesystem)
    listing_s = settings.current().listing_s
    return timeouts.call_with_deadline(
        lambda: _list(data, options),
        listing_s,
        lambda: (
            f"listing {data} did not finish in {listing_s:g} s: {_what_to_check(data)}; for a "
            "very large dataset raise RAYPIPE_LISTING_S"
        ),
    )


def _what_to_check(data: str) -> str:
    scheme = data.partition("://")[0].lower() if "://" in data else ""
    if scheme in ("s3", "s3a"):
        return (
            "check the credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE), the endpoint (AWS_ENDPOINT_URL) and "
            "access to the bucket"
        )
    if scheme in ("gs", "gcs"):
        return (
            "check the credentials (GOOGLE_APPLICATION_CREDENTIALS, or `gcloud auth application-default "
            "login`) and access to the bucket"
        )
    return "check the credentials, the endpoint and access to the data"


def _first_answer(data: str, filesystem: pafs.FileSystem | None) -> None:
    """Ask the store about the dataset's root once, within ``Settings.first_answer_s``: the cheapest
    request that proves the credentials and the endpoint work, and the one error message for when they
    do not."""

    def ask() -> None:
        root = open_root(data, filesystem=filesystem)
        root.filesystem.get_file_info(root.root)

    first_answer_s = settings.current().first_answer_s
    try:
        timeouts.call_with_deadline(
            ask,
            first_answer_s,
            lambda: f"listing {data} did not answer in {first_answer_s:g} s: {_what_to_check(data)}",
        )
    except TimeoutError:
        raise
    except OSError as e:  # the store's own error: often pages long; its first line says what failed
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConnectionError(f"listing {data} failed: {first[:300]}: {_what_to_check(data)}") from None


def _list(data: str, options: ListingOptions) -> SourceRows | ShardListing:
    o = options
    kind = o.kind or detect_kind(data, filesystem=o.filesystem)
    if o.index is not None and kind != "webdataset":
        raise ValueError(f"index={o.index!r}: shard indexes are for WebDataset shards, {data!r} is a {kind} dataset")
    if kind not in FORMATS:
        raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
    return FORMATS[kind].list(data, o)
