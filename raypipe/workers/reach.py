"""Whether the other nodes of the cluster can connect to this node, where a consumer's node workers
connect (``raypipe.workers.node``): Ray's own traffic between the nodes says nothing of a port of ours
(a firewall that opens only Ray's ports, an address that only this node can reach).

One probe answers it: a task pinned to another node opens a TCP connection to a listening socket of
this process at the address the workers would use, and says why it could not. Nothing is sent on that
connection; the socket is closed at once after.
"""

from __future__ import annotations

import socket

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raypipe import settings
from raypipe.workers.placement import eligible_nodes, node_address

__all__ = ["HOST_ENV", "PROBE_CONNECT_S", "PROBE_WAIT_S", "connect_from", "listen_address", "unreachable_reason"]

# The variable of ``Settings.node_workers_host``: the address the consumer listens on for its workers,
# where not its node's (Ray's NodeManagerAddress).
HOST_ENV = "RAYPIPE_NODE_WORKERS_HOST"
# The probe's own connect timeout: a port a firewall drops answers nothing, so silence is the answer.
PROBE_CONNECT_S = 5.0
# How long the probe may take in all, a new worker process on the other node included; past it the
# answer is unknown and taken as reachable (the node workers' own handshake deadline still holds).
PROBE_WAIT_S = 30.0


def listen_address(here: str) -> str:
    """The address a consumer on node ``here`` listens on for its node workers."""
    return settings.current().node_workers_host or node_address(here)


@ray.remote(num_cpus=0, max_retries=0)
def _connect(host: str, port: int, timeout_s: float) -> str | None:
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _other_node(here: str, resources) -> tuple[str, str] | None:
    """(node id, address) of another alive node, one that offers ``resources`` first (where the
    workers would run); None when this node is the only one."""
    preferred = {n.node_id for n in eligible_nodes(resources)}
    others = [n for n in ray.nodes() if n.get("Alive") and n.get("NodeID") != here]
    if not others:
        return None
    best = sorted(others, key=lambda n: (n["NodeID"] not in preferred, n["NodeID"]))[0]
    return best["NodeID"], best.get("NodeManagerAddress", "?")


def unreachable_reason(here: str, resources) -> str | None:
    """Why another node could not connect to this node's workers address (one line), or None: it
    connected, no other node is there yet to ask, or it did not answer within ``PROBE_WAIT_S``."""
    other = _other_node(here, resources)
    if other is None:
        return None
    node, node_ip = other
    address = listen_address(here)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.create_server((address, 0), family=family) as listener:
        port = listener.getsockname()[1]
        error = connect_from(node, address, port)
    if error is None:
        return None
    return f"node {node[:12]} ({node_ip}) cannot connect to this node's {address}:{port} ({error})"


def connect_from(node: str, host: str, port: int) -> str | None:
    """Why a TCP connection from ``node`` to ``host:port`` failed, or None: it connected, or the node
    did not answer within ``PROBE_WAIT_S`` (or went away)."""
    strategy = NodeAffinitySchedulingStrategy(node, soft=False)
    ref = _connect.options(scheduling_strategy=strategy).remote(host, port, PROBE_CONNECT_S)
    ready, _ = ray.wait([ref], timeout=PROBE_WAIT_S)
    if not ready:
        ray.cancel(ref, force=True)
        return None
    try:
        return ray.get(ref)
    except ray.exceptions.RayError:  # the node went away meanwhile: nothing learnt
        return None
