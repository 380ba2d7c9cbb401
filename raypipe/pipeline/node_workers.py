"""NodeWorkers: a rank's augmentation in raypipe's own worker processes on every node that may run it,
their images streamed to the consumer over TCP (``ExecutionConfig(backend="nodes")``).

A Ray task's result crosses nodes through Ray's object transfer: put into the store of the node that
made it, pulled by the consumer's node, read there. On the 2-core VM of docs/performance.md that costs
about 0.30 ms of CPU per 224 px image more than a chunk made on the consumer's node, a third of what
making the image costs, where a TCP stream of the same bytes costs about 0.08 ms (``python
bench/profiles.py cross-node``). So here each node runs the local path's worker processes
(``raypipe.pipeline._local_worker``) and each chunk's images go straight from the worker that made
them into the consumer's slab:

- On the consumer's node the workers are ``LocalWorkers``' own: a Unix socket, the slab passed as a
  descriptor, no copy.
- On every other node a launcher actor (``_Launcher``, pinned to the node, holding the CPUs its workers
  use, so that Ray schedules nothing else onto them and an autoscaler sees them busy) starts the
  node's share of workers. Each connects to the consumer's listening socket on its node's address,
  both ends prove they know the pool's secret (``raypipe.pipeline.peer_auth``), and from then on the
  requests and answers are those of a local worker, with a chunk's images sent as raw bytes after its
  answer and received into the chunk's slab.
- The slabs are the consumer's, so a feeder hands a batch over to the trainer as the slab's descriptor
  (``raypipe.pipeline.handover``) as it does on one node.

While no node offers the tasks' resources (a preprocessing group scaled to zero), one launcher of one
worker asks Ray for any node that does: its pending request is what an autoscaler acts on.

A node that is lost (its launcher ends, the connection drops or goes quiet for half a minute) takes
its workers with it (a worker ends when its launcher does); the chunks they held go to the other
workers, as a dead local worker's do, and the same per-sample seeds give the same images. A worker
that dies alone is restarted by its launcher. Every ``BUDGET_REFRESH_S`` (the stream's budget refresh)
the pool looks at the cluster again: a node that joined, or whose launcher ended, gets one.

Each rank's workers are placed by ``node_slots``: every eligible node's CPUs as slots of
``cpus_per_task``, dealt to the ranks in turn, so N ranks share the nodes without counting on each
other.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raypipe.pipeline.budget import RESOURCE_STEPS, offers
from raypipe.pipeline.local_workers import LocalWorkers, _Worker
from raypipe.pipeline.peer_auth import SECRET_ENV, PeerAuthError, new_secret, prove_server, tune_stream_socket

__all__ = ["NodeWorkers", "EligibleNode", "NodeShare", "eligible_nodes", "node_slots", "FIRST_WORKER_WAIT_S",
           "HOST_ENV"]  # fmt: skip

log = logging.getLogger(__name__)

# The address the consumer listens on for its workers, where not its node's (Ray's NodeManagerAddress):
# the interface of the network that should carry the images, on a machine with several.
HOST_ENV = "RAYPIPE_NODE_WORKERS_HOST"
# How long the consumer makes chunks itself while no worker has answered yet (their nodes' Python
# starts and imports the stage); after it, chunks wait in the queue for the workers.
FIRST_WORKER_WAIT_S = 60.0
# The key of the launcher that asks for any node, while no node offers the tasks' resources.
ANY_NODE = "any"
# Restarts of a node's workers a launcher makes before it leaves the dead ones dead (a broken node).
MAX_LAUNCHER_RESTARTS = 8


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


def _node_address(node_id: str) -> str:
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
        out[nodes[i].node_id] = NodeShare(n, max(1, math.floor(each * RESOURCE_STEPS + 1e-6)) * n / RESOURCE_STEPS)
    return out


@ray.remote(max_restarts=0, max_concurrency=2)
class _Launcher:
    """Starts ``count`` workers on its node that connect to the consumer at ``(host, port)``, keeps them
    running (a worker that ends is replaced) until ``close`` or its own end, which ends them: each
    watches a pipe whose writing end only this process holds."""

    def __init__(self, host: str, port: int, secret: bytes, count: int):
        self._args = (host, str(port))
        self._env = dict(os.environ)
        self._env["PYTHONPATH"] = os.pathsep.join([p or os.getcwd() for p in sys.path])
        self._env[SECRET_ENV] = secret.hex()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._procs = [self._spawn() for _ in range(count)]
        self.restarts = 0
        threading.Thread(target=self._keep, name="raypipe-launcher", daemon=True).start()

    def _spawn(self) -> tuple[subprocess.Popen, int]:
        read, write = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "raypipe.pipeline._local_worker", "--connect", *self._args, str(read)],
                pass_fds=(read,), stdin=subprocess.DEVNULL, env=self._env, start_new_session=True,
            )  # fmt: skip
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        return proc, write

    def _keep(self) -> None:
        while not self._closed.wait(0.5):
            with self._lock:
                for i, (proc, lifeline) in enumerate(self._procs):
                    if proc.poll() is None or self.restarts >= MAX_LAUNCHER_RESTARTS or self._closed.is_set():
                        continue
                    os.close(lifeline)
                    self.restarts += 1
                    print(f"raypipe worker {proc.pid} ended (exit code {proc.returncode}); starting another",
                          file=sys.stderr, flush=True)  # fmt: skip
                    self._procs[i] = self._spawn()

    def run(self) -> int:
        """Returns when closed (its caller's reference ends with the actor, however it ends)."""
        self._closed.wait()
        return self.restarts

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            for _, lifeline in self._procs:
                os.close(lifeline)
        for proc, _ in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class NodeWorkers(LocalWorkers):
    """A ``LocalWorkers`` pool whose workers are on every node the rank may use (see the module doc):
    ``slots_fn()`` says how many on each (``node_slots``), ``here`` is this process's node, whose
    workers are local ones; each launcher asks for its workers' CPUs and ``resources`` (per worker)."""

    _shared: NodeWorkers | None = None
    _shared_key: tuple | None = None

    def __init__(self, slots_fn: Callable[[], dict[str, NodeShare]], here: str, directory: str, *,
                 resources: Mapping[str, float], task_cpus: float = 1.0, prefetch_chunks: int = 0):  # fmt: skip
        self._slots_fn, self._here = slots_fn, here
        self._resources, self._task_cpus = dict(resources), task_cpus
        slots = slots_fn()
        super().__init__(sum(s.workers for s in slots.values()), directory, prefetch_chunks=prefetch_chunks)
        self._slots = slots
        address = os.environ.get(HOST_ENV) or _node_address(here)
        self._secret = new_secret()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.create_server((address, 0), family=family, backlog=128)
        self.address = (address, self._listener.getsockname()[1])
        self._launchers: dict[str, tuple[object, object]] = {}  # node id -> (actor, its run() reference)
        self._first_wait_until: float | None = None
        self.remote_workers = 0  # connections accepted from other nodes' workers

    @classmethod
    def shared_for(cls, key: tuple, make: Callable[[], NodeWorkers]) -> NodeWorkers:
        """This process's pool for ``key`` (the pipeline's placement), made on first use; a pool for
        another key is shut down first."""
        with LocalWorkers._shared_lock:
            pool = cls._shared
            if pool is not None and not pool._closed and cls._shared_key == key:
                return pool
            cls._shared, cls._shared_key = None, None
        if pool is not None:
            pool.shutdown()
        pool = make()
        with LocalWorkers._shared_lock:
            cls._shared, cls._shared_key = pool, key
        import atexit

        atexit.register(pool.shutdown)
        return pool

    @classmethod
    def shutdown_shared(cls) -> None:
        with LocalWorkers._shared_lock:
            pool, cls._shared, cls._shared_key = cls._shared, None, None
        if pool is not None:
            pool.shutdown()

    # -- what the stream asks -----------------------------------------------------------------------

    def starting(self) -> bool:
        """As ``LocalWorkers``, and until the first worker answers (at most ``FIRST_WORKER_WAIT_S``):
        the consumer makes chunks itself while the nodes start theirs."""
        if super().starting():
            return True
        with self._lock:
            if any(w.ready for w in self._alive()):
                return False
        if self._first_wait_until is None:
            self._first_wait_until = time.monotonic() + FIRST_WORKER_WAIT_S
        if time.monotonic() < self._first_wait_until:
            return True
        log.warning("no raypipe worker answered within %.0f s of the start; chunks wait for them", FIRST_WORKER_WAIT_S)
        self._first_wait_until = math.inf
        return False

    def size_tasks(self, cpus: float) -> None:
        """The stream's budget refresh: launchers that ended are dropped, and nodes (new, or whose
        launcher ended) that the placement gives workers get one."""
        if not self._started or self._closed:
            return
        slots = self._slots_fn()
        with self._lock:
            self._slots = slots
            self.count = sum(s.workers for s in slots.values())
            self.slabs.keep = self._slabs_kept(self.count)
            self._drop_ended_launchers()
            self._start_launchers()

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True  # the workers' connections end as their launchers close: not a loss
            launchers, self._launchers = list(self._launchers.values()), {}
        try:
            self._listener.close()
        except OSError:
            pass
        if ray.is_initialized():  # else the launchers went with the cluster (and a call would start a Ray)
            for actor, _ in launchers:
                try:
                    actor.close.remote()
                except Exception:  # noqa: BLE001 - the cluster is going: the actor goes with it
                    pass
        super().shutdown()

    # -- inside ---------------------------------------------------------------------------------------

    def _start_workers(self) -> None:
        here = self._slots.get(self._here)
        self._workers.extend(self._spawn() for _ in range(here.workers if here else 0))
        threading.Thread(target=self._accept, name="raypipe-node-workers", daemon=True).start()
        self._start_launchers()

    def _start_launchers(self) -> None:
        """A launcher for each other node with slots and none running (holding the lock). With no node
        to run on at all (a preprocessing group scaled to zero), one launcher of one worker goes to
        wherever Ray can place it: its pending request is what asks an autoscaler for a node, and once
        the node is there, the next refresh gives it its slots and ends this one."""
        if not self._slots:
            if ANY_NODE not in self._launchers:
                options = {"num_cpus": self._task_cpus, "resources": dict(self._resources)}
                actor = _Launcher.options(**options).remote(*self.address, self._secret, 1)
                self._launchers[ANY_NODE] = (actor, actor.run.remote())
            return
        if ANY_NODE in self._launchers:
            actor, _ = self._launchers.pop(ANY_NODE)
            actor.close.remote()  # its worker's chunk goes to the others
        for node, share in self._slots.items():
            if node == self._here or node in self._launchers:
                continue
            options = {
                "num_cpus": share.cpus,
                "resources": {k: round(share.workers * v, 4) for k, v in self._resources.items()},
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
            }
            actor = _Launcher.options(**options).remote(*self.address, self._secret, share.workers)
            self._launchers[node] = (actor, actor.run.remote())

    def _drop_ended_launchers(self) -> None:
        if not self._launchers:
            return
        runs = {ref: node for node, (_, ref) in self._launchers.items()}
        ended, _ = ray.wait(list(runs), num_returns=len(runs), timeout=0)
        for ref in ended:
            node = runs[ref]
            log.warning("the raypipe launcher on node %s ended; its node gets another if it is still there", node)
            del self._launchers[node]

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed by shutdown
                return
            threading.Thread(target=self._admit, args=(conn,), name="raypipe-node-admit", daemon=True).start()

    def _admit(self, conn: socket.socket) -> None:
        """A connection becomes a worker once it proved it knows the secret (nothing of it is read
        before)."""
        try:
            prove_server(conn, self._secret)
            tune_stream_socket(conn)
        except (PeerAuthError, OSError) as exc:
            log.warning("refused a connection to raypipe's worker socket: %s", exc)
            conn.close()
            return
        with self._lock:
            if self._closed:
                conn.close()
                return
            worker = _Worker(None, conn, inline=True)
            self._workers.append(worker)
            self.remote_workers += 1
            threading.Thread(target=self._read, args=(worker,), name="raypipe-node-worker", daemon=True).start()
            self._dispatch()

