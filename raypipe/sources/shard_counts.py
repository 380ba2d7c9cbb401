"""Samples per shard from an index alone: all an epoch's plan needs, at any number of samples.

An epoch's order (``raypipe.pipeline.order``) groups rows by shard and needs only how many rows each
shard holds (``ShardRuns.from_sizes``). An index already says it: a ``wids`` shard list per shard
(``nsamples``), raypipe's own index in its footer (``rows`` per shard, read without its sample rows).
So planning a billion samples in 100,000 shards reads a few megabytes, not a row per sample
(``python bench/profiles.py shard-plan`` measures it). Shards come in the order a listing of the
shards would give them (sorted by path), so a row's number is the ``sample_id`` the listing gives it.
Nothing here checks that the shards exist: a missing one fails when it is read, as a listing's would.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raypipe.pipeline.order import ShardRuns
from raypipe.sources.foreign_index import parse_wids
from raypipe.sources.paths import SkipImage, open_root

__all__ = ["ShardCounts", "shard_counts"]


@dataclass(frozen=True)
class ShardCounts:
    """The shards an index names (paths as it gives them, sorted) and the samples in each."""

    paths: tuple[str, ...]
    counts: np.ndarray  # int64, one per shard

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def runs(self) -> ShardRuns:
        """The shards as an epoch's order takes them."""
        return ShardRuns.from_sizes(self.counts)


def shard_counts(index: str, *, filesystem: pafs.FileSystem | None = None) -> ShardCounts:
    """The samples per shard that ``index`` records: a ``wids`` shard list (``.json``) or raypipe's index
    (``raypipe-index.parquet``, written by ``raypipe convert`` or ``raypipe index``)."""
    parent, _, name = index.rstrip("/").rpartition("/")
    here = open_root(parent or ".", filesystem=filesystem)
    if name.endswith(".json"):
        try:
            raw = here.read_bytes(name)
        except SkipImage as e:
            raise ValueError(f"wids shard index {index!r}: {e.reason} ({e.detail})") from None
        _, shards = parse_wids(raw, index)
        by_path = sorted((posixpath.normpath(s.url), s.nsamples) for s in shards)
        return ShardCounts(tuple(p for p, _ in by_path), np.array([c for _, c in by_path], dtype=np.int64))
    return _raypipe_index_counts(here, name, index)


def _raypipe_index_counts(here, name: str, where: str) -> ShardCounts:
    from raypipe.sources.shard_index import index_meta

    path = here.resolve(name)
    fs = here.filesystem or pafs.LocalFileSystem()
    with fs.open_input_file(path) as f:
        parquet = pq.ParquetFile(f)
        meta = index_meta(parquet.schema_arrow.metadata, where)
        shards = meta["shards"]
        if all("rows" in s for s in shards):  # the footer alone
            counts = np.array([int(s["rows"]) for s in shards], dtype=np.int64)
        else:  # an index written without per-shard counts: count its rows' shard numbers
            numbers = parquet.read(columns=["shard"]).column("shard").to_numpy()
            counts = np.bincount(numbers, minlength=len(shards)).astype(np.int64)
    order = sorted(range(len(shards)), key=lambda k: shards[k]["path"])
    return ShardCounts(tuple(shards[k]["path"] for k in order), counts[order])

