"""A feeder on local worker processes: its batches reach the trainer as slabs of shared memory."""

import os
import socket
import time

import numpy as np
import psutil
import pytest
import ray
from test_feeder import assert_a_killed_feeder_is_a_clear_error

from raypipe import runtime
from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, FeederSource, Pipeline
from raypipe.pipeline.feeder import feeder_decision
from raypipe.workers.handover import HandoverError, SlabReceiver, SlabSender
from raypipe.workers.slabs import SlabPool

pytestmark = pytest.mark.timeout(240)

AUG = TrainAugment(input_size=32, color_jitter=None)
LOCAL = dict(backend="local", num_tasks=2)


def _epochs(source, n):
    return [[{k: np.array(v) for k, v in b.items()} for b in source] for _ in range(n)]


def _feeder(source, fn):
    return ray.get(source._actor.__ray_call__.remote(fn))


def _warm(feeder, timeout_s=120.0) -> int:
    """Epochs read until the feeder's worker processes are up (before, it makes chunks itself, which
    come as copies); the next epoch to read."""
    deadline, epoch = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        list(feeder)
        epoch += 1
        if _feeder(feeder, lambda self: self.source._stream is not None and self.source._stream.workers_set_up):
            return epoch
    raise AssertionError(f"the feeder's local workers were not up after {timeout_s:g} s ({epoch} epochs)")


def _same(want, got):
    assert [len(e) for e in want] == [len(e) for e in got]
    for we, ge in zip(want, got, strict=True):
        for w, g in zip(we, ge, strict=True):
            assert all(np.array_equal(w[k], g[k]) for k in ("image", "label", "sample_id"))


def test_batches_come_as_slabs_the_same_as_in_process_and_every_slab_is_released(ray_local, sample_dir):
    pipe = Pipeline(
        str(sample_dir), AUG, config=PipelineConfig(batch_size=16), execution=ExecutionConfig(chunk_rows=16, **LOCAL)
    )
    feeder, here = FeederSource(pipe), None
    try:
        assert feeder.runs_on_local_workers
        start = _warm(feeder)
        here = EpochSource(pipe, start_epoch=start, end_epoch=start + 3)
        before = feeder.zero_copy_batches
        slabs = _feeder(feeder, lambda self: self.source._stream._workers.slabs.made)
        want, got = _epochs(here, 3), _epochs(feeder, 3)
        # every chunk was made by a worker process: each batch came as its slab, with no copy
        assert feeder.zero_copy_batches - before == 9
        pids = _feeder(feeder, lambda self: [p.pid for p in psutil.Process().children()])
        assert pids and os.getpid() not in pids
        workers = [psutil.Process(p) for p in pids]
        # the trainer dropped its views: their tokens went back with its next requests, and the feeder
        # holds at most what it handed out in the last epoch's final requests
        assert _feeder(feeder, lambda self: self.sender.held) <= feeder.prefetch + 1
        made = _feeder(feeder, lambda self: self.source._stream._workers.slabs.made) - slabs
        assert made < 9  # not one slab made per batch: released slabs are written again
    finally:
        if here is not None:
            here.close()
        feeder.close()
    _same(want, got)
    assert [r.ids_sha256 for r in feeder.reports[-3:]] == [r.ids_sha256 for r in here.reports]
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive  # closing the feeder ended its worker processes


def test_views_and_packed_copies_mixed_come_out_as_in_process(ray_local, sample_dir):
    """12-row chunks, batches of 8: some batches are rows of one slab, the rest packed copies."""
    pipe = Pipeline(
        str(sample_dir), AUG, config=PipelineConfig(batch_size=8), execution=ExecutionConfig(chunk_rows=12, **LOCAL)
    )
    feeder, here = FeederSource(pipe), None
    try:
        start = _warm(feeder)
        here = EpochSource(pipe, start_epoch=start, end_epoch=start + 1)
        before = feeder.zero_copy_batches
        want, got = _epochs(here, 1), _epochs(feeder, 1)
    finally:
        if here is not None:
            here.close()
        feeder.close()
    _same(want, got)
    assert 0 < feeder.zero_copy_batches - before < len(got[0])


def test_a_batch_kept_by_the_trainer_stays_intact_while_the_feeder_goes_on(ray_local, sample_dir):
    pipe = Pipeline(
        str(sample_dir), AUG, config=PipelineConfig(batch_size=8), execution=ExecutionConfig(chunk_rows=8, **LOCAL)
    )
    feeder = FeederSource(pipe)
    try:
        start = _warm(feeder)
        before = feeder.zero_copy_batches
        kept = next(iter(feeder))  # the epoch stopped after one batch; its view is kept
        assert feeder.zero_copy_batches == before + 1  # a slab's rows
        copy = np.array(kept["image"])
        after = list(feeder)  # a whole epoch of slabs written meanwhile, none of them the kept one
        assert np.array_equal(kept["image"], copy)
        assert sorted(np.concatenate([b["sample_id"] for b in after]).tolist()) == list(range(48))
        assert feeder.last_report.epoch == start + 1 and feeder.last_report.emitted == 48
    finally:
        feeder.close()
    assert np.array_equal(kept["image"], copy)  # the mapping outlives the feeder


