"""raypipe's own index of WebDataset shards: what listing the shards would find, so that a listing with it
reads one small file instead of every tar header.

One Parquet file (``raypipe-index.parquet`` beside the shards by default): a row per sample as the
listing makes it (``shard``, ``label``, ``error``, the image member's ``offset``, ``size``, ``member`` and
``header_crc``, the CRC-32 of its tar header block: absent from indexes written before it), and in the
footer's ``raypipe.index`` JSON per shard its ``path`` (relative to ``root``), ``size``, ``mtime_ns``,
``keys``, ``rows`` and, for a truncated shard, ``stopped_at``/``reason``. A shard matches its index when
its size does (:func:`size_matches`: a copy or an upload changes the time, which is a hint); each read
then checks the header before its member (``sources.formats.tar_members``). Written in one piece: locally to a
temporary name then renamed, on an object store in one upload.
"""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raypipe.sources.table import column_array, int64_array, string_array
from raypipe.sources.transport.paths import DatasetRoot

__all__ = [
    "INDEX_NAME",
    "ShardRecord",
    "index_location",
    "index_meta",
    "local_stamp",
    "read_index",
    "relative_paths",
    "size_matches",
    "stamp_matches",
    "time_matches",
    "write_index",
]

INDEX_NAME = "raypipe-index.parquet"
_FORMAT = "raypipe-webdataset-index"
_VERSION = 1
_META_KEY = b"raypipe.index"
# Rows per row group: a listing by shard reads one shard's rows from the groups that hold them
# (``shard_listing``), a few hundred kilobytes rather than a million rows' worth.
_GROUP_ROWS = 65_536
_SCHEMA = pa.schema(
    [
        ("shard", pa.int64()),
        ("label", pa.int64()),
        ("error", pa.string()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
        ("member", pa.string()),
        ("header_crc", pa.int64()),
    ]
)


@dataclass
class ShardRecord:
    """One shard's samples as its listing makes them, and the shard's size and time when it was listed."""

    path: str  # relative to the dataset root
    size: int
    mtime_ns: int  # -1: the store gave none
    labels: list  # a class id each (an int), or a tuple of ids where a .cls holds several
    errors: list[str | None]
    offsets: list[int]
    sizes: list[int]
    members: list[str]
    keys: int  # sample keys its headers held, samples or not (the incomplete-shard report counts them)
    stopped_at: int | None = None  # where a truncated shard's listing stopped
    reason: str = ""
    header_crcs: list[int] = field(default_factory=list)  # per row: its member's header digest, -1 unknown
    # per field asked of a scan (``ListingOptions.fields``): each row's member as (data offset, size,
    # header digest), (-1, -1, -1) where the sample has none; an index records none
    fields: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)

    def header_digests(self) -> list[int]:
        """Each row's member header digest (-1s where the record holds none)."""
        return self.header_crcs if len(self.header_crcs) == len(self) else [-1] * len(self)


def size_matches(indexed_size: int, current: tuple[int, int]) -> bool:
    """Whether a shard now of (size, mtime_ns) ``current`` may be read as indexed at ``indexed_size``: its
    size is the one indexed. Its time is not asked: a copy, an upload or ``rsync`` without ``-t`` keeps
    every byte and sets a new one; the reads check each member's header instead."""
    return current[0] >= 0 and indexed_size == current[0]


def time_matches(indexed_ns: int, current_ns: int) -> bool:
    """Whether two modification times are the same one as stores state them: to the second where either
    is in whole seconds (S3 gives ``HEAD`` whole seconds, ``ListObjectsV2`` milliseconds), and a store
    that gives none (-1) agrees with any."""
    a, b = indexed_ns, current_ns
    if a < 0 or b < 0 or a == b:
        return True
    return (a % 10**9 == 0 or b % 10**9 == 0) and a // 10**9 == b // 10**9


def stamp_matches(indexed: tuple[int, int], current: tuple[int, int]) -> bool:
    """Whether a shard whose (size, mtime_ns) was ``indexed`` is the same file, unchanged, at ``current``:
    its size and (:func:`time_matches`) its time. ``raypipe index`` asks it of a shard it just read."""
    return indexed[0] == current[0] and time_matches(indexed[1], current[1])


def local_stamp(root: DatasetRoot, rel: str) -> tuple[int, int]:
    """(size, mtime_ns) of a shard under a local root, as the index records them."""
    st = os.stat(os.path.join(root.root, rel))
    return st.st_size, st.st_mtime_ns


def index_location(
    path: str, root: DatasetRoot, filesystem: pafs.FileSystem | None
) -> tuple[pafs.FileSystem | None, str]:
    """(filesystem, path) of an index file: a URI is read through the dataset's filesystem (or the one it
    names), a plain path from local disk."""
    if "://" not in path:
        return None, path
    if filesystem is not None or not root.is_local:
        return filesystem or root.filesystem, path.split("://", 1)[1]
    fs, where = pafs.FileSystem.from_uri(path)
    return fs, where


