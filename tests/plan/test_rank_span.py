"""``RankSpan``: each bad field refused by name, and a source given the value runs the batches its
keywords run (local worker processes: no Ray)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import raypipe
from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, FeederSource, Pipeline
from raypipe.plan import RankSpan
from raypipe.workers.local import LocalWorkers

pytestmark = pytest.mark.timeout(240)

AUG = TrainAugment(input_size=(16, 16))
LOCAL = ExecutionConfig(backend="local", chunk_rows=7, num_tasks=1)


@pytest.mark.parametrize(
    ("field", "value", "others"),
    [
        ("world_size", 0, {}),
        ("world_size", 2.0, {}),
        ("rank", -1, {}),
        ("rank", 2, {"world_size": 2}),
        ("rank", True, {}),
        ("start_epoch", -1, {}),
        ("start_epoch", "0", {}),
        ("end_epoch", -2, {}),
        ("end_epoch", 1.5, {}),
        ("reserved_cpus", -0.5, {}),
        ("reserved_cpus", float("inf"), {}),
        ("reserved_cpus", "1", {}),
    ],
)
def test_each_bad_field_is_a_value_error_naming_it(field, value, others):
    with pytest.raises(ValueError, match=rf"^{field}="):
        RankSpan(**{field: value, **others})


def test_good_values_are_kept_and_numpy_ints_become_ints():
    span = RankSpan(rank=np.int64(1), world_size=np.int32(3), start_epoch=2, end_epoch=2, reserved_cpus=np.float32(1.5))
    assert (span.rank, span.world_size, span.start_epoch, span.end_epoch) == (1, 3, 2, 2)
    assert all(type(v) is int for v in (span.rank, span.world_size, span.start_epoch, span.end_epoch))
    assert RankSpan() == RankSpan(rank=0, world_size=1, start_epoch=0, end_epoch=None, reserved_cpus=0.0)
    with pytest.raises(TypeError):
        RankSpan(0, 1)  # keyword-only
    assert "RankSpan" in raypipe.__all__ and raypipe.RankSpan is RankSpan


def test_the_value_and_keywords_together_are_refused():
    given = RankSpan(rank=1, world_size=2)
    assert RankSpan.of(given) is given and RankSpan.of(None, rank=1, world_size=2) == given
    with pytest.raises(ValueError, match="not both"):
        RankSpan.of(given, end_epoch=3)
    with pytest.raises(ValueError, match="^span="):
        RankSpan.of({"rank": 1})


def test_sources_refuse_both_forms_before_starting_anything(sample_dir):
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=5), execution=LOCAL)
    for cls in (EpochSource, FeederSource):
        with pytest.raises(ValueError, match="not both"):
            cls(pipe, span=RankSpan(), rank=0)
    with pytest.raises(ValueError, match="^rank="):
        EpochSource(pipe, rank=3, world_size=2)


def _run(source) -> list[list[tuple[list[int], str]]]:
    try:
        return [
            [(b["sample_id"].tolist(), hashlib.sha256(b["image"].tobytes()).hexdigest()) for b in source]
            for _ in range(2)
        ]
    finally:
        source.close()


def test_a_source_given_the_value_runs_the_batches_of_its_keywords(sample_dir):
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=5, seed=3), execution=LOCAL)
    keywords = dict(rank=1, world_size=2, start_epoch=1, end_epoch=3, reserved_cpus=0.5)
    try:
        old = _run(EpochSource(pipe, **keywords))
        source = EpochSource(pipe, span=RankSpan(**keywords))
        assert source.span == RankSpan(**keywords) and (source.rank, source.world_size) == (1, 2)
        assert _run(source) == old
        assert [r.epoch for r in source.reports] == [1, 2]  # from start_epoch
        with pytest.raises(ValueError, match="past end_epoch=3"):
            iter(source)
        rank0 = _run(EpochSource(pipe, span=RankSpan(world_size=2, start_epoch=1, end_epoch=3)))
    finally:
        LocalWorkers.shutdown_shared()
    for one, zero in zip(old, rank0, strict=True):  # each epoch: the two ranks' halves make the whole
        ids = [i for ids, _ in one + zero for i in ids]
        assert sorted(ids) == list(range(48)) and len([i for ids, _ in one for i in ids]) == 24
    assert old[0] != old[1]  # two epochs, two orders