def test_a_killed_feeder_on_local_workers_is_a_clear_error(ray_local, sample_dir):
    pipe = Pipeline(
        str(sample_dir), AUG, config=PipelineConfig(batch_size=4), execution=ExecutionConfig(chunk_rows=16, **LOCAL)
    )
    assert_a_killed_feeder_is_a_clear_error(FeederSource(pipe, prefetch=1), before=_warm)


def test_auto_runs_local_workers_on_the_private_cluster_only(ray_local, sample_dir, monkeypatch):
    pipe = Pipeline(str(sample_dir), AUG)
    monkeypatch.setattr(runtime, "_PRIVATE_CLUSTER", False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert runtime.connection() == "own"
    assert feeder_decision(pipe, runtime.connection()).backend == "ray"  # a Ray this script started itself
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # as `ray job submit` tells a job
    # a cluster joined: the feeder decides on its node, where it asks whether the other nodes reach it
    assert runtime.connection() == "joined"
    assert feeder_decision(pipe, "joined") == pipe.decide(told="joined", needs_ray=True, probe=False)
    assert feeder_decision(pipe, "joined").backend == "nodes"
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(runtime, "_PRIVATE_CLUSTER", True)
    assert feeder_decision(pipe, runtime.connection()).backend == "local"
    assert pipe.execution.backend == "auto"  # the caller's pipeline is left as it is
    steered = Pipeline(str(sample_dir), AUG, execution=ExecutionConfig(resources={"preprocess": 1}))
    assert feeder_decision(steered, runtime.connection()).backend == "ray"
    chosen = Pipeline(str(sample_dir), AUG, execution=ExecutionConfig(backend="ray"))
    assert feeder_decision(chosen, runtime.connection()).backend == "ray"
    kept = Pipeline(str(sample_dir), AUG, execution=ExecutionConfig(backend="local"))
    assert feeder_decision(kept, "joined").backend == "local"


# the hand-over on its own, without Ray


def _pair(pool: SlabPool, nbytes: int):
    slab = pool.take(nbytes)
    images = pool.view(slab, (nbytes,))
    return slab, images


def test_handover_views_rows_skips_batches_never_taken_and_notes_releases(tmp_path):
    pool = SlabPool(str(tmp_path), keep=4)
    sender = SlabSender()
    receiver = SlabReceiver(sender.address(), timeout_s=10)
    assert sender.accept(timeout_s=10)
    assert not os.path.exists(sender.address()[0])  # the socket's file goes once connected
    chunks = []
    for value in (1, 2, 3):
        slab = pool.take(4 * 6)
        with open(f"/proc/self/fd/{slab.fd}", "r+b") as f:  # the worker's write, into the slab
            f.write(bytes(range(value * 24, value * 24 + 24)))
        chunks.append((slab, pool.view(slab, (4, 2, 3))))
    tokens = [sender.send(slab.fd, keep=images) for slab, images in chunks]
    assert sender.held == 3
    # the first token's batch was never taken (an epoch stopped early): skipped, and noted as released
    rows = receiver.view(tokens[1], 1, 3, (2, 3))
    assert np.array_equal(rows, chunks[1][1][1:3]) and not rows.flags.writeable
    assert receiver.take_released() == [tokens[0]]
    del rows
    assert receiver.take_released() == [tokens[1]]
    sender.release([tokens[0], tokens[1]])
    assert sender.held == 1
    with pytest.raises(HandoverError, match="expected"):
        receiver.view(tokens[1], 0, 1, (2, 3))  # the feeder is past it: out of step
    sender.close()
    with pytest.raises(HandoverError, match="closed"):
        receiver.view(99, 0, 1, (2, 3))
    receiver.close()
    pool.close()


def test_handover_refuses_a_connection_without_the_secret():
    sender = SlabSender()
    path, secret = sender.address()
    wrong = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    wrong.connect(path)
    wrong.sendall(bytes(len(secret)))
    assert not sender.accept(timeout_s=10)
    assert not sender.connected and not os.path.exists(path)
    wrong.close()
    sender.close()


def test_a_trainer_that_cannot_reach_the_feeders_socket_gets_its_batches_by_value(ray_local, sample_dir, monkeypatch):
    import raypipe.pipeline.feeder as feeder_module

    def unreachable(address, timeout_s):
        raise OSError("no such socket here")

    monkeypatch.setattr(feeder_module, "SlabReceiver", unreachable)
    pipe = Pipeline(
        str(sample_dir), AUG, config=PipelineConfig(batch_size=16), execution=ExecutionConfig(chunk_rows=16, **LOCAL)
    )
    feeder, here = FeederSource(pipe), None
    try:
        assert not feeder.runs_on_local_workers
        start = _warm(feeder)
        here = EpochSource(pipe, start_epoch=start, end_epoch=start + 1)
        want, got = _epochs(here, 1), _epochs(feeder, 1)
        assert _feeder(feeder, lambda self: self.sender is None and self.local)
    finally:
        if here is not None:
            here.close()
        feeder.close()
    _same(want, got)
    assert feeder.zero_copy_batches == 0  # every batch came by value
