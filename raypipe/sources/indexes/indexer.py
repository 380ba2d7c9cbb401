"""Write raypipe's shard index for existing WebDataset shards (``raypipe index``): every shard's tar
headers read once, shards spread over Ray tasks, the index written in one piece (``sources.indexes.shard_index``).

A shard's size and time are taken before its headers are read and checked again once all are read; a
shard that changed meanwhile fails the run with its name, so no index describes bytes a shard no longer
holds.
"""

from __future__ import annotations

import os
import posixpath
import time
from dataclasses import dataclass

import pyarrow.fs as pafs

from raypipe.sources.formats.shard_paths import find_shards
from raypipe.sources.formats.webdataset import scan_shards
from raypipe.sources.indexes.shard_index import (
    INDEX_NAME,
    ShardRecord,
    index_location,
    local_stamp,
    stamp_matches,
    write_index,
)
from raypipe.sources.table import listed_stamp
from raypipe.sources.transport.paths import DatasetRoot
from raypipe.sources.transport.remote import ReadOptions

__all__ = ["IndexReport", "index_shards"]


@dataclass(frozen=True)
class IndexReport:
    index: str  # where it was written
    shards: int
    samples: int
    shard_bytes: int
    seconds: float


def _scan_group(root: DatasetRoot, stamps: dict[str, tuple[int, int]]) -> list[ShardRecord]:
    return scan_shards(root, stamps, ReadOptions())


def _stamps_now(root: DatasetRoot, rels: list[str]) -> dict[str, tuple[int, int]]:
    if root.is_local:
        return {rel: local_stamp(root, rel) for rel in rels}
    infos = root.filesystem.get_file_info([posixpath.join(root.root, rel) for rel in rels])
    return {rel: listed_stamp(i) for rel, i in zip(rels, infos, strict=True)}


def index_shards(
    data: str,
    out: str | None = None,
    *,
    filesystem: pafs.FileSystem | None = None,
    use_ray: bool = True,
    tasks: int | None = None,
    connect=None,
) -> IndexReport:
    """Index the shards ``data`` names (as ``list_webdataset`` takes them) into ``out`` (default:
    ``raypipe-index.parquet`` in the shards' folder; a URI is written through the shards' store).
    ``use_ray`` spreads the shards over ``tasks`` Ray tasks (default: twice the cluster's CPUs, connecting
    with ``connect()``, default ``raypipe.connect()``, when Ray is not up, once the shards are found);
    otherwise this process lists them."""
    began = time.monotonic()
    root, stamps, _ = find_shards(data, filesystem)
    rels = list(stamps)
    if root.is_local:
        stamps = _stamps_now(root, rels)
    if use_ray and len(rels) > 1:
        import ray

        if not ray.is_initialized():
            if connect is None:
                from raypipe.runtime import connect
            connect()
        n = max(1, min(len(rels), tasks or 2 * int(ray.cluster_resources().get("CPU", 1))))
        groups = [rels[k::n] for k in range(n)]
        task = ray.remote(_scan_group).options(num_cpus=1, max_retries=2)
        refs = [task.remote(root, {rel: stamps[rel] for rel in g}) for g in groups]
        found = {rec.path: rec for part in ray.get(refs) for rec in part}
        records = [found[rel] for rel in rels]
    else:
        records = scan_shards(root, stamps)
    now = _stamps_now(root, rels)
    changed = [rec.path for rec in records if not stamp_matches((rec.size, rec.mtime_ns), now[rec.path])]
    if changed:
        raise ValueError(
            f"{len(changed)} shard(s) changed while they were indexed, e.g. "
            f"{root.display(changed[0])}: index them again once they are written"
        )
    if out is None:
        fs = root.filesystem
        where = os.path.join(root.root, INDEX_NAME) if root.is_local else posixpath.join(root.root, INDEX_NAME)
        shown = root.display(INDEX_NAME)
    else:
        fs, where = index_location(out, root, filesystem)
        shown = out
    write_index(records, where, root=root, filesystem=fs)
    return IndexReport(
        index=shown,
        shards=len(records),
        samples=sum(len(r) for r in records),
        shard_bytes=sum(r.size for r in records),
        seconds=time.monotonic() - began,
    )
