"""Fields on the paths that run on Ray: Ray tasks, the feeder (by reference and by shared memory),
node workers and their hand-over over TCP, a Ray Dataset's columns, and ``RayDataAugment``. Each
batch is checked row by row: a field's value is a function of its sample's id."""

from __future__ import annotations

import numpy as np
import pytest
from image_factory import caption_ids, captioned_jpeg, write_captioned_shards

from raypipe.config import EvalAugment, ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, FeederSource, Pipeline
from raypipe.sources import ListingOptions

pytestmark = pytest.mark.timeout(300)

AUG = TrainAugment(input_size=(24, 24))
N = 17


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("captioned")
    write_captioned_shards(out, n=N, per_shard=6)
    return out


def _pipeline(data, backend, **execution):
    return Pipeline(
        data,
        AUG,
        config=PipelineConfig(batch_size=4, seed=1),
        execution=ExecutionConfig(backend=backend, chunk_rows=4, **execution),
        listing=ListingOptions(fields=("txt", "json")),
        field_transforms={"txt": caption_ids},
    )


def _check(batches) -> None:
    seen = []
    for b in batches:
        assert b["txt"].shape == (len(b["sample_id"]), 16)
        for k, sid in enumerate(b["sample_id"].tolist()):
            assert b["txt"][k].tolist() == caption_ids(f"caption {sid}").tolist()
            assert b["json"][k] == {"i": sid}
        seen += b["sample_id"].tolist()
    assert sorted(seen) == list(range(N))


def _epoch(source) -> list[dict]:
    return [{k: (np.array(v) if k != "json" else list(v)) for k, v in b.items()} for b in source]


def test_fields_come_from_ray_tasks(ray_local, shards):
    source = EpochSource(_pipeline(str(shards), "ray"), end_epoch=1)
    _check(_epoch(source))
    source.close()


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_fields_come_through_the_feeder_as_the_in_process_batches(ray_local, shards, backend):
    feeder = FeederSource(_pipeline(str(shards), backend, num_tasks=1))
    try:
        first, second = _epoch(feeder), _epoch(feeder)
    finally:
        feeder.close()
    _check(first)
    _check(second)


def test_fields_come_from_node_workers_over_their_hand_over(ray_local, shards, monkeypatch):
    from raypipe.workers.node import HOST_ENV, NodeWorkers

    monkeypatch.setenv(HOST_ENV, "127.0.0.1")
    source = EpochSource(_pipeline(str(shards), "nodes"), end_epoch=2)
    try:
        for _ in range(2):
            _check(_epoch(source))
    finally:
        source.close()
        NodeWorkers.shutdown_shared()


def test_a_ray_datasets_columns_are_fields(ray_local):
    import ray

    items = [{"image": captioned_jpeg(i), "label": i % 2, "caption": f"caption {i}", "i": i} for i in range(N)]
    ds = ray.data.from_items(items)
    pipe = Pipeline(
        ds,
        EvalAugment(input_size=(24, 24)),
        config=PipelineConfig(batch_size=4, shuffle=False),
        execution=ExecutionConfig(backend="ray", chunk_rows=4),
        listing=ListingOptions(fields=("caption", "i")),
    )
    source = EpochSource(pipe, end_epoch=1)
    batches = _epoch(source)
    source.close()
    for b in batches:
        assert list(b["caption"]) == [f"caption {sid}" for sid in b["sample_id"].tolist()]
        np.testing.assert_array_equal(b["i"], b["sample_id"])  # the dataset's own numbering, as an array


def test_ray_data_augment_carries_fields_as_columns(ray_local):
    import ray

    from raypipe.integrations.ray_data import RayDataAugment

    items = [{"image": captioned_jpeg(i), "label": 0, "sample_id": i, "caption": f"caption {i}"} for i in range(8)]
    items[5]["caption"] = None
    stage = RayDataAugment(
        EvalAugment(input_size=(24, 24)),
        seed=0,
        epoch=0,
        fields=("caption",),
        field_transforms={"caption": caption_ids},
    )
    rows = ray.data.from_items(items).map_batches(stage, batch_size=4, batch_format="numpy").take_all()
    assert sorted(r["sample_id"] for r in rows) == [i for i in range(8) if i != 5]  # a null caption: skipped
    for r in rows:
        assert r["caption"].tolist() == caption_ids(f"caption {r['sample_id']}").tolist()


def test_a_ray_dataset_is_a_part_of_a_mixture(ray_local, shards):
    """A Ray Dataset beside shards in a Mixture: its bytes in Ray's object store, so the mixture runs on
    Ray tasks; each epoch takes its share of each part, and each part's rows keep their own fields."""
    import ray

    from raypipe.sources.mixture import Mixture

    items = [{"image": captioned_jpeg(i), "label": i % 2, "caption": f"item {i}"} for i in range(N)]
    ds = ray.data.from_items(items)
    mixture = Mixture(
        [(ds, 1, ListingOptions(fields=("caption",))), (str(shards), 2, ListingOptions(fields=("txt",)))],
        samples_per_epoch=24,
    )
    pipe = Pipeline(
        mixture,
        EvalAugment(input_size=(24, 24)),
        config=PipelineConfig(batch_size=4),
        execution=ExecutionConfig(backend="ray", chunk_rows=4),
    )
    assert pipe.rows.kind == "raydata" and pipe.rows.takes == (8, 16)
    source = EpochSource(pipe, end_epoch=1)
    batches = _epoch(source)
    source.close()
    seen = {0: [], 1: []}
    for b in batches:
        for k, (part, sid) in enumerate(zip(b["source"].tolist(), b["sample_id"].tolist(), strict=True)):
            seen[part].append(sid)
            if part == 0:
                assert b["caption"][k] == f"item {sid}" and b["txt"][k] is None
            else:
                assert b["txt"][k] == f"caption {sid}" and b["caption"][k] is None
    assert len(seen[0]) == 8 == len(set(seen[0])) and len(seen[1]) == 16 == len(set(seen[1]))
    assert sorted(int(t) for b in batches for t in b["take"]) == list(range(24))
