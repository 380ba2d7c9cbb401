"""Every loader stack saves one position value, and the positions that raypipe 0.1.0 saved (tests/fixtures,
written by that release) keep loading, with the exact batches: a mid-epoch checkpoint of ``jobs/train.py
--checkpoint-steps`` (a ``DeviceLoader`` over an ``EpochSource`` per rank) and ``RankLoader``'s states
(with ``EqualBatches`` between them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import tiny_dataset, tiny_job

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.device import DeviceLoader, from_timm_args
from raypipe.integrations.loader import RankLoader
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.sample_data import write_sample_data
from raypipe.train.data import job_rows
from raypipe.train.resume import resume_point

pytestmark = pytest.mark.timeout(300)

FIXTURES = Path(__file__).parents[1] / "fixtures"
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
    config = PipelineConfig(
        batch_size=kw["batch_size"], drop_last=True, seed=kw["seed"], max_skip_ratio=kw["max_skip_ratio"]
    )
    pipe = Pipeline(
        str(data), TrainAugment(input_size=tuple(kw["input_size"])), config=config, execution=ExecutionConfig(**ex)
    )
    return RankLoader(
        pipe,
        training=True,
        rank=rank,
        world_size=world,
        yield_ids=True,
        device_kwargs={"device": "cpu", "re_prob": kw["re_prob"]},
    )


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


def rank_pipeline(data) -> Pipeline:
    kw = RANK["rank_loader"]
    config = PipelineConfig(
        batch_size=kw["batch_size"], drop_last=True, seed=kw["seed"], max_skip_ratio=kw["max_skip_ratio"]
    )
    return Pipeline(
        str(data),
        TrainAugment(input_size=tuple(kw["input_size"])),
        config=config,
        execution=ExecutionConfig(**RANK["execution"]),
    )


def test_both_loader_stacks_save_one_value(rank_data):
    """A DeviceLoader over an EpochSource (the training job's stack) and a RankLoader (with EqualBatches
    between them) save the same value, which either loads."""
    whole = RANK["whole"]["0/1"][1]
    saved = {}
    with from_timm_args(EpochSource(rank_pipeline(rank_data)), device="cpu", seed=1, rank=0) as job_stack:
        job_stack.set_epoch(1)
        saved["between passes", "job"] = job_stack.state_dict()
        it = iter(job_stack)
        assert [next(it)["sample_id"].tolist() for _ in range(3)] == whole[:3]
        saved["after 3", "job"] = job_stack.state_dict()
    with rank_loader(rank_data, 0, 1) as timm_stack:
        timm_stack.set_epoch(1)
        saved["between passes", "timm"] = timm_stack.state_dict()
        it = iter(timm_stack)
        assert [next(it)[2].tolist() for _ in range(3)] == whole[:3]
        saved["after 3", "timm"] = timm_stack.state_dict()
    for when in ("between passes", "after 3"):
        job, timm = saved[when, "job"], saved[when, "timm"]
        assert job == timm, when  # one shape, one value
        assert set(job) == {"format", "version", "epoch", "rank", "world_size", "batches", "remaining", "plan"}
        assert (job["format"], job["version"], job["epoch"]) == ("raypipe-position", 2, 1)
    assert saved["after 3", "job"]["batches"] == 3
    with from_timm_args(EpochSource(rank_pipeline(rank_data)), device="cpu", seed=1, rank=0) as job_stack:
        job_stack.load_state_dict(saved["after 3", "timm"])
        assert whole[-1] == whole[-2]  # RankLoader repeats a batch to make up for the unreadable image
        assert [b["sample_id"].tolist() for b in job_stack] == whole[3:-1]
    with rank_loader(rank_data, 0, 1) as timm_stack:
        timm_stack.load_state_dict(saved["after 3", "job"])
        assert [ids.tolist() for _, _, ids in timm_stack] == whole[3:]


def test_a_rank_loader_position_saved_after_a_resume_resumes_again(rank_data):
    """A second checkpoint in a resumed epoch: the source counts on from the loaded position, so the
    position after 3 + 2 batches is the one an uninterrupted run has there."""
    whole = RANK["whole"]["0/1"][1]
    first = next(c for c in RANK["cases"] if c["world"] == 1)["states"]  # epoch 1 after 3 batches (0.1.0)
    with rank_loader(rank_data, 0, 1) as loader:
        loader.load_state_dict(first)
        it = iter(loader)
        seen = [next(it)[2].tolist() for _ in range(2)]
        later = json.loads(json.dumps(loader.state_dict()))
    assert later["batches"] == 5 and seen == whole[3:5]
    with rank_loader(rank_data, 0, 1) as loader:
        loader.load_state_dict(later)
        assert [ids.tolist() for _, _, ids in loader] == whole[5:]
    # the short rank, saved after its repeated batch: nothing left of the epoch, then the next one whole
    short = RANK["whole"]["1/2"]
    with rank_loader(rank_data, 1, 2) as loader:
        taken = [ids.tolist() for _, _, ids in loader]
        assert taken == short[0] and loader.batches.repeated_batches == 1
        end = loader.device_loader.state_dict()
    assert (end["epoch"], end["batches"]) == (1, 0)  # between passes: the next epoch from its start
    with rank_loader(rank_data, 1, 2) as loader:
        it = iter(loader)
        assert [next(it)[2].tolist() for _ in range(len(loader))] == short[0]
        after = loader.state_dict()
    assert (after["epoch"], after["batches"]) == (0, len(short[0]))
    with rank_loader(rank_data, 1, 2) as loader:
        loader.load_state_dict(after)
        assert [ids.tolist() for _, _, ids in loader] == []
        assert [ids.tolist() for _, _, ids in loader] == short[1]


def test_a_loaded_position_belongs_to_its_own_epoch(rank_data):
    first = next(c for c in RANK["cases"] if c["world"] == 1)["states"]  # epoch 1 after 3 batches
    with rank_loader(rank_data, 0, 1) as loader:
        loader.load_state_dict(first)
        loader.set_epoch(0)  # another epoch: from its start, every batch of it
        assert [ids.tolist() for _, _, ids in loader] == RANK["whole"]["0/1"][0]


def test_a_device_loader_starts_at_its_sources_epoch(rank_data):
    """The draws and the batches are of one epoch, so the position is one value, without set_epoch."""
    whole = RANK["whole"]["0/1"][1]
    with DeviceLoader(EpochSource(rank_pipeline(rank_data), start_epoch=1), device="cpu") as loader:
        assert loader.next_epoch == 1 and loader.state_dict()["epoch"] == 1
        it = iter(loader)
        assert [next(it)["sample_id"].tolist() for _ in range(2)] == whole[:2]
        state = loader.state_dict()
    with DeviceLoader(EpochSource(rank_pipeline(rank_data)), device="cpu") as loader:
        loader.load_state_dict(state)
        assert loader.next_epoch == 1 and [b["sample_id"].tolist() for b in loader] == whole[2:-1]
