"""Mid-epoch resume: a rank's position saved after any batch and loaded into a new source goes on with the
batches an uninterrupted run yields (same ids, same pixels), on the same number of ranks; given every
rank's state, on another number, every image of the epoch is still read once."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.plan.order import rank_slice
from raypipe.plan.position import StateMismatchError, _split, remaining_after

pytestmark = pytest.mark.timeout(300)

AUG = TrainAugment(input_size=(32, 32))
LOCAL = ExecutionConfig(backend="local", chunk_rows=7, num_tasks=2)
BAD = 3  # corrupt files in the dataset: skipped rows inside the epoch


@pytest.fixture(scope="module")
def data(sample_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("resume") / "data"
    shutil.copytree(sample_dir, out)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    for p in files[5 : 5 + 7 * BAD : 7]:
        p.write_bytes(b"not an image")
    return out


def pipeline(data, *, seed=0, batch_size=5, chunk_rows=7):
    execution = ExecutionConfig(backend="local", chunk_rows=chunk_rows, num_tasks=2)
    return Pipeline(
        str(data), AUG, config=PipelineConfig(batch_size=batch_size, seed=seed, max_skip_ratio=0.5), execution=execution
    )


def digest(batch) -> tuple[list[int], str]:
    return batch["sample_id"].tolist(), hashlib.sha256(np.ascontiguousarray(batch["image"]).tobytes()).hexdigest()


def epochs(source, count):
    return [[digest(b) for b in source] for _ in range(count)]


def test_a_source_resumed_after_k_batches_goes_on_as_an_uninterrupted_one(data):
    whole = EpochSource(pipeline(data), end_epoch=2)
    want = epochs(whole, 2)
    whole.close()
    for k in (0, 1, 4, len(want[0]) - 1):
        first = EpochSource(pipeline(data), end_epoch=2)
        it = iter(first)
        seen = [digest(next(it)) for _ in range(k)]
        state = json.loads(json.dumps(first.state_dict()))  # it travels as JSON
        first.close()
        again = EpochSource(pipeline(data), end_epoch=2)  # built from scratch
        again.load_state_dict(state)
        rest = [digest(b) for b in again]
        assert seen + rest == want[0], k
        assert [digest(b) for b in again] == want[1]  # and the next epoch as before
        again.close()
        report = again.reports[0]
        assert report.emitted + report.num_skipped == report.expected  # the resumed part, all accounted


def test_a_position_saved_after_a_resume_resumes_again(data):
    whole = EpochSource(pipeline(data), end_epoch=1)
    want = epochs(whole, 1)[0]
    whole.close()
    first = EpochSource(pipeline(data), end_epoch=1)
    it = iter(first)
    seen = [digest(next(it)) for _ in range(2)]
    state = first.state_dict()
    first.close()
    again = EpochSource(pipeline(data), end_epoch=1)
    again.load_state_dict(state)
    assert again.state_dict()["batches"] == 2  # loaded, not yet read: the same position
    it = iter(again)
    seen += [digest(next(it)) for _ in range(3)]
    later = again.state_dict()
    assert later["batches"] == 5 and again.state_dict(batches=4)["batches"] == 4  # counted on from the state's
    again.close()
    third = EpochSource(pipeline(data), end_epoch=1)
    third.load_state_dict(later)
    assert seen + [digest(b) for b in third] == want
    third.close()


def test_a_consumer_that_read_ahead_saves_the_position_of_what_it_used(data):
    whole = EpochSource(pipeline(data), end_epoch=1)
    want = epochs(whole, 1)[0]
    whole.close()
    ahead = EpochSource(pipeline(data), end_epoch=1)
    it = iter(ahead)
    for _ in range(5):
        next(it)
    state = ahead.state_dict(batches=2)  # e.g. a DeviceLoader two batches behind its source
    assert state["batches"] == 2
    ahead.close()
    again = EpochSource(pipeline(data), end_epoch=1)
    again.load_state_dict(state)
    assert want[:2] + [digest(b) for b in again] == want
    again.close()


def test_the_position_after_an_epochs_last_batch_is_its_end(data):
    """A consumer that took the epoch's last batch but has not seen the epoch end (a checkpoint at a
    rank's last step) resumes in that epoch, with nothing left of it, then the next epoch."""
    whole = EpochSource(pipeline(data), end_epoch=2)
    want = epochs(whole, 2)
    whole.close()
    n = len(want[0])
    first = EpochSource(pipeline(data), end_epoch=2)
    it = iter(first)
    seen = [digest(next(it)) for _ in range(n)]
    assert seen == want[0]
    before_end = first.state_dict()
    assert list(it) == []  # the source ends its epoch (a producer that ran ahead)
    after_end = first.state_dict(batches=n)
    first.close()
    for state in (before_end, after_end):
        assert (state["epoch"], state["batches"], state["remaining"]) == (0, n, [])
        again = EpochSource(pipeline(data), end_epoch=2)
        again.load_state_dict(state)
        assert [digest(b) for b in again] == []
        assert again.last_report.expected == again.last_report.emitted == 0
        assert [digest(b) for b in again] == want[1]
        again.close()


