"""NodeWorkers: a rank's augmentation in raypipe's own worker processes on every node that may run it,
their images streamed to the consumer over TCP (``ExecutionConfig(backend="nodes")``).

A Ray task's result crosses nodes through Ray's object transfer: put into the store of the node that
made it, pulled by the consumer's node, read there, at several times the CPU per image of a TCP stream
of the same bytes (docs/performance.md; ``python bench/profiles.py cross-node``). So here each node
runs the local path's worker processes
(``raypipe.workers.worker_process``) and each chunk's images go straight from the worker that made
them into the consumer's slab:

- On the consumer's node the workers are ``LocalWorkers``' own: a Unix socket, the slab passed as a
  descriptor, no copy.
- On every other node a launcher actor (``launcher.Launcher``, pinned to the node, holding the CPUs its workers
  use, so that Ray schedules nothing else onto them and an autoscaler sees them busy) starts the
  node's share of workers. Each connects to the consumer's listening socket on its node's address,
  both ends prove they know the pool's secret (``raypipe.workers.peer_auth``), and from then on the
  requests and answers are those of a local worker, with a chunk's images sent as raw bytes after its
  answer and received into the chunk's slab.
- The slabs are the consumer's, so a feeder hands a batch over to the trainer as the slab's descriptor
  (``raypipe.workers.handover``) as it does on one node.

While no node offers the tasks' resources (a preprocessing group scaled to zero), one launcher of one
worker asks Ray for any node that does: its pending request is what an autoscaler acts on.

A node that is lost (its launcher ends, the connection drops or goes quiet for half a minute) takes
its workers with it (a worker ends when its launcher does); the chunks they held go to the other
workers, as a dead local worker's do, and the same per-sample seeds give the same images. A worker
that dies alone is restarted by its launcher. Every ``BUDGET_REFRESH_S`` (the stream's budget refresh)
the pool looks at the cluster again: a node that joined, or whose launcher ended, gets one.

Elastic (``set_width``), a rank's width is what its controller wants rather than its share of the
nodes there are: this node's workers up to its slots, and one-worker launchers placed wherever Ray
finds the resources for the rest. Those Ray cannot place yet are pending demand, which an autoscaler
acts on, and which adds up (never multiplies) over ranks; a narrower width ends pending launchers
first, then those on the node where the rank has the fewest, so whole nodes go idle.

Otherwise each rank's workers are placed by ``placement.node_slots``. The pool is a ``LocalWorkers`` inside
(this node's processes, other nodes' adopted connections); this class places, launches and admits.
"""

from __future__ import annotations

import atexit
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Mapping

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raypipe.workers.launcher import Launcher
from raypipe.workers.local import LocalWorkers
from raypipe.workers.peer_auth import PeerAuthError, new_secret, prove_server, tune_stream_socket
from raypipe.workers.placement import EligibleNode, NodeShare, eligible_nodes, node_slots
from raypipe.workers.reach import HOST_ENV, listen_address

__all__ = [
    "NodeWorkers",
    "EligibleNode",
    "NodeShare",
    "eligible_nodes",
    "node_slots",
    "FIRST_WORKER_WAIT_S",
    "HOST_ENV",
    "ANY_NODE",
]

log = logging.getLogger(__name__)

# How long the consumer makes chunks itself while no worker has answered yet (their nodes' Python
# starts and imports the stage); after it, chunks wait in the queue for the workers.
FIRST_WORKER_WAIT_S = 60.0
# The key of the launcher that asks for any node, while no node offers the tasks' resources.
ANY_NODE = "any"


