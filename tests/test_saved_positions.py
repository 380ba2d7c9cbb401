"""Positions that raypipe 0.1.0 saved (tests/fixtures, written by that release) keep loading, with the
exact batches: a mid-epoch checkpoint of ``jobs/train.py --checkpoint-steps`` (a ``DeviceLoader`` over
an ``EpochSource`` per rank) and ``RankLoader``'s states (with ``EqualBatches`` between them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import tiny_dataset, tiny_job

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.device import from_timm_args
from raypipe.integrations.loader import RankLoader
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.sample_data import write_sample_data
from raypipe.train.data import job_rows
from raypipe.train.resume import resume_point

pytestmark = pytest.mark.timeout(300)

FIXTURES = Path(__file__).parent / "fixtures"
JOB = json.loads((FIXTURES / "train_job_checkpoint_v0.1.0.json").read_text())
RANK = json.loads((FIXTURES / "rank_loader_positions_v0.1.0.json").read_text())


def ids_of(loader) -> list[list[int]]:
    return [b["sample_id"].tolist() for b in loader]


@pytest.fixture(scope="module")
def job_pipeline(tmp_path_factory):
    """The training split of the job that wrote the checkpoint, on the same generated data."""
    root = tmp_path_factory.mktemp("job")
    data = tiny_dataset(root / "data", **JOB["data"])
    job = tiny_job(data, root / "runs", "fixture", *JOB["job_args"])
    train_rows = job_rows(job)[0]
    execution = ExecutionConfig(backend="local", chunk_rows=16, num_tasks=2)  # the chunks shape no batch
    return lambda: Pipeline(train_rows, job.augment, config=job.pipeline, execution=execution, decode=job.decode)


def job_loader(pipeline, rank: int, world: int):
    """A rank's train loader as the job builds it: a DeviceLoader over an EpochSource."""
    source = EpochSource(pipeline, rank=rank, world_size=world, start_epoch=JOB["epoch"], end_epoch=JOB["epoch"] + 1)
    return from_timm_args(source, device="cpu", seed=pipeline.config.seed, rank=rank)


def test_a_train_job_checkpoint_of_0_1_0_resumes_with_its_exact_batches(job_pipeline):
    start = resume_point({"epoch": JOB["epoch"], "step": JOB["step"], "loaders": JOB["loaders"], "ids": JOB["ids"]})
    assert (start.epoch, start.step, start.mid_epoch) == (JOB["epoch"], JOB["step"], True)
    world, batch = 2, job_pipeline().config.batch_size
    trained = batch * JOB["step"]
    for rank in range(world):
        whole = JOB["epoch_ids"][rank]  # the uninterrupted run's ids of this rank in that epoch
        assert start.ids[rank] == whole[:trained]
        with job_loader(job_pipeline(), rank, world) as loader:
            loader.load_state_dict(start.loaders)  # every rank's position, as the job loads them
            batches = ids_of(loader)
        assert [i for b in batches for i in b] == whole[trained:], rank  # the rest, in order
        assert all(len(b) == batch for b in batches[:-1]) and 0 < len(batches[-1]) <= batch
    # a rank's bare source position (the inner part of the saved value) resumes its source alone
    bare = json.loads(JOB["loaders"])[1]["source"]
    source = EpochSource(job_pipeline(), rank=1, world_size=world, end_epoch=JOB["epoch"] + 1)
    source.load_state_dict(bare)
    assert [i for b in ids_of(source) for i in b] == JOB["epoch_ids"][1][trained:]
    source.close()


def test_a_train_job_checkpoint_of_0_1_0_resumes_on_one_rank_with_every_image_once(job_pipeline):
    with job_loader(job_pipeline(), 0, 1) as loader:
        loader.load_state_dict(json.loads(JOB["loaders"]))
        after = [i for b in ids_of(loader) for i in b]
        report = loader.source.last_report
    before = [i for ids in json.loads(JOB["ids"]) for i in ids]
    every = sorted(i for ids in JOB["epoch_ids"] for i in ids)
    assert sorted(before + after) == every  # what the two ranks trained before and this one after: once each
    assert report.emitted == len(after) and report.emitted + report.num_skipped == report.expected


@pytest.fixture(scope="module")
def rank_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("rank") / "data"
    spec = RANK["data"]
    write_sample_data(root, classes=spec["classes"], per_class=spec["per_class"], seed=spec["seed"])
    (root / spec["unreadable"]).write_bytes(b"not an image")
    return root


def rank_loader(data, rank: int, world: int) -> RankLoader:
    kw, ex = RANK["rank_loader"], RANK["execution"]
    config = PipelineConfig(batch_size=kw["batch_size"], drop_last=True, seed=kw["seed"],
                            max_skip_ratio=kw["max_skip_ratio"])  # fmt: skip
    pipe = Pipeline(str(data), TrainAugment(input_size=tuple(kw["input_size"])), config=config,
                    execution=ExecutionConfig(**ex))  # fmt: skip
    return RankLoader(pipe, training=True, rank=rank, world_size=world, yield_ids=True,
                      device_kwargs={"device": "cpu", "re_prob": kw["re_prob"]})  # fmt: skip


@pytest.mark.parametrize("case", RANK["cases"], ids=[c["name"] for c in RANK["cases"]])
def test_rank_loader_states_of_0_1_0_resume_with_their_exact_batches(rank_data, case):
    states, many = case["states"], isinstance(case["states"], list)
    epoch = (states[0] if many else states)["epoch"]
    for where, want in case["resumed"].items():
        rank, world = (int(x) for x in where.split("/")[:2])
        with rank_loader(rank_data, rank, world) as loader:
            loader.load_state_dict(states[rank] if where.endswith("/own") else states)
            got = [ids.tolist() for _, _, ids in loader]
        assert got == want, (case["name"], where)  # the batches 0.1.0 resumed from these states
        if world == case["world"]:  # on the same ranks: the uninterrupted epoch from where it stopped
            seen = case["seen"][rank] if many else case["seen"]
            assert seen + got == RANK["whole"][f"{rank}/{world}"][epoch], (case["name"], where)
