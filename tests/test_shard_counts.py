"""Samples per shard from an index's footer or a wids list: the same epoch plan as the full listing
gives, without a row per sample."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_shard_index import _shards

from raypipe.pipeline.order import EpochOrder, RankPlan, ShardRuns
from raypipe.sources import open_source
from raypipe.sources.indexer import index_shards
from raypipe.sources.shard_counts import shard_counts
from raypipe.sources.shard_index import INDEX_NAME
from raypipe.sources.table import column_array

pytestmark = pytest.mark.timeout(120)


def _listing_counts(rows):
    shards = column_array(rows.table.column("shard"))
    return np.bincount(shards)


def test_counts_from_the_index_footer_plan_as_the_listing_does(tmp_path, monkeypatch):
    d = _shards(tmp_path / "wds", n=4, per=9)
    index_shards(str(d), use_ray=False)
    rows = open_source(str(d))

    def no_rows(*args, **kwargs):
        raise AssertionError("the index's sample rows were read")

    monkeypatch.setattr(pq.ParquetFile, "read", no_rows)
    counts = shard_counts(str(d / INDEX_NAME))
    assert counts.paths == tuple(sorted(p.name for p in d.glob("*.tar")))
    assert counts.counts.tolist() == _listing_counts(rows).tolist() and counts.total == len(rows)
    for epoch in range(3):
        listed = RankPlan.for_rows(rows, seed=4, shuffle=True, chunk_rows=8, window_rows=16, rank=1, world_size=2)
        planned = RankPlan(counts.total, seed=4, shuffle=True, chunk_rows=8, window_rows=16, rank=1, world_size=2,
                           runs=counts.runs())  # fmt: skip
        assert np.array_equal(listed.rows(epoch), planned.rows(epoch))


def test_an_index_without_per_shard_counts_is_counted_from_its_rows(tmp_path):
    d = _shards(tmp_path / "wds", n=3, per=5)
    index_shards(str(d), use_ray=False)
    table = pq.read_table(d / INDEX_NAME)
    meta = json.loads(table.schema.metadata[b"raypipe.index"])
    for s in meta["shards"]:
        del s["rows"]
    pq.write_table(table.replace_schema_metadata({b"raypipe.index": json.dumps(meta).encode()}), d / INDEX_NAME)
    assert shard_counts(str(d / INDEX_NAME)).counts.tolist() == _listing_counts(open_source(str(d))).tolist()


def test_a_wids_list_gives_its_counts_in_path_order(tmp_path):
    desc = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "t",
            "shardlist": [{"url": "b/s1.tar", "nsamples": 3}, {"url": "a/s0.tar", "nsamples": 0},
                          {"url": "b/s0.tar", "nsamples": 5}]}  # fmt: skip
    (tmp_path / "train.json").write_text(json.dumps(desc))
    counts = shard_counts(str(tmp_path / "train.json"))
    assert counts.paths == ("a/s0.tar", "b/s0.tar", "b/s1.tar") and counts.counts.tolist() == [0, 5, 3]
    order = EpochOrder(8, seed=0, epoch=0, shuffle=True, runs=counts.runs(), window_rows=4).all()
    assert sorted(order.tolist()) == list(range(8))
    assert len(ShardRuns.from_sizes(counts.counts)) == 2  # an empty shard takes no place in the order
    (tmp_path / "x.parquet").write_bytes(b"")
    with pytest.raises((ValueError, OSError)):
        shard_counts(str(tmp_path / "x.parquet"))
    assert not os.path.exists(tmp_path / INDEX_NAME)
