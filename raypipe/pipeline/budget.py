"""How many augmentation tasks one rank keeps running, from what the cluster really has for it.

Every rank sizes itself from the same numbers: the CPUs of the nodes that may run augmentation (all
alive nodes, or those offering the ``resources`` the user steers to), minus the CPUs that trainers
and feeders hold, shared by the world size. So N ranks together ask for the cluster once, not N
times, and the object store each rank may fill is its share too: at most ``STORE_SHARE`` of those
nodes' object store, over the world size, is held by chunks in flight.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RankBudget", "rank_budget", "eligible_resources", "STORE_SHARE"]

log = logging.getLogger(__name__)

# The part of the object store the ranks' chunks in flight may fill together: the rest is left to the
# trainers' own objects and to Ray (spilling starts when the store is full, and slows everything).
STORE_SHARE = 0.5


@dataclass(frozen=True)
class RankBudget:
    """One rank's share: ``workers`` tasks running at once, ``in_flight`` chunks submitted ahead."""

    workers: int
    in_flight: int
    cpus: float  # the CPUs the share was computed from

    def describe(self) -> str:
        return f"{self.workers} augmentation task(s) at once ({self.cpus:g} CPUs), {self.in_flight} chunks in flight"


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
    """Pure: this rank's share of ``eligible_cpus - reserved_cpus`` over ``world_size`` ranks, as a
    number of tasks of ``cpus_per_task`` each (at least one, so a rank always progresses), or
    ``num_tasks`` when given. ``in_flight`` adds ``prefetch_chunks`` finished chunks waiting for the
    consumer, so the workers never wait on it at a chunk boundary; it is then capped so that the chunks
    in flight (``chunk_bytes`` each) fit this rank's share of ``STORE_SHARE`` of ``store_bytes``."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: expected >= 1")
    share = max(0.0, eligible_cpus - reserved_cpus) / world_size
    workers = num_tasks if num_tasks is not None else max(1, math.floor(share / cpus_per_task + 1e-9))
    in_flight = workers + prefetch_chunks
    if store_bytes and chunk_bytes:
        fits = math.floor(STORE_SHARE * store_bytes / world_size / chunk_bytes)
        if fits < in_flight:
            log.info("object store share fits %d chunks of %d MB in flight (of %d wanted)", fits, chunk_bytes >> 20,
                     in_flight)  # fmt: skip
            in_flight = max(1, fits)
            workers = min(workers, in_flight)
    return RankBudget(workers=workers, in_flight=in_flight, cpus=round(share, 3))


def eligible_resources(resources: Mapping[str, float]) -> tuple[float, float]:
    """(CPUs, object-store bytes) of the connected cluster's alive nodes that offer every resource in
    ``resources`` (``ray.nodes()``, Ray's public view of the cluster)."""
    import ray

    cpus = store = 0.0
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        have = node.get("Resources", {})
        if all(have.get(name, 0.0) >= amount for name, amount in resources.items()):
            cpus += have.get("CPU", 0.0)
            store += have.get("object_store_memory", 0.0)
    return cpus, store
