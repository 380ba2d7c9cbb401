"""FeederSource: an ``EpochSource`` that runs in a helper process beside the trainer.

The consumer side of a rank's execution (submitting chunks, fetching them, packing batches,
accounting) is Python work; in the trainer's process it competes with the training loop for the GIL.
Here all of it runs in a feeder actor on the trainer's node, and the trainer's share per batch is one
actor call and one zero-copy ``ray.get`` (which the ``DeviceLoader`` then copies into pinned memory,
releasing the GIL). See docs/performance.md for what it saves on a GPU machine.

A batch that is a run of whole rows of one chunk (every batch of a clean chunk whose rows are a
multiple of the batch size: the usual case) is handed over as that chunk's Ray object and the run's
bounds, and the trainer reads the rows from the object store where the task put them: no copy of
the images in the feeder, which would otherwise put every batch into the object store a second time.
Other batches (rows packed across chunks, around skipped rows) are returned as arrays.

Where the feeder's augmentation runs is decided in the feeder (``raypipe.pipeline.backend``), with
what only the process that made the ``FeederSource`` knows: whose Ray it is (``raypipe.runtime.connection``),
handed to the feeder. On raypipe's private local Ray (``raypipe.connect()`` with no cluster to join)
every task would land on this one machine, which nothing will join, so the feeder runs them on local
worker processes instead, as an ``EpochSource`` without Ray does: a Ray task costs more CPU per image
than the whole local path (its result is put into the object store, Ray's core-worker threads run
beside it; docs/performance.md). Their chunks are slabs of shared memory, and a batch of one chunk goes
to the trainer as the slab's descriptor (``raypipe.workers.handover``): no copy there either. On a
cluster it joined, the feeder's chunks are made by raypipe's own worker processes on the cluster's
nodes: their images arrive in this process's slabs (``raypipe.workers.node``) and go to the trainer as
local workers' do; ``ExecutionConfig(backend="ray")`` makes them Ray tasks, spread over the nodes as
they come and go, and ``backend="local"`` keeps them on the feeder's own node.

The feeder runs exactly the ``EpochSource`` the trainer would have run (same shard, same order, same
accounting), so the batches are identical either way.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Iterator

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raypipe import runtime
from raypipe.pipeline.accounting import EpochReport
from raypipe.pipeline.backend import Decision
from raypipe.pipeline.epoch_source import EpochSource
from raypipe.pipeline.pipeline import Pipeline
from raypipe.plan.span import RankSpan
from raypipe.workers.handover import HandoverError, SlabReceiver, SlabSender
from raypipe.workers.local import LocalWorkers
from raypipe.workers.node import NodeWorkers
from raypipe.workers.slabs import SlabPool, slab_of

__all__ = ["FeederSource", "FeederDiedError", "FEEDER_CPUS", "feeder_decision"]

log = logging.getLogger(__name__)

# The CPU a feeder declares (and its rank's budget leaves out): fetching, packing and handing out
# ~1000 batches/s of work is a fraction of a core.
FEEDER_CPUS = 0.25


class FeederDiedError(RuntimeError):
    """The feeder process ended (killed, out of memory); the epoch cannot continue."""


@ray.remote(num_cpus=FEEDER_CPUS, max_restarts=0)
class _Feeder:
    """Holds the rank's ``EpochSource``; each ``next()`` returns ``(kind, value)``: ``("batch", dict)``,
    ``("end", EpochReport)`` when the epoch ended, ``("error", exception)`` when it failed."""

    def __init__(self, pipeline: Pipeline, span: RankSpan, connection: str):
        from raypipe.runtime import tune_consumer_process

        tune_consumer_process()  # this process is raypipe's own: see the function
        # decided on this node, with the connection it was told, before the sender below
        decision = pipeline.decide(told=connection, needs_ray=True)
        self.source = EpochSource(pipeline, span=span, decision=decision)
        self.it: Iterator | None = None
        self.local = decision.backend != "ray"
        # local (or node) workers' chunks go to the trainer as slabs (see the module's doc)
        self.sender = SlabSender() if self.local else None
        if self.local:
            SlabPool.populate_views = False  # this process is the feeder's alone: it passes the images on unread

    def handover_address(self) -> tuple[str, bytes] | None:
        return self.sender.address() if self.sender is not None else None

    def accept_handover(self, connected: bool, timeout_s: float) -> bool:
        """Take the trainer's hand-over connection; without one, batches go by value."""
        if self.sender is not None and not (connected and self.sender.accept(timeout_s)):
            self.sender.close()
            self.sender = None
        return self.sender is not None

    def begin(self, epoch: int) -> int:
        """Start ``epoch``; return the batches of it taken before (a resumed epoch's), which the
        trainer's count starts from."""
        self.end_epoch()
        self.source.set_epoch(epoch)
        self.it = iter(self.source)
        return self.source.state_dict()["batches"]

    def next(self, released: list[int] = ()) -> tuple[str, object]:
        """The next batch; ``released``: tokens of slab batches the trainer no longer views."""
        if self.sender is not None:
            self.sender.release(released)
        if self.it is None:  # a call queued behind the epoch's end (the consumer prefetches)
            return ("idle", None)
        try:
            batch = next(self.it)
            chunk = self.source.chunk
            rows = _rows_of(batch["image"], chunk)
            rest = {k: v for k, v in batch.items() if k != "image"}  # labels, ids, fields: by value
            if rows is not None and chunk.ref is not None:
                return ("rows", (chunk.ref, rows, rest))
            slab = slab_of(chunk.block["image"]) if rows is not None and self.sender is not None else None
            if slab is not None:
                token = self.sender.send(slab.fd, keep=chunk.block["image"])
                row_shape = chunk.block["image"].shape[1:]
                return ("slab", (token, rows, row_shape, rest))
            return ("batch", batch)
        except StopIteration:
            self.it = None
            return ("end", self.source.last_report)
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which re-raises it
            self.it = None
            return ("error", exc)

    def state(self, batches: int | None, next_epoch: int) -> dict:
        if batches is None:  # between epochs: the trainer's next one
            self.source.set_epoch(next_epoch)
        return self.source.state_dict(batches)

    def load(self, state) -> int:
        self.end_epoch()
        self.source.load_state_dict(state)
        return self.source.next_epoch

    def end_epoch(self) -> None:
        """Stop the current epoch early (the trainer stopped reading it)."""
        if self.it is not None:
            self.it.close()
            self.it = None

    def close(self) -> None:
        self.end_epoch()
        self.source.close()
        if self.sender is not None:
            self.sender.close()
        if self.local:
            # the process is the feeder's alone: its workers end with it, before Ray ends the process
            # (which kills them first, and the pool would take that for a worker lost mid-chunk)
            LocalWorkers.shutdown_shared()
            NodeWorkers.shutdown_shared()


