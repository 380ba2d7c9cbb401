"""An elastic rank (``ExecutionConfig(backend="nodes", elastic=True)``): its width follows its consumer's
demand (``raypipe.pipeline.elastic``), and what the cluster lacks is pending demand an autoscaler acts
on. Observations with a clock of the test's; then on Ray's fake autoscaling cluster, a trainer of set
step times: fed by one node, it never holds more; consuming faster than one node makes, the group
grows; slow again, the nodes go within the idle timeout; every epoch's ids and pixels are the local
path's."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline.controller import ControllerPolicy, WidthBounds
from raypipe.pipeline.elastic import ElasticWidth, bounds_for, start_width

log = logging.getLogger(__name__)


class _Workers:
    """A resizable pool whose workers all run at once (arrive at once)."""

    def __init__(self, width: int):
        self.width = width
        self.sets: list[int] = []

    def set_width(self, width: int) -> None:
        self.width = width
        self.sets.append(width)

    def ready_workers(self) -> int:
        return self.width


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _feed(
    elastic: ElasticWidth, clock: _Clock, *, seconds: float, chunk_s: float, wait_share: float, ready: int, running: int
) -> None:
    """``seconds`` of chunks handed out every ``chunk_s``, the consumer blocked ``wait_share`` of it."""
    end = clock.now + seconds
    while clock.now < end:
        elastic.waited(chunk_s * wait_share)
        clock.now += chunk_s
        elastic.note(images=16, running=running, ready=ready)


def test_a_waiting_consumer_with_busy_workers_widens_and_a_fed_one_narrows_again():
    clock, workers = _Clock(), _Workers(1)
    elastic = ElasticWidth(workers, WidthBounds(floor=1, ceiling=8), ControllerPolicy(), tick_s=3.0, clock=clock)
    _feed(elastic, clock, seconds=20, chunk_s=0.5, wait_share=0.5, ready=0, running=1)  # the demand: twice
    assert workers.width >= 2 and workers.sets[0] >= 2  # grew, from the observations alone
    grown = workers.width
    _feed(elastic, clock, seconds=60, chunk_s=0.5, wait_share=0.0, ready=3, running=0)  # idle, chunks ready
    assert workers.width < grown and workers.width == 1
    assert [why for *_, why in elastic.history if "->" in why]  # each change says why


def test_a_fed_consumer_never_widens():
    clock, workers = _Clock(), _Workers(1)
    elastic = ElasticWidth(workers, WidthBounds(floor=1, ceiling=8), ControllerPolicy(), tick_s=3.0, clock=clock)
    _feed(elastic, clock, seconds=120, chunk_s=0.5, wait_share=0.0, ready=2, running=1)
    assert workers.sets == [] and workers.width == 1


def test_bounds_and_the_start_width_come_from_the_config():
    ex = ExecutionConfig(backend="nodes", elastic=True, cpus_per_task=1.0, min_cpus=2, max_cpus=5)
    bounds = bounds_for(ex)
    assert (bounds.floor, bounds.ceiling) == (2, 5)
    assert start_width(0, bounds) == 2  # no node yet: the floor, no more
    assert start_width(3, bounds) == 3 and start_width(9, bounds) == 5


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"elastic": True}, "elastic"),  # backend auto
        ({"elastic": True, "backend": "nodes", "num_tasks": 2}, "elastic"),
        ({"backend": "nodes", "min_cpus": 0}, "min_cpus"),
        ({"backend": "nodes", "min_cpus": 4, "max_cpus": 2}, "min_cpus"),
        ({"backend": "nodes", "elastic": "yes"}, "elastic"),
    ],
)
def test_bad_elastic_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}="):
        ExecutionConfig(**kwargs)


# -- on Ray's fake autoscaling cluster ------------------------------------------------------------------

IDLE_S = 5.0  # the CPU nodes' idle timeout
SLACK_S = 30.0  # what the autoscaler may take beyond it


def _run(data, execution: ExecutionConfig, phases, cluster) -> tuple[list, dict]:
    """Epochs of one rank, the trainer's step time per phase: ``phases`` is a list of (name, step seconds,
    until), ``until(cluster, seconds in the phase)`` ending it (checked about twice a second)."""
    from raypipe.pipeline import EpochSource, Pipeline

    pipe = Pipeline(
        str(data), TrainAugment(input_size=128), config=PipelineConfig(batch_size=16, seed=7), execution=execution
    )
    source = EpochSource(pipe)
    out, seen = [], {}
    epoch = 0
    phases = list(phases)
    name, step, until = phases.pop(0)
    began = checked = time.monotonic()
    while True:
        source.set_epoch(epoch)
        for batch in source:
            out.append((epoch, batch["sample_id"].copy(), batch["image"].copy()))
            time.sleep(step)
            now = time.monotonic()
            if now - checked < 0.5:
                continue
            checked = now
            if until(cluster, now - began):
                seen[name] = (now - began, cluster.most_workers_seen)
                if not phases:
                    source.close()
                    return [o for o in out if o[0] < epoch], seen  # whole epochs only
                name, step, until = phases.pop(0)
                began = now
        epoch += 1


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from raypipe.sample_data import write_sample_data

    out = tmp_path_factory.mktemp("photos")
    write_sample_data(out, classes=4, per_class=24, seed=4)
    return out


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.isolated(env={"RAY_AUTH_MODE": "token", "RAYPIPE_NODE_WORKERS_HOST": "127.0.0.1"})
@pytest.mark.timeout(420)
def test_the_cluster_follows_an_elastic_ranks_demand_and_its_epochs_are_exact(photos):
    from raypipe.testing.autoscaler import PREPROCESS, FakeAutoscalingCluster
    from raypipe.workers.node import NodeWorkers

    # the default backend: on a cluster joined, node workers whose width follows the trainer
    execution = ExecutionConfig(resources={PREPROCESS: 0.001}, chunk_rows=16, max_cpus=3)
    with FakeAutoscalingCluster(head_cpus=1, worker_cpus=1, max_workers=3, idle_timeout_s=IDLE_S) as cluster:
        cluster.connect()
        os.environ["RAY_ADDRESS"] = cluster.address  # joined, as `ray job submit` tells a job (a process of its own)
        started = time.monotonic()
        try:
            elastic, seen = _run(
                photos,
                execution,
                [
                    # fed by one node (a slow step): the group never holds more, start-up included
                    ("fed", 0.3, lambda c, s: c.alive_workers() >= 2 or s > 30),
                    # no step: faster than one node makes, so the trainer waits and the group grows
                    ("starved", 0.0, lambda c, s: c.alive_workers() >= 2 or s > 150),
                    # slow again: the width narrows and the surplus nodes go
                    ("fed again", 0.3, lambda c, s: c.alive_workers() <= 1 or s > 3 * 6 + 6 + IDLE_S + SLACK_S),
                ],
                cluster,
            )
            assert NodeWorkers._shared is not None and NodeWorkers._shared.elastic
        finally:
            NodeWorkers.shutdown_shared()
        timeline = ", ".join(f"{t - started:.1f}s:{n}" for t, n in cluster.timeline)
        log.info("elastic: phases %s; CPU nodes over time: %s", seen, timeline)
    assert seen["fed"][1] == 1, timeline  # one node fed it, and no more was asked for
    assert seen["starved"][1] >= 2, timeline  # the waiting trainer grew the group
    assert cluster.timeline[-1][1] <= 1, timeline  # and the surplus went once it was fed again
    local = _local_epochs(photos, elastic[-1][0] + 1)
    assert len(local) == len(elastic) > 0
    for (ea, ia, xa), (eb, ib, xb) in zip(elastic, local, strict=True):
        assert ea == eb
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(xa, xb)


def _local_epochs(data, epochs: int) -> list:
    """The same epochs on local workers, without Ray: what a fixed-size run yields."""
    from raypipe.pipeline import EpochSource, Pipeline

    pipe = Pipeline(
        str(data),
        TrainAugment(input_size=128),
        config=PipelineConfig(batch_size=16, seed=7),
        execution=ExecutionConfig(backend="local", chunk_rows=16),
    )
    source = EpochSource(pipe, end_epoch=epochs)
    out = []
    for epoch in range(epochs):
        source.set_epoch(epoch)
        out += [(epoch, b["sample_id"].copy(), b["image"].copy()) for b in source]
    source.close()
    return out