class NodeWorkers:
    """A rank's workers on every node it may use (see the module doc); a ``Workers``. ``slots_fn()`` says
    how many on each (``node_slots``), ``here`` is this process's node, whose workers are local ones;
    each launcher asks for its workers' CPUs and ``resources`` (per worker)."""

    queues_while_starting = True
    _shared: NodeWorkers | None = None
    _shared_key: tuple | None = None
    _shared_lock = threading.Lock()

    def __init__(
        self,
        slots_fn: Callable[[], dict[str, NodeShare]],
        here: str,
        directory: str,
        *,
        resources: Mapping[str, float],
        task_cpus: float = 1.0,
        prefetch_chunks: int = 0,
        width: int | None = None,
    ):
        """``width``: elastic from that width (``set_width``); None: the rank's slots."""
        self._slots_fn, self._here = slots_fn, here
        self._resources, self._task_cpus = dict(resources), task_cpus
        self._slots = slots_fn()
        self.width = width
        self._remote: list[tuple[object, object, object]] = []  # elastic: (launcher, its run(), its node())
        count, processes = self._counts(self._slots)
        self.pool = LocalWorkers(count, directory, prefetch_chunks=prefetch_chunks, processes=processes)
        address = listen_address(here)
        self._secret = new_secret()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.create_server((address, 0), family=family, backlog=128)
        self.address = (address, self._listener.getsockname()[1])
        self._lock = threading.Lock()  # the placement and the launchers
        self._launchers: dict[str, tuple[object, object]] = {}  # node id -> (actor, its run() reference)
        self._started = self._closed = False
        self._first_wait_until: float | None = None

    def _counts(self, slots: dict[str, NodeShare]) -> tuple[int, int]:
        """(workers in all, of them on this node): the rank's slots, or, elastic, its width with this
        node's part of it up to this node's slots."""
        here = slots.get(self._here)
        local = here.workers if here else 0
        if self.width is not None:
            return self.width, min(local, self.width)
        return sum(s.workers for s in slots.values()), local

    @property
    def elastic(self) -> bool:
        return self.width is not None

    def set_width(self, width: int) -> None:
        """Elastic: run ``width`` workers from now on (see the module doc)."""
        if width < 1:
            raise ValueError(f"width={width!r}: expected a positive int")
        with self._lock:
            self.width = width
            count, processes = self._counts(self._slots)
        self.pool.resize(count, processes=processes)
        with self._lock:
            if self._started and not self._closed:
                self._fit_remote(count - processes)

    def ready_workers(self) -> int:
        """Workers running now: those that answered, here and on other nodes."""
        return self.pool.ready_count()

    @property
    def pending_launchers(self) -> int:
        """Elastic: launchers that Ray has not placed yet (the rank's demand on the cluster)."""
        with self._lock:
            refs = [node for _, _, node in self._remote]
        if not refs:
            return 0
        placed, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return len(refs) - len(placed)

    @property
    def count(self) -> int:
        return self.pool.count

    @property
    def slots(self) -> dict[str, NodeShare]:
        return dict(self._slots)

    @property
    def launched_nodes(self) -> set[str]:
        """The nodes with a launcher (``ANY_NODE`` for the one that asks for any node)."""
        with self._lock:
            return set(self._launchers)

    @classmethod
    def shared_for(cls, key: tuple, make: Callable[[], NodeWorkers]) -> NodeWorkers:
        """This process's pool for ``key`` (the pipeline's placement), made on first use; a pool for
        another key is shut down first."""
        with cls._shared_lock:
            pool = cls._shared
            if pool is not None and not pool._closed and cls._shared_key == key:
                return pool
            cls._shared, cls._shared_key = None, None
        if pool is not None:
            pool.shutdown()
        pool = make()
        with cls._shared_lock:
            cls._shared, cls._shared_key = pool, key
        atexit.register(pool.shutdown)
        return pool

    @classmethod
    def shutdown_shared(cls) -> None:
        with cls._shared_lock:
            pool, cls._shared, cls._shared_key = cls._shared, None, None
        if pool is not None:
            pool.shutdown()

    # -- what the stream asks -----------------------------------------------------------------------

    def starting(self) -> bool:
        """As ``LocalWorkers``, and until the first worker answers (at most ``FIRST_WORKER_WAIT_S``):
        the consumer makes chunks itself while the nodes start theirs."""
        if self.pool.starting():
            return True
        if self.pool.ready_count():
            return False
        if self._first_wait_until is None:
            self._first_wait_until = time.monotonic() + FIRST_WORKER_WAIT_S
        if time.monotonic() < self._first_wait_until:
            return True
        log.warning("no raypipe worker answered within %.0f s of the start; chunks wait for them", FIRST_WORKER_WAIT_S)
        self._first_wait_until = math.inf
        return False

    def release_start(self) -> None:
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
            self.pool.release_start()
            threading.Thread(target=self._accept, name="raypipe-node-workers", daemon=True).start()
            self._start_launchers()

    def size_tasks(self, cpus: float) -> None:
        """The stream's budget refresh: launchers that ended are dropped, and nodes (new, or whose
        launcher ended) that the placement gives workers get one."""
        if not self._started or self._closed:
            return
        slots = self._slots_fn()
        with self._lock:
            self._slots = slots
            count, processes = self._counts(slots)
        self.pool.resize(count, processes=processes)
        with self._lock:
            self._drop_ended_launchers()
            self._start_launchers()

    def set_up(self, spec, count: int) -> list:
        return self.pool.set_up(spec, count)

    def submit(self, rows, spec):
        self.release_start()  # a stream that did not make chunks itself first
        return self.pool.submit(rows, spec)

    def all_done(self, tasks) -> bool:
        return self.pool.all_done(tasks)

    def wait(self, task, timeout: float) -> bool:
        return self.pool.wait(task, timeout)

    def get(self, task):
        return self.pool.get(task)

    def cancel(self, task) -> None:
        self.pool.cancel(task)

    def shared_ref(self, task) -> None:
        return self.pool.shared_ref(task)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            launchers, self._launchers = list(self._launchers.values()), {}
            remote, self._remote = [actor for actor, _, _ in self._remote], []
        try:
            self._listener.close()
        except OSError:
            pass
        if ray.is_initialized():  # else the launchers went with the cluster (and a call would start a Ray)
            for actor, _ in launchers:
                try:
                    actor.close.remote()  # asynchronous: the pool is shut down before its workers end
                except Exception:  # noqa: BLE001 - the cluster is going: the actor goes with it
                    pass
            for actor in remote:  # ended, not closed: a pending one's demand must go at once
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001 - the cluster is going: the actor goes with it
                    pass
        self.pool.shutdown()  # marks the pool closed first: the connections' ends are not losses

    # -- inside ---------------------------------------------------------------------------------------

    def _fit_remote(self, count: int) -> None:
        """Elastic: ``count`` one-worker launchers wherever Ray places them (holding the lock): more are
        asked for, or the surplus ended, pending ones first, then those on the node where this rank has
        the fewest (so that whole nodes go idle)."""
        if self._remote:  # those whose run() ended went with their node
            runs = [run for _, run, _ in self._remote]
            ended = set(ray.wait(runs, num_returns=len(runs), timeout=0)[0])
            self._remote = [r for r in self._remote if r[1] not in ended]
        while len(self._remote) < count:
            options = {"num_cpus": self._task_cpus, "resources": dict(self._resources)}
            actor = Launcher.options(**options).remote(*self.address, self._secret, 1)
            self._remote.append((actor, actor.run.remote(), actor.node.remote()))
        if len(self._remote) <= count:
            return
        refs = [node_ref for _, _, node_ref in self._remote]
        placed = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        nodes = {i: ray.get(ref) if ref in placed else None for i, ref in enumerate(refs)}
        per_node: dict[str, int] = {}
        for node in nodes.values():
            if node is not None:
                per_node[node] = per_node.get(node, 0) + 1
        order = sorted(nodes, key=lambda i: (nodes[i] is not None, per_node.get(nodes[i], 0), nodes[i] or ""))
        for i in sorted(order[: len(self._remote) - count], reverse=True):
            actor, _, _ = self._remote.pop(i)
            if nodes[i] is not None:  # placed: its worker's connection ends, on purpose
                self.pool.retire_remote()
            ray.kill(actor)  # a pending one's demand goes with it; a placed one's worker ends with it

    def _start_launchers(self) -> None:
        """A launcher for each other node with slots and none running (holding the lock); elastic, the
        one-worker launchers of its width (``_fit_remote``). With no node
        to run on at all (a preprocessing group scaled to zero), one launcher of one worker goes to
        wherever Ray can place it: its pending request is what asks an autoscaler for a node, and once
        the node is there, the next refresh gives it its slots and ends this one."""
        if self.width is not None:
            count, processes = self._counts(self._slots)
            self._fit_remote(count - processes)
            return
        if not self._slots:
            if ANY_NODE not in self._launchers:
                options = {"num_cpus": self._task_cpus, "resources": dict(self._resources)}
                actor = Launcher.options(**options).remote(*self.address, self._secret, 1)
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
            actor = Launcher.options(**options).remote(*self.address, self._secret, share.workers)
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
        if not self.pool.adopt(conn):
            conn.close()
