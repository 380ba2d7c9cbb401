"""Which backend runs a rank's tasks: ``ExecutionConfig.backend`` as given, or for ``"auto"`` what one pure
function, ``decide_backend``, makes of the process's ``Situation``. The facts are gathered where they are
(``situation``):

- Whose Ray this is (``raypipe.runtime.connection``) only the process that connected can tell. A Ray
  actor it starts (a feeder, a training worker) would take itself for a process on a cluster it
  joined, so the connecting process tells it (``told``), and the actor decides with that.
- Whether the other nodes can connect to this one (``raypipe.workers.reach``) costs a network round
  trip: it is asked once per process and node, and only on a cluster joined, where it decides.

For ``"auto"``: not on Ray (and not needing it), local worker processes, so that a script that never
connected starts no cluster. A Ray Dataset's rows are in Ray's object store, which only Ray tasks read.
On raypipe's private local Ray nothing else will join, so a process on a Ray worker runs local worker
processes, which cost less CPU per image than Ray tasks on the same machine (unless ``resources`` steer
the tasks); the process that started it runs Ray tasks. On a cluster joined, raypipe's node workers
(``raypipe.workers.node``): across nodes they cost less CPU per image than Ray's object transfer
(docs/performance.md), and their width follows the consumer's demand (elastic, unless ``num_tasks``
fixes it), so the cluster's autoscaler follows the trainer; where the other nodes cannot connect to this
node, Ray tasks, said in one line. Any other Ray (a script's own ``ray.init()``, Ray Client, a cluster
not joined yet): Ray tasks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from raypipe import runtime
from raypipe.config import ExecutionConfig

__all__ = ["Situation", "Decision", "decide_backend", "situation", "decide_here", "UNREACHABLE"]

log = logging.getLogger(__name__)

# The start of the line that says why a rank runs Ray tasks where node workers were its default.
UNREACHABLE = "Ray tasks make this rank's chunks, not node workers"

# node id -> why the other nodes cannot reach it (None: they can): one probe per process and node.
_REACH: dict[str, str | None] = {}
_REACH_LOCK = threading.Lock()


@dataclass(frozen=True)
class Situation:
    """What decides where a rank's tasks run."""

    backend: str  # ExecutionConfig.backend, as given
    # how the process is on Ray (raypipe.runtime.connection: "none", "private", "own", "joined",
    # "joining", "client"), its own or told; None: not asked (a backend given needs no answer)
    connection: str | None = None
    # the stream runs in a Ray worker process (a feeder, a training worker) that the connecting process
    # told its connection
    on_ray_worker: bool = False
    # Ray is needed whatever makes the chunks (a feeder actor, ranks that share a node's cluster)
    needs_ray: bool = False
    source_kind: str | None = None  # the listing's kind ("raydata": a Ray Dataset's rows); None: not known
    num_tasks: int | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    elastic: bool = False  # as given (backend="nodes")
    # why the other nodes cannot connect to this one (None: they can), asked only on a cluster joined;
    # None here: not asked, taken as reachable (as a probe that gets no answer is)
    reach: Callable[[], str | None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Decision:
    """The backend that runs the tasks (``"local"``, ``"ray"`` or ``"nodes"``), whether its width
    follows the consumer (``elastic``), and why, in one line."""

    backend: str
    elastic: bool
    reason: str

    @property
    def on_ray(self) -> bool:
        """Whether the tasks run on a Ray cluster (Ray tasks, or node workers its launchers start)."""
        return self.backend != "local"


_OTHER_RAY = {
    "own": "a Ray this script started itself: Ray tasks",
    "client": "Ray Client, on no node of the cluster: Ray tasks",
    "joining": "a cluster to join (RAY_ADDRESS), not connected yet: Ray tasks",
    "none": "Ray is needed (a feeder actor, ranks that share a node's cluster): Ray tasks",
}


def decide_backend(s: Situation) -> Decision:
    """Pure: where the tasks run in situation ``s`` (the module's doc says why). Calls ``s.reach`` only on
    a cluster joined with ``backend="auto"``, for rows that are not a Ray Dataset's."""
    if s.backend != "auto":
        return Decision(s.backend, s.backend == "nodes" and s.elastic, f"backend={s.backend!r}, as given")
    connection = s.connection or "none"
    if connection == "joining" and s.on_ray_worker:
        connection = "joined"  # a worker runs once its driver is connected: to the cluster it was told to join
    if connection == "none" and not s.needs_ray:
        return Decision("local", False, "not on Ray: local worker processes, no cluster started")
    if s.source_kind == "raydata":
        return Decision("ray", False, "a Ray Dataset's rows are in Ray's object store, which only Ray tasks read")
    if connection == "private":
        if not s.on_ray_worker:
            return Decision("ray", False, "the process that started raypipe's private local Ray: Ray tasks")
        if s.resources:
            return Decision("ray", False, "raypipe's private local Ray, tasks steered by resources: Ray tasks")
        return Decision("local", False, "raypipe's private local Ray, which nothing joins: local worker processes")
    if connection == "joined":
        why = s.reach() if s.reach is not None else None
        if why is not None:
            return Decision("ray", False, f"{UNREACHABLE}: {why}")
        if s.num_tasks is None:
            return Decision("nodes", True, "a cluster joined: node workers, their width following the consumer")
        return Decision("nodes", False, f"a cluster joined: node workers, num_tasks={s.num_tasks}")
    return Decision("ray", False, _OTHER_RAY[connection])


def _reach(resources: Mapping[str, float]) -> str | None:
    """Why the other nodes cannot connect to this process's node (None: they can), probed once per
    process and node, and said once when they cannot."""
    import ray

    from raypipe.workers.reach import unreachable_reason

    here = ray.get_runtime_context().get_node_id()
    with _REACH_LOCK:
        if here not in _REACH:  # said once per process: every later stream decides the same
            _REACH[here] = unreachable_reason(here, resources)
            if _REACH[here] is not None:
                log.warning("raypipe: %s: %s", UNREACHABLE, _REACH[here])
        return _REACH[here]


def situation(
    execution: ExecutionConfig,
    source_kind: str | None,
    *,
    told: str | None = None,
    needs_ray: bool = False,
    probe: bool = True,
) -> Situation:
    """The situation of a stream of ``execution`` over rows of ``source_kind`` in this process. ``told``:
    the connection the process that connected told this one (a Ray worker's); else this process's own,
    asked only for ``backend="auto"``. ``probe``: whether the other nodes' reach may be asked (only on a
    cluster joined); without it, it is taken as reachable."""
    connection = told if told is not None else (runtime.connection() if execution.backend == "auto" else None)
    resources = dict(execution.resources)
    return Situation(
        backend=execution.backend,
        connection=connection,
        on_ray_worker=told is not None,
        needs_ray=needs_ray,
        source_kind=source_kind,
        num_tasks=execution.num_tasks,
        resources=resources,
        elastic=execution.elastic,
        reach=(lambda: _reach(resources)) if probe else None,
    )


def decide_here(execution: ExecutionConfig, source_kind: str | None, **facts) -> Decision:
    """``decide_backend`` of this process's ``situation`` (``facts``: its keywords)."""
    return decide_backend(situation(execution, source_kind, **facts))
