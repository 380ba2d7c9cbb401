"""Each backend's workers and the budget they run to: what ``Pipeline.stream`` builds a rank's chunk stream
on once ``raypipe.pipeline.backend`` has decided which backend runs it.

- ``local_execution``: worker processes of this machine (``LocalWorkers``), sized once (``local_budget``).
- ``ray_execution``: Ray tasks (``RayTasks``), the rank's share of the cluster taken again as it changes
  (``ray_budget``).
- ``node_execution``: raypipe's worker processes on the cluster's nodes (``NodeWorkers``, one pool per
  placement in a process), their width fixed or following the consumer (``ElasticWidth``).

``pipeline`` is what the stream is made from (``raypipe.pipeline.pipeline.Pipeline``: its ``execution``,
``plan`` and ``batch_spec``), taken as it is, so that this module needs nothing of the class.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from raypipe import runtime
from raypipe.config import ExecutionConfig
from raypipe.pipeline.backend import Decision
from raypipe.pipeline.budget import (
    RankBudget,
    check_task_fits,
    eligible_resources,
    rank_budget,
    runs_tasks_here,
    tasks_for_share,
)
from raypipe.pipeline.elastic import ElasticWidth, bounds_for, start_width
from raypipe.plan.span import RankSpan
from raypipe.workers.local import LocalWorkers, local_cpus, shared_memory_dir
from raypipe.workers.protocol import Workers
from raypipe.workers.ray_tasks import RayTasks
from raypipe.workers.slabs import slab_room

__all__ = [
    "Execution",
    "execution_for",
    "local_execution",
    "ray_execution",
    "node_execution",
    "ray_budget",
    "local_budget",
    "node_slots",
]


@dataclass(frozen=True)
class Execution:
    """A rank's workers, the budget they run to (asked once the workers may start, then at each refresh),
    and, where their width follows the consumer, what sets it."""

    workers: Workers
    budget: Callable[[], RankBudget]
    elastic: ElasticWidth | None = None


def execution_for(decision: Decision, pipeline, span: RankSpan) -> Execution:
    """The workers and budget of ``decision``'s backend for ``span``'s rank."""
    if decision.backend == "nodes":
        return node_execution(pipeline, span, elastic=decision.elastic)
    if decision.backend == "ray":
        return ray_execution(pipeline, span)
    return local_execution(pipeline, span)


def _chunk_bytes(pipeline, world_size: int) -> int:
    """The images of the largest chunk a rank of ``world_size`` runs, in bytes."""
    h, w, c = pipeline.batch_spec.image_shape
    return pipeline.plan(0, world_size).max_chunk_rows * h * w * c


def _rank_budget(
    ex: ExecutionConfig, cpus: float, reserved_cpus: float, world_size: int, store_bytes: int, chunk_bytes: int
) -> RankBudget:
    return rank_budget(
        eligible_cpus=cpus,
        reserved_cpus=reserved_cpus,
        world_size=world_size,
        cpus_per_task=ex.cpus_per_task,
        prefetch_chunks=ex.prefetch_chunks,
        num_tasks=ex.num_tasks,
        store_bytes=store_bytes,
        chunk_bytes=chunk_bytes,
    )


def ray_budget(pipeline, *, world_size: int = 1, reserved_cpus: float = 0.0) -> RankBudget:
    """This rank's share of the connected cluster (``raypipe.pipeline.budget``). ``reserved_cpus``
    (what the trainers and feeders hold) is taken from the tasks' nodes only where this process's
    node is one of them (``runs_tasks_here``): trainers on GPU nodes hold none of the CPU nodes'."""
    ex = pipeline.execution
    cpus, store = eligible_resources(ex.resources)
    reserved_cpus = reserved_cpus if runs_tasks_here(ex.resources) else 0.0
    return _rank_budget(ex, cpus, reserved_cpus, world_size, store, _chunk_bytes(pipeline, world_size))


