"""The chunk stream, the packing and the accounting on in-process workers (``raypipe.testing.InProcessWorkers``):
the contracts of an epoch (every row once, exact batches, counted skips, stop, resume, a bug's own type)
checked without Ray or worker processes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from image_factory import truncated_jpeg

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import Pipeline
from raypipe.pipeline.budget import RankBudget
from raypipe.pipeline.epoch_source import EpochSource
from raypipe.pipeline.stream import ChunkStream
from raypipe.plan.span import RankSpan
from raypipe.testing import InProcessWorkers

AUG = TrainAugment(input_size=32, color_jitter=None)
BUDGET = RankBudget(workers=2, in_flight=4, cpus=2.0, task_cpus=1.0)


def _in_process(pipe: Pipeline, monkeypatch) -> InProcessWorkers:
    """Make ``pipe``'s streams run on one ``InProcessWorkers`` (returned) with a fixed budget, whatever the
    backend decision."""
    workers = InProcessWorkers()

    def stream(span: RankSpan | None = None, *, segments=None, decision=None) -> ChunkStream:
        span = span or RankSpan()
        return ChunkStream(
            pipe.columns(),
            pipe.plan(span.rank, span.world_size),
            pipe.stage_spec,
            lambda: BUDGET,
            workers,
            start_epoch=span.start_epoch,
            end_epoch=span.end_epoch,
            segments=segments,
        )

    monkeypatch.setattr(pipe, "stream", stream)
    return workers


def _pipe(data, **config) -> Pipeline:
    return Pipeline(
        data,
        AUG,
        config=PipelineConfig(**{"batch_size": 8, "seed": 3, **config}),
        execution=ExecutionConfig(backend="local", chunk_rows=5),
        content_digest=True,
    )


def _ids(batches) -> list[int]:
    return [int(i) for b in batches for i in b["sample_id"]]


def test_every_row_is_emitted_once_per_epoch_across_ranks_in_exact_batches(sample_dir, monkeypatch):
    rows = 48
    for world_size in (1, 2, 3):
        seen = []
        for rank in range(world_size):
            pipe = _pipe(sample_dir)
            _in_process(pipe, monkeypatch)
            source = EpochSource(pipe, rank=rank, world_size=world_size, end_epoch=2)
            for _ in range(2):
                batches = list(source)
                assert all(len(b["sample_id"]) == 8 for b in batches[:-1])
                assert all(b["image"].shape[1:] == (32, 32, 3) and b["image"].dtype == np.uint8 for b in batches)
                assert source.last_report.emitted == len(_ids(batches)) == len(set(_ids(batches)))
                seen.append(_ids(batches))
        first_epochs, second_epochs = seen[0::2], seen[1::2]
        for epoch in (first_epochs, second_epochs):
            assert sorted(i for ids in epoch for i in ids) == list(range(rows)), world_size
        assert first_epochs != second_epochs  # each epoch its own order


def test_the_batches_are_a_function_of_the_seed_whatever_the_window(sample_dir, monkeypatch):
    def epoch_of(in_flight: int) -> list[dict]:
        pipe = _pipe(sample_dir)
        workers = _in_process(pipe, monkeypatch)
        monkeypatch.setattr(
            f"{__name__}.BUDGET", RankBudget(workers=1, in_flight=in_flight, cpus=1.0, task_cpus=1.0), raising=True
        )
        batches = [{k: v.copy() for k, v in b.items()} for b in EpochSource(pipe, end_epoch=1)]
        assert workers.submitted == len(range(0, 48, 5))
        return batches

    one, six = epoch_of(1), epoch_of(6)
    assert _ids(one) == _ids(six)
    for a, b in zip(one, six, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])


def test_a_bad_image_is_a_counted_skip_and_the_others_are_emitted(sample_dir, tmp_path, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(sample_dir, data)
    bad = sorted(p for p in data.rglob("*.jpg"))[5]
    bad.write_bytes(truncated_jpeg())
    pipe = _pipe(data, max_skip_ratio=0.5)
    _in_process(pipe, monkeypatch)
    source = EpochSource(pipe, end_epoch=1)
    ids = _ids(list(source))
    report = source.last_report
    assert report.emitted == len(ids) == 47
    assert report.num_skipped == 1 and len(report.skipped_paths) == 1
    (skip,) = report.skipped_paths
    assert skip["path"].endswith(bad.name) and skip["reason"]
    assert report.skipped == {skip["reason"]: 1}
    assert sorted(ids + [skip["sample_id"]]) == list(range(48))


def test_stopping_part_way_cancels_the_chunks_in_flight_and_the_next_epoch_starts_fresh(sample_dir, monkeypatch):
    pipe = _pipe(sample_dir)
    workers = _in_process(pipe, monkeypatch)
    source = EpochSource(pipe, end_epoch=2)
    it = iter(source)
    next(it)
    it.close()  # the consumer stops after one batch
    assert workers.cancelled, "the chunks submitted ahead were not dropped"
    batches = list(source)  # epoch 1, whole
    assert source.last_report.epoch == 1
    assert sorted(_ids(batches)) == list(range(48))


def test_a_position_saved_mid_epoch_resumes_with_the_exact_batches(sample_dir, monkeypatch):
    pipe = _pipe(sample_dir)
    _in_process(pipe, monkeypatch)
    whole = [{k: v.copy() for k, v in b.items()} for b in EpochSource(pipe, end_epoch=1)]

    source = EpochSource(pipe, end_epoch=1)
    it = iter(source)
    for _ in range(2):
        next(it)
    state = source.state_dict()
    it.close()

    resumed = EpochSource(_pipe(sample_dir), end_epoch=1)
    _in_process(resumed.pipeline, monkeypatch)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert _ids(rest) == _ids(whole[2:])
    for a, b in zip(rest, whole[2:], strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])


def test_an_exception_of_ours_fails_the_epoch_with_its_own_type(sample_dir, monkeypatch):
    from raypipe.kernels import transform

    def broken(self, *args, **kwargs):
        raise TypeError("a bug in the transform")

    pipe = _pipe(sample_dir)
    _in_process(pipe, monkeypatch)
    monkeypatch.setattr(transform.TrainTransform, "__call__", broken)
    with pytest.raises(TypeError, match="a bug in the transform"):
        list(EpochSource(pipe, end_epoch=1))