def test_a_finished_epoch_resumes_at_the_next_one(data):
    source = EpochSource(pipeline(data), end_epoch=2)
    first = [digest(b) for b in source]
    state = source.state_dict()
    assert state["epoch"] == 1 and state["batches"] == 0
    second = [digest(b) for b in source]
    source.close()
    again = EpochSource(pipeline(data), end_epoch=2)
    again.load_state_dict(state)
    assert [digest(b) for b in again] == second and first != second
    again.close()


@pytest.mark.parametrize("new_world", [1, 3])
def test_two_ranks_resumed_on_another_number_read_the_rest_once(data, new_world):
    old_world, k = 2, 2
    before, states = [], []
    for rank in range(old_world):
        source = EpochSource(pipeline(data), rank=rank, world_size=old_world, end_epoch=1)
        it = iter(source)
        before += [i for _ in range(k) for i in next(it)["sample_id"].tolist()]
        states.append(source.state_dict())
        source.close()
    after, counts, sizes = [], [], []
    for rank in range(new_world):
        source = EpochSource(pipeline(data), rank=rank, world_size=new_world, end_epoch=1)
        source.load_state_dict(states)
        batches = [b["sample_id"].tolist() for b in source]
        after += [i for b in batches for i in b]
        counts.append(len(batches))
        sizes.append(source.reports[0].expected)
        assert all(len(b) == 5 for b in batches[:-1])  # full batches, a partial last one at most
        source.close()
    skipped = 48 - len(set(before) | set(after))
    assert len(before) + len(after) == len(set(before + after)) == 48 - skipped  # nothing twice
    assert skipped == BAD  # nothing lost: every good image once
    assert max(sizes) - min(sizes) <= 1 and max(counts) - min(counts) <= 1  # an even split, as a fresh epoch's


def test_a_state_of_another_plan_is_refused_with_what_differs(data, tmp_path):
    source = EpochSource(pipeline(data), end_epoch=1)
    next(iter(source))
    state = source.state_dict()
    source.close()
    for other, what in ((pipeline(data, seed=1), "seed"), (pipeline(data, batch_size=4), "batch_size")):
        with pytest.raises(StateMismatchError, match=what):
            EpochSource(other).load_state_dict(state)
    fewer = tmp_path / "fewer"
    shutil.copytree(data, fewer)
    next(p for p in sorted(fewer.rglob("*.jpg"))).unlink()
    with pytest.raises(StateMismatchError, match="listing digest"):
        EpochSource(pipeline(fewer)).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="rank 0 of 1"):
        EpochSource(pipeline(data), rank=1, world_size=2).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="not a raypipe position"):
        EpochSource(pipeline(data)).load_state_dict({"epoch": 0})
    # the chunk size does not shape the batches: a state resumes under another one
    again = EpochSource(pipeline(data, chunk_rows=11), end_epoch=1)
    again.load_state_dict(state)
    assert sum(len(b["sample_id"]) for b in again) > 0
    again.close()


def test_remaining_ranges_and_the_even_split_of_what_is_left():
    assert remaining_after([(0, 10), (20, 30)], 5) == ((5, 10), (20, 30))
    assert remaining_after([(0, 10), (20, 30)], 10) == ((20, 30),)
    assert remaining_after([(0, 10), (20, 30)], 30) == ()
    ranges = [(3, 10), (12, 20), (25, 26)]
    for world in (1, 2, 3, 5, 16):
        parts = [_split(ranges, r, world) for r in range(world)]
        flat = [i for part in parts for lo, hi in part for i in range(lo, hi)]
        assert flat == [i for lo, hi in ranges for i in range(lo, hi)]  # in order, each position once
        lengths = [sum(hi - lo for lo, hi in part) for part in parts]
        assert lengths == [len(range(*rank_slice(16, r, world).indices(16))) for r in range(world)]


def out_digest(batch) -> tuple[list[int], str]:
    """A DeviceLoader batch: its ids and its normalised, erased, mixed pixels and targets."""
    h = hashlib.sha256(batch["image"].float().numpy().tobytes())
    h.update(batch["label"].float().numpy().tobytes())
    return batch["sample_id"].tolist(), h.hexdigest()


def device_loader(data):
    from raypipe.device import from_timm_args

    source = EpochSource(pipeline(data), end_epoch=2)
    return from_timm_args(
        source,
        device="cpu",
        re_prob=0.5,
        re_mode="pixel",
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        num_classes=4,
        seed=3,
        prefetch=3,
    )


