"""One Ray per node for trainers that torchrun (or any ``torch.distributed`` launcher) starts.

Each trainer process calling ``raypipe.runtime.connect()`` on its own would start a private Ray per
rank: N clusters on one node, each sized to every core, each rank's workers competing with the
others' without knowing. Instead the ranks of a node share one:

1. ``RAY_ADDRESS`` set (a cluster started with ``ray start`` or ``ray job submit``): every rank joins it.
2. Otherwise the node's local rank 0 starts a local Ray (``raypipe.runtime.connect``), and every
   rank learns its node's address from one ``all_gather_object`` over the default process group
   (collective, so it is also the barrier); the other local ranks join that address.

Joining needs the head's authentication mode in the joining process's environment before Ray is
imported (Ray reads it once, on import): launch with ``RAY_AUTH_MODE=token torchrun …``; a rank whose
mode differs from the head's gets an error that says so.

A node is named by torchrun's ``GROUP_RANK`` (its node rank), else the host name. The Ray started by
local rank 0 lives in that process: it stops when that process ends (Ray's own exit handler), so no
cluster outlives the job.
"""

from __future__ import annotations

import os
import socket

import ray
import torch.distributed as dist

__all__ = ["connect_node", "node_key"]


def node_key() -> str:
    """The name the ranks of one node share: torchrun's node rank, else the host name."""
    group = os.environ.get("GROUP_RANK")
    return f"group-{group}" if group is not None else f"host-{socket.gethostname()}"


def connect_node(*, local_rank: int | None = None, num_cpus: int | None = None, wait: bool = True) -> str | None:
    """Connect this process to its node's Ray (see the module doc) and return the cluster's GCS address.

    Without an initialised ``torch.distributed`` (or with one process) this is ``raypipe.runtime.connect()``,
    and ``wait=False`` is passed on to it (the address is None while the local cluster is starting).
    The ranks of a node always wait, as they exchange the address. ``local_rank``: this process's rank
    on its node (default: torchrun's ``LOCAL_RANK``).
    """
    from raypipe.runtime import connect, join_private_cluster, starting

    if ray.is_initialized() and not starting():
        return ray.get_runtime_context().gcs_address
    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if os.environ.get("RAY_ADDRESS") or not several:
        connect(num_cpus=num_cpus, wait=wait)
        return None if starting() else ray.get_runtime_context().gcs_address
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    head = None
    if local_rank == 0:
        connect(num_cpus=num_cpus)
        # A new local Ray turns token authentication on in this process's environment (Ray's default);
        # the token itself is in the user's ~/.ray, which the other ranks of the node share.
        head = (ray.get_runtime_context().gcs_address, os.environ.get("RAY_AUTH_MODE"))
    entries: list = [None] * dist.get_world_size()
    dist.all_gather_object(entries, (node_key(), local_rank, head))
    if local_rank == 0:
        return head[0]
    mine = [h for key, lr, h in entries if key == node_key() and lr == 0]
    if len(mine) != 1:
        raise RuntimeError(
            f"{len(mine)} processes with LOCAL_RANK=0 on node {node_key()!r}; expected one to start its Ray "
            "(set RAY_ADDRESS to join a running cluster instead)"
        )
    address, auth_mode = mine[0]
    mode, own = auth_mode or "disabled", os.environ.get("RAY_AUTH_MODE") or "disabled"
    if mode.lower() != own.lower():
        raise RuntimeError(
            f"local rank {local_rank}: the node's Ray (started by local rank 0) has RAY_AUTH_MODE={mode}, this "
            f"process {own}, and Ray reads it only when imported. Launch every rank with RAY_AUTH_MODE={mode} "
            f"(`RAY_AUTH_MODE={mode} torchrun …`)"
        )
    join_private_cluster(address)  # local rank 0 started it (no RAY_ADDRESS): the node's alone
    return address
