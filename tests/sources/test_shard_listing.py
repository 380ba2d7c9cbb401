"""An indexed WebDataset listed by shard: the same samples, order, batches and accounting as listed by
row, with the samples' rows read from the index as chunks need them; shards it cannot trust refused."""

from __future__ import annotations

import hashlib
import os

import image_factory as f
import numpy as np
import pytest
from image_factory import sample, write_shard

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.sources import ShardListing, SourceRows, open_source
from raypipe.sources.indexes.indexer import index_shards
from raypipe.sources.indexes.shard_index import INDEX_NAME

pytestmark = pytest.mark.timeout(240)

AUG = TrainAugment(input_size=(16, 16))


@pytest.fixture
def indexed(tmp_path):
    """5 shards of 9 samples of distinct JPEGs, two of each shard's labels bad (none, not a number)."""
    d = tmp_path / "wds"
    for s in range(5):
        members = []
        for i in range(9):
            label = None if i == 3 else ("cat" if i == 4 else (s * 9 + i) % 5)
            members += sample(f"s{s}/k{i:03d}", label, image=f.encode(f.gradient((24 + s, 20 + i))))
        write_shard(d / f"shard-{s:04d}.tar", members)
    index_shards(str(d), use_ray=False)
    return d


def batches(rows, rank, world):
    pipe = Pipeline(
        rows,
        AUG,
        config=PipelineConfig(batch_size=4, max_skip_ratio=0.5, shuffle_window=16),
        execution=ExecutionConfig(backend="local", chunk_rows=8, num_tasks=1),
    )
    source = EpochSource(pipe, rank=rank, world_size=world, end_epoch=2)
    out = [
        [(b["sample_id"].tolist(), hashlib.sha256(b["image"].tobytes()).hexdigest()) for b in source] for _ in range(2)
    ]
    source.close()
    return out, source.reports


def test_listed_by_shard_it_yields_what_the_rows_listing_yields(indexed):
    by_row = open_source(str(indexed))
    by_shard = open_source(str(indexed), by_shard=True)
    assert isinstance(by_row, SourceRows) and isinstance(by_shard, ShardListing)
    assert len(by_shard) == len(by_row) == 45 and by_shard.shard_counts.tolist() == [9] * 5
    every = np.arange(45)
    got, want = by_shard.columns().take(every), by_row.columns().take(every)
    for name in ("sample_id", "label", "path", "error", "shard", "offset", "size", "member"):
        assert list(got[name]) == list(want[name]), name
    for world in (1, 2):
        for rank in range(world):
            (a, ra), (b, rb) = batches(by_shard, rank, world), batches(by_row, rank, world)
            assert a == b
            assert [(r.emitted, r.skipped) for r in ra] == [(r.emitted, r.skipped) for r in rb]
    assert sum(sum(r.skipped.values()) for r in batches(by_shard, 0, 1)[1][:1]) == 2 * 5  # every bad label once


def test_shards_it_cannot_trust_are_refused(indexed):
    write_shard(indexed / "shard-0009.tar", sample("x/a", 1))  # not in the index
    with pytest.raises(ValueError, match="not in the index"):
        open_source(str(indexed), by_shard=True)
    os.unlink(indexed / "shard-0009.tar")
    with open(indexed / "shard-0002.tar", "ab") as f:  # changed since it was indexed
        f.write(b"\0" * 512)
    with pytest.raises(ValueError, match="changed since"):
        open_source(str(indexed), by_shard=True)
    os.unlink(indexed / INDEX_NAME)
    with pytest.raises(ValueError, match="raypipe index"):
        open_source(str(indexed), by_shard=True)
    assert isinstance(open_source(str(indexed)), SourceRows)  # by row: the headers are read instead


def test_a_listing_by_shard_has_no_rows_to_give(indexed):
    listing = open_source(str(indexed), by_shard=True)
    with pytest.raises(ValueError, match="listed by shard"):
        _ = listing.table
    with pytest.raises(ValueError, match="number of classes"):
        _ = listing.num_classes


def test_above_the_threshold_an_index_lists_by_shard(indexed, monkeypatch):
    monkeypatch.setenv("RAYPIPE_BY_SHARD_ROWS", "40")
    assert isinstance(open_source(str(indexed)), ShardListing)
    assert isinstance(open_source(str(indexed), by_shard=False), SourceRows)


def test_an_index_without_per_shard_counts_is_refused_by_shard(indexed):
    import json

    import pyarrow.parquet as pq

    table = pq.read_table(indexed / INDEX_NAME)
    meta = json.loads(table.schema.metadata[b"raypipe.index"])
    for s in meta["shards"]:
        del s["rows"]
    pq.write_table(table.replace_schema_metadata({b"raypipe.index": json.dumps(meta).encode()}), indexed / INDEX_NAME)
    with pytest.raises(ValueError, match="no per-shard sample counts"):
        open_source(str(indexed), by_shard=True)
    assert len(open_source(str(indexed))) == 45  # by row, it reads the rows themselves


def test_the_timm_drop_in_takes_a_listing_by_shard(tmp_path):
    import torch

    from raypipe.timm import create_loader

    d = tmp_path / "wds"
    for s in range(3):
        members = []
        for i in range(8):
            members += sample(f"s{s}/k{i:03d}", (s * 8 + i) % 4, image=f.encode(f.gradient((24 + s, 20 + i))))
        write_shard(d / f"shard-{s:04d}.tar", members)
    index_shards(str(d), use_ray=False)
    rows = open_source(str(d), by_shard=True)
    loader = create_loader(
        rows,
        input_size=(3, 16, 16),
        batch_size=4,
        is_training=True,
        device=torch.device("cpu"),
        execution=ExecutionConfig(backend="local", num_tasks=1),
    )
    loader.yield_ids = True
    try:
        ids = sorted(i for _, _, batch_ids in loader for i in batch_ids.tolist())
    finally:
        loader.close()
    assert loader.dataset is rows and len(loader) == 6
    assert ids == list(range(24))  # every sample once