def feeder_decision(pipeline: Pipeline, connection: str) -> Decision:
    """Where a feeder told ``connection`` runs ``pipeline``'s tasks, as the process that connected sees
    it: the other nodes' reach is the feeder's to ask, on its node (here it is taken as reachable)."""
    return pipeline.decide(told=connection, needs_ray=True, probe=False)


def _rows_of(image: np.ndarray, chunk) -> tuple[int, int] | None:
    """(start, stop) when ``image`` is rows ``start:stop`` of ``chunk``'s images."""
    if chunk is None or chunk.block is None:
        return None
    whole = chunk.block["image"]
    offset = image.__array_interface__["data"][0] - whole.__array_interface__["data"][0]
    row = whole.strides[0]
    if not (0 <= offset < whole.nbytes and offset % row == 0 and image.strides == whole.strides):
        return None  # a packed copy
    start = offset // row
    return start, start + len(image)


class FeederSource:
    """Drop-in for ``EpochSource`` (same samples, same ``reports``) whose epochs run in a feeder process
    (a Ray actor) on this node.

    Batches arrive as read-only arrays viewing Ray's object store (the ``DeviceLoader`` copies them
    into its own buffers). ``close()`` ends the feeder; a ``DeviceLoader`` closes its source itself.

    Args:
        pipeline: the ``Pipeline`` the feeder runs.
        span: the rank's ``RankSpan``, or its fields as keywords, as ``EpochSource`` takes it.
        prefetch: batches requested ahead of the consumer (>= 1).
        timeout_s: how long a call to the feeder (its start, a position, an epoch's start) may wait
            for its answer.
        connection: how the process that connected is on Ray (``raypipe.runtime.connection()``), for
            a ``FeederSource`` made elsewhere (a training worker told it by its driver); None: this
            process's.

    Raises:
        ValueError: an invalid span field or ``prefetch``; on raypipe's private local Ray, a task no
            node can hold.
        TypeError: a keyword that is not a ``RankSpan`` field.
        FeederDiedError: the feeder did not answer within ``timeout_s``, or died.
        Exception: the error of a ``connect(wait=False)`` start that failed.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        span: RankSpan | None = None,
        prefetch: int = 2,
        timeout_s: float = 60.0,
        connection: str | None = None,
        **keywords,
    ):
        span = RankSpan.of(span, **keywords)
        if prefetch < 1:
            raise ValueError(f"prefetch={prefetch}: expected >= 1")
        from raypipe.pipeline.budget import check_task_fits
        from raypipe.runtime import wait_connected

        wait_connected()  # the feeder is a Ray actor: it needs the cluster (connect(wait=False) may be starting it)
        # whose Ray this is, which the feeder (a Ray actor) cannot tell: as given (by a training worker's
        # driver), else this process's
        told = connection if connection is not None else runtime.connection()
        if feeder_decision(pipeline, told).on_ray:
            check_task_fits(pipeline.execution)
        self.pipeline = pipeline
        self.span = span
        self.rank = span.rank
        self.world_size = span.world_size
        self.next_epoch = span.start_epoch
        self.prefetch = prefetch
        self.reports: list[EpochReport] = []
        self.timeout_s = timeout_s
        self.zero_copy_batches = 0  # batches read from their chunk's object, with no copy in the feeder
        # batches the trainer took of the epoch it reads, those before a resume included (None: between epochs)
        self._taken: int | None = None
        # every rank's feeder holds its share, as every rank's trainer does (``reserved_cpus``)
        held = dataclasses.replace(span, reserved_cpus=span.reserved_cpus + FEEDER_CPUS * span.world_size)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._actor = _Feeder.options(scheduling_strategy=here).remote(pipeline, held, told)
        self._receiver: SlabReceiver | None = None
        try:
            self._receiver = self._connect_handover()
        except BaseException:
            self.close()
            raise

    def _connect_handover(self) -> SlabReceiver | None:
        """The hand-over of a feeder on local workers; None for Ray tasks' feeder, or where this process
        cannot reach the feeder's socket (another file system view): its batches then come by value."""
        address = self._get(self._actor.handover_address.remote(), self.timeout_s)
        if address is None:
            return None
        try:
            receiver = SlabReceiver(address, self.timeout_s)
        except OSError as exc:
            receiver = None
            log.warning("cannot reach the raypipe feeder's socket (%s): batches are copied to this process", exc)
        if self._get(self._actor.accept_handover.remote(receiver is not None, self.timeout_s), 2 * self.timeout_s):
            return receiver
        if receiver is not None:
            receiver.close()
            log.warning("the raypipe feeder refused this process's connection: batches are copied to this process")
        return None

    @property
    def runs_on_local_workers(self) -> bool:
        """Whether the feeder's batches come as slabs of local (or node) workers (``feeder_decision``)."""
        return self._receiver is not None

    def __len__(self) -> int:
        return self.pipeline.num_batches(self.world_size, self.rank)

    def set_epoch(self, epoch: int) -> None:
        self.next_epoch = epoch

    @property
    def last_report(self) -> EpochReport | None:
        return self.reports[-1] if self.reports else None

    def state_dict(self, batches: int | None = None) -> dict:
        """This rank's position (``EpochSource.state_dict``): after the batches the trainer took of the
        epoch it reads, or after ``batches`` of them; the feeder keeps the positions of those it made
        ahead."""
        if batches is None:
            batches = self._taken
        return self._get(self._actor.state.remote(batches, self.next_epoch), self.timeout_s)

    def load_state_dict(self, state) -> None:
        """Go on from ``state`` at the next ``iter()`` (``EpochSource.load_state_dict``)."""
        self.next_epoch = self._get(self._actor.load.remote(state), self.timeout_s)
        self._taken = None

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self._actor is None:
            raise RuntimeError("FeederSource is closed")
        actor, epoch = self._actor, self.next_epoch
        self.next_epoch += 1
        taken = self._get(actor.begin.remote(epoch), self.timeout_s)
        pending = collections.deque(actor.next.remote(self._released()) for _ in range(self.prefetch))
        done = False
        self._taken = taken
        try:
            while True:
                kind, value = self._get(pending.popleft())
                if kind == "rows":
                    pending.append(actor.next.remote(self._released()))
                    ref, (start, stop), rest = value
                    self.zero_copy_batches += 1
                    self._taken += 1
                    yield {"image": self._get(ref)["image"][start:stop], **rest}
                elif kind == "slab":
                    token, (start, stop), row_shape, rest = value
                    image = self._view(token, start, stop, row_shape)
                    pending.append(actor.next.remote(self._released()))
                    self.zero_copy_batches += 1
                    self._taken += 1
                    yield {"image": image, **rest}
                elif kind == "batch":
                    pending.append(actor.next.remote(self._released()))
                    self._taken += 1
                    yield value
                elif kind == "end":
                    done = True
                    self._taken = None
                    self.reports.append(value)
                    return
                elif kind == "error":
                    done = True
                    raise value
                else:
                    raise RuntimeError(f"feeder answered {kind!r} during epoch {epoch}")
        finally:
            if not done and self._actor is not None:
                try:  # runs after the queued next() calls; their batches are dropped
                    actor.end_epoch.remote()
                except Exception:  # noqa: BLE001 - Ray already shut down: nothing left to stop
                    pass

    def _released(self) -> list[int]:
        return self._receiver.take_released() if self._receiver is not None else []

    def _view(self, token: int, start: int, stop: int, row_shape) -> np.ndarray:
        try:
            return self._receiver.view(token, start, stop, row_shape)
        except HandoverError as exc:
            raise FeederDiedError(
                f"the raypipe feeder process of rank {self.rank} stopped handing over batches: {exc}"
            ) from exc

    def _get(self, ref, timeout_s: float | None = None):
        try:
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise FeederDiedError(
                f"the raypipe feeder process of rank {self.rank} did not answer in {timeout_s:g} s"
            ) from exc
        except (ray.exceptions.RayActorError, ray.exceptions.OwnerDiedError) as exc:  # a chunk's owner is the feeder
            raise FeederDiedError(
                f"the raypipe feeder process of rank {self.rank} died ({exc.__class__.__name__}); "
                "see the Ray logs of its node (out of memory?)"
            ) from exc

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the feeder's executions (a warmed-up next epoch too) and end its process. Idempotent."""
        actor, self._actor = self._actor, None
        receiver, self._receiver = self._receiver, None
        if receiver is not None:
            receiver.close()  # mappings the caller still holds stay valid
        if actor is None:
            return
        try:
            ray.get(actor.close.remote(), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - dead already, or stuck: it is killed below either way
            pass
        ray.kill(actor)
