"""Where a rank's node workers run: the eligible nodes as Ray reports them, and a pure deal of their CPUs
into slots among the ranks (``node_slots``), so N ranks share the nodes without counting on each other."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ray

from raypipe.workers.resources import in_steps, offers

__all__ = ["EligibleNode", "NodeShare", "eligible_nodes", "node_address", "node_slots"]


@dataclass(frozen=True)
class EligibleNode:
    node_id: str
    cpus: float


def eligible_nodes(resources: Mapping[str, float]) -> list[EligibleNode]:
    """The alive nodes that offer every resource in ``resources`` (``ray.nodes()``), by node id."""
    out = []
    for node in ray.nodes():
        have = node.get("Resources", {})
        if node.get("Alive") and offers(have, resources) and have.get("CPU", 0) > 0:
            out.append(EligibleNode(node["NodeID"], float(have["CPU"])))
    return sorted(out, key=lambda n: n.node_id)


def node_address(node_id: str) -> str:
    """Where ``node_id``'s services listen, as Ray knows it."""
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return node["NodeManagerAddress"]
    return ray.util.get_node_ip_address()


@dataclass(frozen=True)
class NodeShare:
    """One rank's workers on one node, and the CPUs they ask Ray for together."""

    workers: int
    cpus: float


def node_slots(
    nodes: Sequence[EligibleNode],
    *,
    here: str,
    reserved_cpus: float,
    cpus_per_task: float,
    rank: int,
    world_size: int,
    workers: int | None = None,
) -> dict[str, NodeShare]:
    """Pure: where this rank's workers run. Each node offers the nearest whole number of slots of
    ``cpus_per_task`` in its CPUs (``here``, the consumer's node, less ``reserved_cpus``: what trainers
    and feeders hold there), each asking for an equal part of them (at most ``cpus_per_task``, in
    Ray's steps). The slots are dealt to the ranks in turn, node after node, so every rank has its part
    of every node and no two ranks one slot. ``workers`` (the user's ``num_tasks``) takes that many,
    going round the rank's slots again where they are fewer; None takes the rank's slots, at least
    one (more ranks than slots share them)."""
    free, counts = [], []
    for node in nodes:
        cpus = max(0.0, node.cpus - (reserved_cpus if node.node_id == here else 0.0))
        free.append(cpus)
        counts.append(max(0, math.floor(cpus / cpus_per_task + 0.5 + 1e-9)))
    # node i's slot j goes to rank (j + the slots of the nodes before it) % world_size: every rank gets
    # its part of every node, and no two ranks one slot
    mine, before = [], 0
    for i, count in enumerate(counts):
        mine += [(j, i) for j in range(count) if (before + j) % world_size == rank]
        before += count
    order = [i for _, i in sorted(mine)]  # a rank taking fewer than its slots spreads them over the nodes
    if not order:  # more ranks than slots (or none at all): ranks share one, where the most CPUs are
        if not nodes:
            return {}
        every = [i for _, i in sorted((j, i) for i, count in enumerate(counts) for j in range(count))]
        order = [every[rank % len(every)]] if every else [max(range(len(nodes)), key=lambda i: nodes[i].cpus)]
    taken: dict[int, int] = {}
    for k in range(workers if workers is not None else len(order)):
        i = order[k % len(order)]
        taken[i] = taken.get(i, 0) + 1
    out = {}
    for i, n in taken.items():
        each = min(float(cpus_per_task), free[i] / counts[i]) if counts[i] else float(cpus_per_task)
        out[nodes[i].node_id] = NodeShare(n, in_steps(each) * n)
    return out