def relative_paths(index_root: str, paths: list[str], root: DatasetRoot, *, beside: bool) -> list[str | None]:
    """The index's shard ``paths`` (relative to the ``index_root`` it was written under) relative to the
    dataset's ``root``; None for one outside it. An index found ``beside`` the shards describes the folder
    it lies in, wherever it was written; one named elsewhere, written under a folder that holds this root
    (or is it), is rebased onto it; one written anywhere else moved with its shards (written locally,
    then uploaded with them), and its paths are taken as they are."""
    sep = os.sep if root.is_local else "/"
    base = index_root.rstrip(sep) + sep
    if beside or index_root == root.root or not (root.root.rstrip(sep) + sep).startswith(base):
        return list(paths)
    prefix = root.root.rstrip(sep) + sep
    joined = [(os.path.join if root.is_local else posixpath.join)(index_root, p) for p in paths]
    return [p[len(prefix) :] if p.startswith(prefix) else None for p in joined]


def _index_path(root: DatasetRoot, where: str) -> str:
    return os.path.join(root.root, where) if root.is_local else posixpath.join(root.root, where)


def write_index(
    records: list[ShardRecord],
    out: str,
    *,
    root: DatasetRoot,
    filesystem: pafs.FileSystem | None = None,
    member_rows: bool = True,
) -> str:
    """Write ``records`` (shards under ``root``) as an index at ``out`` (a local path, or a path on
    ``filesystem``), in one piece; returns where. ``member_rows=False`` writes the footer alone (each
    shard's samples counted in it, no sample rows): all that a listing by shard and an epoch's plan read,
    for measuring them at sizes whose rows would not fit (``raypipe.benchmark.listing``); listing by row
    or reading a chunk's rows from such an index finds no samples."""
    several = next((r.path for r in records if any(isinstance(v, tuple) for v in r.labels)), None)
    if several is not None:
        raise ValueError(
            f"{several}: a .cls holds several class ids; an index holds one label a sample, so these shards are "
            "listed from their tar headers (no index)"
        )
    if member_rows:
        counts = [len(r) for r in records]
        table = pa.table(
            {
                "shard": int64_array(np.repeat(np.arange(len(records), dtype=np.int64), counts)),
                "label": int64_array([v for r in records for v in r.labels]),
                "error": string_array([v for r in records for v in r.errors]),
                "offset": int64_array([v for r in records for v in r.offsets]),
                "size": int64_array([v for r in records for v in r.sizes]),
                "member": string_array([v for r in records for v in r.members]),
                "header_crc": int64_array([v for r in records for v in r.header_digests()]),
            },
            schema=_SCHEMA,
        )
    else:
        table = _SCHEMA.empty_table()
    meta = {
        "format": _FORMAT,
        "version": _VERSION,
        "root": root.root,
        "shards": [
            {
                "path": r.path,
                "size": r.size,
                "mtime_ns": r.mtime_ns,
                "keys": r.keys,
                "rows": len(r),
                "stopped_at": r.stopped_at,
                "reason": r.reason,
            }
            for r in records
        ],
    }
    table = table.replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})
    if filesystem is None:
        folder, name = os.path.split(os.path.abspath(out))
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{name}.tmp-{uuid.uuid4().hex[:12]}")
        try:
            pq.write_table(table, tmp, compression="zstd", row_group_size=_GROUP_ROWS)
            os.replace(tmp, out)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return out
    # One upload: the store shows the object only once it is complete (a single PUT, or a multipart
    # upload that is completed as its last step), so no reader sees half an index.
    with filesystem.open_output_stream(out) as sink:
        pq.write_table(table, sink, compression="zstd", row_group_size=_GROUP_ROWS)
    return out


def index_meta(metadata: dict | None, path: str) -> dict:
    """The ``raypipe.index`` JSON of an index file's footer metadata; ``ValueError`` for a file that is
    not a raypipe index of this version."""
    raw = (metadata or {}).get(_META_KEY)
    try:
        meta = json.loads(raw) if raw else {}
    except ValueError:
        meta = {}
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a raypipe shard index (no {_META_KEY.decode()} metadata)")
    if meta.get("version") != _VERSION:
        raise ValueError(
            f"{path}: raypipe shard index version {meta.get('version')}, this raypipe reads "
            f"{_VERSION}: write it again with `raypipe index`"
        )
    return meta


def read_index(path: str, filesystem: pafs.FileSystem | None = None) -> tuple[str, dict[str, ShardRecord]]:
    """(the root the index was made under, its shards by path relative to that root); ``ValueError`` for
    a file that is not a raypipe index, ``FileNotFoundError`` for none."""
    if filesystem is None:
        table = pq.read_table(path)
    else:
        with filesystem.open_input_file(path) as f:
            table = pq.read_table(f)
    meta = index_meta(table.schema.metadata, path)
    shard = column_array(table.column("shard"))
    bounds = np.searchsorted(shard, np.arange(len(meta["shards"]) + 1))
    cols = {name: column_array(table.column(name)) for name in ("label", "error", "offset", "size", "member")}
    cols["header_crc"] = (
        column_array(table.column("header_crc"))
        if "header_crc" in table.column_names
        else np.full(table.num_rows, -1, np.int64)
    )
    records = {}
    for k, s in enumerate(meta["shards"]):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        records[s["path"]] = ShardRecord(
            path=s["path"],
            size=int(s["size"]),
            mtime_ns=int(s["mtime_ns"]),
            labels=cols["label"][lo:hi].tolist(),
            errors=list(cols["error"][lo:hi]),
            offsets=cols["offset"][lo:hi].tolist(),
            sizes=cols["size"][lo:hi].tolist(),
            members=list(cols["member"][lo:hi]),
            keys=int(s["keys"]),
            stopped_at=s["stopped_at"],
            reason=s["reason"],
            header_crcs=cols["header_crc"][lo:hi].tolist(),
        )
    return meta["root"], records
