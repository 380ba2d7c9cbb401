"""A mixture through epochs on local workers: each epoch's takes exact, each part's rows taken once per
cycle across epochs, batches holding about the shares, the same on 1 and 2 ranks, and a mid-epoch
resume exact."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from image_factory import write_captioned_shards

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.sources import ListingOptions
from raypipe.sources.mixture import Mixture

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    write_captioned_shards(root / "big", n=14, per_shard=5)
    write_captioned_shards(root / "shards", n=9, per_shard=4)
    return str(root / "big"), str(root / "shards")


def _pipeline(parts, *, batch_size=5, spe=30, backend="local"):
    folder, shards = parts
    mixture = Mixture([(folder, 1), (shards, 2, ListingOptions(fields=("txt",)))], samples_per_epoch=spe)
    return Pipeline(
        mixture,
        TrainAugment(input_size=(16, 16)),
        config=PipelineConfig(batch_size=batch_size, seed=4),
        execution=ExecutionConfig(backend=backend, num_tasks=2, chunk_rows=4),
    )


def _takes(batches):
    return [(int(s), int(i)) for b in batches for s, i in zip(b["source"], b["sample_id"], strict=True)]


def test_each_epoch_takes_its_share_of_each_part_and_every_row_once_a_cycle(parts):
    pipe = _pipeline(parts)
    assert pipe.rows.takes == (10, 20) and pipe.rows.sizes == (14, 9)
    source = EpochSource(pipe, end_epoch=3)
    epochs = [[{k: (np.array(v) if k != "txt" else list(v)) for k, v in b.items()} for b in source] for _ in range(3)]
    source.close()
    streams = {0: [], 1: []}
    for batches in epochs:
        takes = _takes(batches)
        assert Counter(s for s, _ in takes) == {0: 10, 1: 20}
        for s, i in takes:
            streams[s].append(i)
        for b in batches:
            shard_rows = [k for k, s in enumerate(b["source"].tolist()) if s == 1]
            assert [b["txt"][k] for k in shard_rows] == [f"caption {b['sample_id'][k]}" for k in shard_rows]
    for s, size in ((0, 14), (1, 9)):
        for c in range(len(streams[s]) // size):
            assert sorted(streams[s][c * size : (c + 1) * size]) == list(range(size))
    for b in epochs[0][:-1]:  # every full batch holds about the shares (1:2 of 5 rows)
        assert 1 <= int((b["source"] == 0).sum()) <= 3


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_take_the_epoch_once_between_them(parts, world):
    one = EpochSource(_pipeline(parts), end_epoch=1)
    whole = Counter(_takes(list(one)))
    one.close()
    together = Counter()
    for rank in range(world):
        src = EpochSource(_pipeline(parts), rank=rank, world_size=world, end_epoch=1)
        together += Counter(_takes(list(src)))
        src.close()
    assert together == whole and sum(whole.values()) == 30


@pytest.mark.parametrize("new_world", [1, 3])
def test_two_ranks_resumed_on_another_number_take_the_rest_once(parts, new_world):
    """Takes, not ids: a row of a part taken twice in an epoch (a repeated cycle) is two takes."""
    whole = EpochSource(_pipeline(parts), end_epoch=1)
    want = sorted(int(t) for b in whole for t in b["take"])
    whole.close()
    before, states = [], []
    for rank in range(2):
        source = EpochSource(_pipeline(parts), rank=rank, world_size=2, end_epoch=1)
        it = iter(source)
        before += [int(t) for _ in range(2) for t in next(it)["take"]]
        states.append(json.loads(json.dumps(source.state_dict())))
        source.close()
    after = []
    for rank in range(new_world):
        source = EpochSource(_pipeline(parts), rank=rank, world_size=new_world, end_epoch=1)
        source.load_state_dict(states)
        after += [int(t) for b in source for t in b["take"]]
        source.close()
    assert len(before) == 20 and sorted(before + after) == want == list(range(30))


def test_a_mixture_resumes_mid_epoch_exactly(parts):
    whole = EpochSource(_pipeline(parts), end_epoch=1)
    want = [(b["source"].tolist(), b["sample_id"].tolist(), b["image"].tobytes()) for b in whole]
    whole.close()
    first = EpochSource(_pipeline(parts), end_epoch=1)
    it = iter(first)
    seen = [(b["source"].tolist(), b["sample_id"].tolist(), b["image"].tobytes()) for b in (next(it), next(it))]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    again = EpochSource(_pipeline(parts), end_epoch=1)
    again.load_state_dict(state)
    rest = [(b["source"].tolist(), b["sample_id"].tolist(), b["image"].tobytes()) for b in again]
    again.close()
    assert seen + rest == want


@pytest.mark.parametrize("backend", ["ray", "nodes"])
def test_a_mixture_on_ray_makes_the_local_workers_batches(ray_local, parts, backend, monkeypatch):
    from raypipe.pipeline import FeederSource
    from raypipe.workers.node import HOST_ENV, NodeWorkers

    monkeypatch.setenv(HOST_ENV, "127.0.0.1")
    local = EpochSource(_pipeline(parts), end_epoch=1)
    want = [(b["source"].tolist(), b["sample_id"].tolist(), b["image"].tobytes()) for b in local]
    local.close()
    pipe = _pipeline(parts, backend=backend)
    source = FeederSource(pipe, end_epoch=1) if backend == "ray" else EpochSource(pipe, end_epoch=1)
    try:
        got = [(b["source"].tolist(), b["sample_id"].tolist(), np.asarray(b["image"]).tobytes()) for b in source]
    finally:
        source.close()
        NodeWorkers.shutdown_shared()
    assert got == want


def test_a_width_that_changes_mid_epoch_changes_no_batch_of_a_mixture(parts, monkeypatch):
    """The stream's budget (its width and chunks in flight) asked anew as it goes, changing every time:
    the same batches as a steady run's."""
    import itertools

    from raypipe.pipeline.budget import RankBudget
    from raypipe.pipeline.stream import ChunkStream
    from raypipe.testing import InProcessWorkers

    monkeypatch.setattr("raypipe.pipeline.stream.BUDGET_REFRESH_S", 0.0)  # the budget asked anew every time

    asked = []

    def run(budgets) -> list:
        pipe = _pipeline(parts)
        cycle = itertools.cycle(budgets)

        def widths():
            asked.append(1)
            return next(cycle)

        def stream(span=None, *, segments=None, decision=None):
            return ChunkStream(
                pipe.columns(),
                pipe.plan(),
                pipe.stage_spec,
                widths,
                InProcessWorkers(),
                start_epoch=span.start_epoch,
                end_epoch=span.end_epoch,
                segments=segments,
            )

        pipe.stream = stream
        source = EpochSource(pipe, end_epoch=2)
        out = [
            [(b["source"].tolist(), b["sample_id"].tolist(), b["image"].tobytes()) for b in source] for _ in range(2)
        ]
        source.close()
        return out

    steady = run([RankBudget(workers=2, in_flight=4, cpus=2.0, task_cpus=1.0)])
    asked.clear()
    changing = run(
        [RankBudget(workers=w, in_flight=f, cpus=float(w), task_cpus=1.0) for w, f in ((1, 1), (3, 6), (2, 2), (1, 5))]
    )
    assert len(asked) > 4  # the budget was asked again and again: the width changed mid-epoch
    assert changing == steady