def test_a_device_loader_resumes_its_batches_and_its_draws(data):
    with device_loader(data) as whole:
        want = [[out_digest(b) for b in whole] for _ in range(2)]
    for k in (1, 3):
        with device_loader(data) as first:
            it = iter(first)
            seen = [out_digest(next(it)) for _ in range(k)]  # its producer has made batches ahead
            state = json.loads(json.dumps(first.state_dict()))
        assert state["format"] == "raypipe-position" and state["batches"] == k  # the trainer's count, one value
        with device_loader(data) as again:
            again.load_state_dict(state)
            assert seen + [out_digest(b) for b in again] == want[0], k
            assert [out_digest(b) for b in again] == want[1]
    # saved again after a resume (a second checkpoint in the epoch): the batches and draws go on as before
    with device_loader(data) as first:
        first.load_state_dict(state)
        it = iter(first)
        seen = [out_digest(next(it)) for _ in range(2)]
        later = json.loads(json.dumps(first.state_dict()))
    assert later["batches"] == 3 + 2
    with device_loader(data) as again:
        again.load_state_dict(later)
        assert want[0][:3] + seen + [out_digest(b) for b in again] == want[0]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.needs_cuda
def test_a_cuda_device_loader_resumes_its_batches_and_its_draws(data):
    from raypipe.device import from_timm_args

    def make():
        return from_timm_args(
            EpochSource(pipeline(data), end_epoch=1),
            device="cuda",
            re_prob=0.5,
            re_mode="pixel",
            mixup_alpha=0.8,
            num_classes=4,
            seed=3,
        )

    def dig(b):
        return b["sample_id"].tolist(), hashlib.sha256(b["image"].float().cpu().numpy().tobytes()).hexdigest()

    with make() as whole:
        want = [dig(b) for b in whole]
    with make() as first:
        it = iter(first)
        seen = [dig(next(it)) for _ in range(2)]
        state = first.state_dict()
    with make() as again:
        again.load_state_dict(state)
        assert seen + [dig(b) for b in again] == want


def test_timms_create_loader_resumes_mid_epoch_with_its_batch_count(sample_dir):
    import torch

    from raypipe.timm import create_loader

    def make(rank=0, world=1):
        return create_loader(
            str(sample_dir),
            input_size=32,
            batch_size=4,
            is_training=True,
            device=torch.device("cpu"),
            re_prob=0.25,
            seed=1,
            rank=rank,
            world_size=world,
            yield_ids=True,
            execution=LOCAL,
        )

    def dig(item):
        x, y, ids = item
        return ids.tolist(), hashlib.sha256(x.numpy().tobytes()).hexdigest()

    with make() as whole:
        want = [dig(b) for b in whole]
        assert len(want) == len(whole)
    with make() as first:
        it = iter(first)
        seen = [dig(next(it)) for _ in range(3)]
        state = first.state_dict()
    with make() as again:
        again.load_state_dict(state)
        rest = [dig(b) for b in again]
    assert seen + rest == want  # the batches timm's loop counts: len(loader) in all
    states, before = [], []
    for rank in range(2):  # two ranks stop after 2 batches; the run goes on as one rank
        with make(rank, 2) as loader:
            it = iter(loader)
            before += [i for _ in range(2) for i in dig(next(it))[0]]
            states.append(loader.state_dict())
    with make(0, 1) as alone:
        alone.load_state_dict(states)
        rest = [dig(b) for b in alone]
    after = [i for ids, _ in rest for i in ids]
    assert len(rest) == (48 - 2 * 2 * 4) // 4 and all(len(ids) == 4 for ids, _ in rest)
    assert sorted(before + after) == list(range(48))  # the epoch's images once, across the interruption


def test_a_feeder_source_resumes_mid_epoch(data, ray_local):
    from raypipe.pipeline import FeederSource

    execution = ExecutionConfig(chunk_rows=7, num_tasks=1)
    pipe = lambda: Pipeline(
        str(data),
        AUG,
        config=PipelineConfig(batch_size=5, max_skip_ratio=0.5),  # noqa: E731
        execution=execution,
    )
    whole = FeederSource(pipe(), end_epoch=1)
    want = [digest(b) for b in whole]
    whole.close()
    first = FeederSource(pipe(), end_epoch=1)
    it = iter(first)
    seen = [digest(next(it)) for _ in range(3)]  # the feeder made batches ahead of these
    state = first.state_dict()
    it.close()
    first.close()
    assert state["batches"] == 3
    again = FeederSource(pipe(), end_epoch=1)
    again.load_state_dict(state)
    it = iter(again)
    seen += [digest(next(it)) for _ in range(2)]
    later = again.state_dict()  # counted on from the loaded state's batches
    assert later["batches"] == 5
    it.close()
    again.close()
    third = FeederSource(pipe(), end_epoch=1)
    third.load_state_dict(later)
    assert seen + [digest(b) for b in third] == want
    third.close()
