"""Where ``ExecutionConfig(backend="auto")`` runs a rank's tasks, decided in two places, each by what
only it knows:

- The process that connected to Ray knows whose cluster it is (``on_ray_backend``). On raypipe's
  private local Ray nothing else will join, so the tasks are local worker processes ("local"), which
  cost less CPU per image than Ray tasks on the same machine. A Ray Dataset's blocks are in Ray's
  object store, which only Ray tasks read ("ray"); a local Ray that a script's own ``ray.init()``
  started runs Ray tasks too. On a cluster it joined (``raypipe.runtime.joined_cluster``) it leaves
  "auto" to the consumer.
- The consumer (the process that runs the rank's chunk stream: a feeder, a training worker, a
  script's ``EpochSource``) knows its node (``on_joined_cluster``). On a cluster joined, "auto" is
  raypipe's node workers (``raypipe.workers.node``): across nodes they cost less CPU per image than
  Ray's object transfer (docs/performance.md), and their width follows the consumer's demand
  (``elastic``, unless ``num_tasks`` fixes it), so the cluster's autoscaler follows the trainer. Where
  the other nodes cannot connect to this node (``raypipe.workers.reach``), Ray tasks, said in one line.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading

from raypipe import runtime
from raypipe.config import ExecutionConfig

__all__ = ["on_ray_backend", "on_joined_cluster", "consumer_pipeline", "with_execution"]

log = logging.getLogger(__name__)

# node id -> why the other nodes cannot reach it (None: they can): one probe per process and node.
_REACH: dict[str, str | None] = {}
_REACH_LOCK = threading.Lock()


def on_ray_backend(execution: ExecutionConfig, *, source_kind: str) -> ExecutionConfig:
    """``execution`` for a process on Ray (a feeder, a training worker), with what ``backend="auto"``
    depends on in the process that connected decided: ``"local"`` on raypipe's private local Ray unless
    the tasks need Ray (a Ray Dataset's blocks, steering ``resources``), then ``"ray"``; a Ray Dataset's
    tasks are Ray's on any cluster, and so are those of a Ray this process started itself. On a
    cluster joined, "auto" stays for the consumer (``on_joined_cluster``)."""
    if execution.backend != "auto":
        return execution
    if source_kind == "raydata":
        return dataclasses.replace(execution, backend="ray")
    if runtime.private_cluster():
        return dataclasses.replace(execution, backend="ray" if execution.resources else "local")
    if runtime.joined_cluster():
        return execution
    return dataclasses.replace(execution, backend="ray")


def on_joined_cluster(execution: ExecutionConfig, *, source_kind: str) -> ExecutionConfig:
    """``execution`` for a consumer in a process connected to a cluster it did not start, with
    ``backend="auto"`` decided: node workers, elastic unless ``num_tasks`` fixes the width, or Ray tasks
    where the other nodes cannot connect to this one or the rows are a Ray Dataset's. Anything else
    is returned as it is."""
    import ray

    if execution.backend != "auto" or not (ray.is_initialized() and runtime.joined_cluster()):
        return execution
    if source_kind == "raydata":
        return dataclasses.replace(execution, backend="ray")
    from raypipe.workers.reach import unreachable_reason

    here = ray.get_runtime_context().get_node_id()
    with _REACH_LOCK:
        if here not in _REACH:  # said once per process: every later stream decides the same
            _REACH[here] = unreachable_reason(here, execution.resources)
            if _REACH[here] is not None:
                log.warning("raypipe: Ray tasks make this rank's chunks, not node workers: %s", _REACH[here])
        reason = _REACH[here]
    if reason is not None:
        return dataclasses.replace(execution, backend="ray")
    return dataclasses.replace(execution, backend="nodes", elastic=execution.num_tasks is None)


def consumer_pipeline(pipeline):
    """``pipeline`` as the consumer in this process runs it (``on_joined_cluster``): the same object
    where nothing is left to decide, else a shallow copy with its ``execution`` decided (the caller's
    is left as it is)."""
    return with_execution(pipeline, on_joined_cluster(pipeline.execution, source_kind=pipeline.rows.kind))


def with_execution(pipeline, execution: ExecutionConfig):
    """``pipeline`` itself where ``execution`` is its own, else a shallow copy that runs with it."""
    if execution == pipeline.execution:
        return pipeline
    out = copy.copy(pipeline)
    out.execution = execution
    return out