def test_a_parquet_part_is_read_in_chunks_of_a_window_and_its_epochs_stay_exact(parts, tmp_path):
    """A Parquet part's row groups are read whole: the mixture's chunks hold a window (as the part's
    alone do), so a window's rows spread over the epoch read each row group about once. The first
    window's ramp, the takes and a mid-epoch resume are those of any mixture."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from image_factory import captioned_jpeg

    from raypipe.plan.order import RankPlan

    table = pa.table({"image": [captioned_jpeg(i) for i in range(40)], "label": pa.array(range(40), pa.int64())})
    pq.write_table(table, tmp_path / "part.parquet", row_group_size=4)
    mixture = Mixture([(str(tmp_path / "part.parquet"), 1), (parts[1], 1)], samples_per_epoch=50)

    def pipeline():
        return Pipeline(
            mixture,
            TrainAugment(input_size=(16, 16)),
            config=PipelineConfig(batch_size=5, seed=4, shuffle_window=8),
            execution=ExecutionConfig(backend="local", num_tasks=2, chunk_rows=4),
        )

    plan = RankPlan.for_rows(pipeline().rows, seed=4, shuffle=True, chunk_rows=4, window_rows=8)
    assert plan.max_chunk_rows == 12 and max(hi - lo for lo, hi in plan.chunks(0).bounds) == 12
    folders = RankPlan.for_rows(_pipeline(parts).rows, seed=4, shuffle=True, chunk_rows=4, window_rows=8)
    assert folders.max_chunk_rows == 4  # parts read row by row: chunks of chunk_rows
    whole = EpochSource(pipeline(), end_epoch=1)
    want = [(b["take"].tolist(), b["source"].tolist(), b["sample_id"].tolist(), b["image"].tobytes()) for b in whole]
    whole.close()
    assert sorted(t for b in want for t in b[0]) == list(range(50))
    first = EpochSource(pipeline(), end_epoch=1)
    it = iter(first)
    seen = [next(it) for _ in range(3)]
    seen = [(b["take"].tolist(), b["source"].tolist(), b["sample_id"].tolist(), b["image"].tobytes()) for b in seen]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    again = EpochSource(pipeline(), end_epoch=1)
    again.load_state_dict(state)
    rest = [(b["take"].tolist(), b["source"].tolist(), b["sample_id"].tolist(), b["image"].tobytes()) for b in again]
    again.close()
    assert seen + rest == want
