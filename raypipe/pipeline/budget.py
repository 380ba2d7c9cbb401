"""How many augmentation tasks one rank keeps running, from what the cluster really has for it.

Every rank sizes itself from the same numbers: the CPUs of the nodes that may run augmentation (all
alive nodes, or those offering the ``resources`` the user steers to), minus the CPUs that trainers
and feeders hold, shared by the world size. So N ranks together ask for the cluster once, not N
times, and the object store each rank may fill is its share too: at most ``STORE_SHARE`` of those
nodes' object store, over the world size, is held by chunks in flight.

A share is rarely a whole number of tasks (a feeder holds a quarter of a core, a trainer's CPUs need
not divide a node's), and flooring it would idle up to a whole core per rank: 1.75 CPUs would run one
task on a 2-core machine. So the share is split over the nearest whole number of tasks, each asking
for an equal part of it (``task_cpus``, at most ``cpus_per_task``): 1.75 CPUs run two tasks of 0.875.
What is left idle, or asked for beyond a task's nominal size, is at most half a task per rank.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raypipe.workers.resources import in_steps, offers

if TYPE_CHECKING:
    from raypipe.config import ExecutionConfig

__all__ = [
    "RankBudget",
    "rank_budget",
    "check_task_fits",
    "tasks_for_share",
    "eligible_resources",
    "runs_tasks_here",
    "STORE_SHARE",
]

log = logging.getLogger(__name__)

# The part of the object store the ranks' chunks in flight may fill together: the rest is left to the
# trainers' own objects and to Ray (spilling starts when the store is full, and slows everything).
STORE_SHARE = 0.5


@dataclass(frozen=True)
class RankBudget:
    """One rank's share: ``workers`` tasks running at once, each asking for ``task_cpus``, and
    ``in_flight`` chunks submitted ahead."""

    workers: int
    in_flight: int
    cpus: float  # the CPUs the share was computed from
    task_cpus: float  # the CPUs each task asks for

    def describe(self) -> str:
        return (
            f"{self.workers} augmentation task(s) at once of {self.task_cpus:g} CPU ({self.cpus:g} CPUs), "
            f"{self.in_flight} chunks in flight"
        )


def tasks_for_share(share: float, cpus_per_task: float) -> int:
    """Pure: the whole number of tasks of about ``cpus_per_task`` nearest to ``share`` CPUs (halves
    round up), at least one so that a rank always progresses."""
    return max(1, math.floor(share / cpus_per_task + 0.5 + 1e-9))


def task_cpus_for(share: float, workers: int, cpus_per_task: float) -> float:
    """Pure: what each of ``workers`` tasks asks for so that together they ask for ``share``: an equal
    part of it, at most ``cpus_per_task`` (no task asks for more than it was sized for), rounded down
    to a step of Ray's (``in_steps``). A share of nothing (the trainers hold every eligible CPU) asks for
    ``cpus_per_task``: the task waits for a CPU rather than run on one that is taken."""
    if share <= 0:
        return float(cpus_per_task)
    part = min(float(cpus_per_task), share / workers)
    return in_steps(part)


def rank_budget(
    *,
    eligible_cpus: float,
    reserved_cpus: float,
    world_size: int,
    cpus_per_task: float,
    prefetch_chunks: int,
    num_tasks: int | None = None,
    store_bytes: float | None = None,
    chunk_bytes: int = 0,
) -> RankBudget:
    """Pure: this rank's share of ``eligible_cpus - reserved_cpus`` over ``world_size`` ranks, as the
    nearest whole number of tasks of ``cpus_per_task`` (``tasks_for_share``), each asking for an equal
    part of the share (``task_cpus_for``), or ``num_tasks`` of ``cpus_per_task`` each when given.
    ``in_flight`` adds ``prefetch_chunks`` finished chunks waiting for the consumer, so the workers
    never wait on it at a chunk boundary; it is then capped so that the chunks in flight
    (``chunk_bytes`` each) fit this rank's share of ``STORE_SHARE`` of ``store_bytes``."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: expected >= 1")
    share = max(0.0, eligible_cpus - reserved_cpus) / world_size
    workers = num_tasks if num_tasks is not None else tasks_for_share(share, cpus_per_task)
    in_flight = workers + prefetch_chunks
    if store_bytes and chunk_bytes:
        fits = math.floor(STORE_SHARE * store_bytes / world_size / chunk_bytes)
        if fits < in_flight:
            log.info(
                "object store share fits %d chunks of %d MB in flight (of %d wanted)",
                fits,
                chunk_bytes >> 20,
                in_flight,
            )
            in_flight = max(1, fits)
            workers = min(workers, in_flight)
    task_cpus = float(cpus_per_task) if num_tasks is not None else task_cpus_for(share, workers, cpus_per_task)
    return RankBudget(workers=workers, in_flight=in_flight, cpus=round(share, 3), task_cpus=task_cpus)


def eligible_resources(resources: Mapping[str, float]) -> tuple[float, float]:
    """(CPUs, object-store bytes) of the connected cluster's alive nodes that offer every resource in
    ``resources`` (``ray.nodes()``, Ray's public view of the cluster)."""
    import ray

    cpus = store = 0.0
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        have = node.get("Resources", {})
        if offers(have, resources):
            cpus += have.get("CPU", 0.0)
            store += have.get("object_store_memory", 0.0)
    return cpus, store


def runs_tasks_here(resources: Mapping[str, float]) -> bool:
    """Whether this process's node offers every resource in ``resources``, so that augmentation tasks
    may run beside it: the CPUs a trainer or feeder here holds are then taken from the tasks' nodes.
    Steered elsewhere (``preprocess`` CPU nodes), they are not."""
    import ray

    if not resources:
        return True
    here = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == here:
            return offers(node.get("Resources", {}), resources)
    return False


def check_task_fits(execution: ExecutionConfig) -> None:
    """An augmentation task that no node can hold would wait without a word. On raypipe's private
    local cluster nothing more will join, so that is an error; elsewhere an autoscaler may still add
    such a node, so it is a warning."""
    import ray

    from raypipe.runtime import private_cluster

    # a Pipeline's config has cpus_per_task set; one left to the dataset is checked at the larger need
    cpus = execution.cpus_per_task_for(store_objects=False)
    need = {"CPU": cpus, **dict(execution.resources)}
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if not nodes or any(offers(r, need) for r in nodes):
        return
    largest = max(r.get("CPU", 0.0) for r in nodes)
    message = (
        f"no node of the cluster can run an augmentation task, which needs {need} (cpus_per_task="
        f"{cpus:g}, resources={dict(execution.resources)}); the largest node has {largest:g} CPUs"
    )
    if private_cluster():
        raise ValueError(message)
    log.warning("%s: the epoch waits until such a node joins (an autoscaler may add one)", message)