def local_budget(pipeline, *, world_size: int = 1, reserved_cpus: float = 0.0) -> tuple[RankBudget, int, str]:
    """This rank's share of this machine for local workers: (budget, worker processes, the directory
    of ``shared_memory_dir``); the chunks in flight are sized by the room for their slabs
    (``slab_room``: the memory available, or that directory's free space). The machine's ranks share
    its cores (``LOCAL_WORLD_SIZE``, as torchrun sets it). The budget is computed as on a private
    local Ray (``ray_budget``), and the workers are as many as such a Ray would run at once: one per
    ``cpus_per_task`` of the rank's cores, the trainer's ``reserved_cpus`` not taken from them (it
    holds no Ray CPU either), rounded to the nearest whole number as on Ray (``tasks_for_share``), at most
    the chunks in flight. In a process on Ray (a feeder, a training worker) the cores are at most
    those its node declares to Ray: ``connect(num_cpus=2)`` on a larger machine runs two."""
    ex = pipeline.execution
    chunk_bytes = _chunk_bytes(pipeline, world_size)
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    cpus = local_cpus()
    declared = runtime.node_cpus()
    if declared is not None:
        cpus = max(1, min(cpus, int(round(declared))))
    wanted = (ex.num_tasks or cpus) + ex.prefetch_chunks
    directory, free = shared_memory_dir(2 * wanted * chunk_bytes)
    free = slab_room(free)
    budget = _rank_budget(ex, cpus, reserved_cpus, ranks_here, free, chunk_bytes)
    if ex.num_tasks is not None:
        count = ex.num_tasks
    else:
        count = min(budget.in_flight, tasks_for_share(cpus / ranks_here, ex.cpus_per_task))
    return budget, count, directory


def local_execution(pipeline, span: RankSpan) -> Execution:
    """Local worker processes, as many as this rank's share of the machine runs (``local_budget``)."""
    ex = pipeline.execution
    local, count, directory = local_budget(pipeline, world_size=span.world_size, reserved_cpus=span.reserved_cpus)
    workers = LocalWorkers.shared(count, directory, prefetch_chunks=ex.prefetch_chunks)

    def budget() -> RankBudget:
        return local

    return Execution(workers, budget)


def ray_execution(pipeline, span: RankSpan) -> Execution:
    """Ray tasks, each asking for ``cpus_per_task`` and the ``resources`` that steer it."""
    ex = pipeline.execution
    options: dict = {"num_cpus": ex.cpus_per_task}
    if ex.resources:
        options["resources"] = dict(ex.resources)

    def budget() -> RankBudget:  # asked once the cluster is up, then again as it changes
        check_task_fits(ex)
        return ray_budget(pipeline, world_size=span.world_size, reserved_cpus=span.reserved_cpus)

    return Execution(RayTasks(options), budget)


def node_slots(pipeline, *, rank: int, world_size: int, reserved_cpus: float) -> dict:
    """Where this rank's node workers run (``raypipe.workers.node.node_slots``) on the cluster as it is
    now; ``reserved_cpus`` are held on this process's node only."""
    import ray

    from raypipe.workers.node import eligible_nodes
    from raypipe.workers.node import node_slots as slots_of

    ex = pipeline.execution
    return slots_of(
        eligible_nodes(ex.resources),
        here=ray.get_runtime_context().get_node_id(),
        reserved_cpus=reserved_cpus,
        cpus_per_task=ex.cpus_per_task,
        rank=rank,
        world_size=world_size,
        workers=ex.num_tasks,
    )


def node_execution(pipeline, span: RankSpan, *, elastic: bool) -> Execution:
    """This process's ``NodeWorkers`` for this placement (``elastic``: their width follows the consumer,
    from the rank's share of the nodes there are), and the rank's budget: its workers are those its
    slots give, the chunks in flight those and ``prefetch_chunks``."""
    import ray

    from raypipe.workers.node import NodeWorkers

    runtime.wait_connected()  # a connect(wait=False) under way (``raypipe run``) finishes first
    if not ray.is_initialized():
        raise RuntimeError("backend='nodes' runs on a Ray cluster: call raypipe.connect() (or ray.init) first")
    ex = pipeline.execution
    check_task_fits(ex)

    def slots() -> dict:
        return node_slots(pipeline, rank=span.rank, world_size=span.world_size, reserved_cpus=span.reserved_cpus)

    key = (
        tuple(sorted(ex.resources.items())),
        ex.cpus_per_task,
        ex.num_tasks,
        span.rank,
        span.world_size,
        span.reserved_cpus,
        elastic,
        ex.min_cpus,
        ex.max_cpus,
    )
    here = ray.get_runtime_context().get_node_id()
    directory = shared_memory_dir(0)[0]

    def make() -> NodeWorkers:
        # elastic: from the rank's share of the nodes there are, within its bounds
        width = start_width(sum(s.workers for s in slots().values()), bounds_for(ex)) if elastic else None
        return NodeWorkers(
            slots,
            here,
            directory,
            resources=ex.resources,
            task_cpus=ex.cpus_per_task,
            prefetch_chunks=ex.prefetch_chunks,
            width=width,
        )

    pool = NodeWorkers.shared_for(key, make)

    def budget() -> RankBudget:
        workers = max(1, pool.count)
        return RankBudget(
            workers=workers,
            in_flight=workers + ex.prefetch_chunks,
            cpus=workers * ex.cpus_per_task,
            task_cpus=ex.cpus_per_task,
        )

    return Execution(pool, budget, ElasticWidth(pool, bounds_for(ex)) if pool.elastic else None)
