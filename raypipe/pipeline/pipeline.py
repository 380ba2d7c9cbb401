"""A dataset plus its transform: what a rank's chunk stream is made from (its plan, stage, budget and
workers). The consumer that turns the stream into batches is ``epoch_source.EpochSource``.

    listing rows ─▶ RankPlan (plan/order.py) ─▶ ChunkStream (stream.py): tasks, in order ─────▶ EpochSource
    (sources/)      this rank's chunks           read + decode + augment on any node          Packer ─▶ batches
                    of every epoch                                                            EpochLedger counts

"""

from __future__ import annotations

import dataclasses
import logging
import os

from raypipe import runtime
from raypipe.config import DecodeConfig, EvalAugment, ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline.backend import consumer_pipeline
from raypipe.pipeline.budget import (
    RankBudget,
    check_task_fits,
    eligible_resources,
    rank_budget,
    runs_tasks_here,
    tasks_for_share,
)
from raypipe.pipeline.elastic import ElasticWidth, bounds_for, start_width
from raypipe.pipeline.epoch_source import EpochRun
from raypipe.pipeline.pack import BatchSpec
from raypipe.pipeline.stream import ChunkStream
from raypipe.plan.order import RankPlan
from raypipe.plan.position import PlanIdentity, shard_layout_digest
from raypipe.plan.span import RankSpan
from raypipe.settings import Settings, current, use
from raypipe.sources import ListingOptions, open_source
from raypipe.sources.table import TableColumns
from raypipe.sources.transport.remote import reads_store_objects
from raypipe.stages.augment import StageSpec
from raypipe.workers.local import LocalWorkers, local_cpus, shared_memory_dir
from raypipe.workers.ray_tasks import RayTasks
from raypipe.workers.slabs import slab_room

__all__ = ["Pipeline"]

log = logging.getLogger(__name__)


class Pipeline:
    """A dataset plus its transform, ready to run epochs on the connected Ray cluster (or, not connected,
    on local worker processes: ``ExecutionConfig.backend``). Constructing it lists the dataset (unless
    given a listing) and nothing else.

    Args:
        source: a path or URI, a listing (``SourceRows``, ``ShardListing``) or a ``ray.data.Dataset``.
        augment: the transform, ``TrainAugment`` or ``EvalAugment``.
        config, execution, decode: the batches, how they are made, how bytes are decoded (None: the
            defaults); ``execution.cpus_per_task`` left to the dataset is decided here.
        content_digest: also hash each epoch's pixels (``EpochReport.content_sha256``).
        listing: the ``ListingOptions`` a path is listed with (``open_source``).
        settings: what it lists with and its workers read with (``raypipe.settings``); by default those
            in force when it is made (``raypipe.settings.current()``: the ``RAYPIPE_*`` variables).

    Raises:
        ValueError: a ``ray.data.Dataset`` with a backend that does not run Ray tasks; and, as the
            other errors below, what ``open_source`` raises for ``source`` and ``listing``.
        TypeError, ConnectionError, TimeoutError, OSError: see ``open_source``.
    """

    def __init__(
        self,
        source,  # a path or URI, a listing (SourceRows, ShardListing) or a ray.data.Dataset
        augment: TrainAugment | EvalAugment,
        *,
        config: PipelineConfig | None = None,
        execution: ExecutionConfig | None = None,
        decode: DecodeConfig | None = None,
        content_digest: bool = False,
        listing: ListingOptions | None = None,
        settings: Settings | None = None,
    ):
        self.settings = current() if settings is None else settings
        if settings is None:
            self.rows = open_source(source, options=listing)  # a listing is taken as it is
        else:
            with use(settings):
                self.rows = open_source(source, options=listing)
        self.augment = augment
        self.config = config or PipelineConfig()
        ex = execution or ExecutionConfig()
        # ``cpus_per_task`` left to the dataset (None) is decided here, once: all that sizes and asks for
        # tasks reads it from this config
        cpus = ex.cpus_per_task_for(store_objects=reads_store_objects(self.rows, self.settings))
        self.execution = dataclasses.replace(ex, cpus_per_task=cpus)
        if self.rows.kind == "raydata" and not self.runs_ray_tasks():
            raise ValueError(
                f"backend={ex.backend!r}: a Ray Dataset's image bytes are in Ray's object store, which only Ray "
                "tasks can read; run with backend='ray' (or 'auto' in a process connected to Ray)"
            )
        self.decode = decode or DecodeConfig()
        self.content_digest = content_digest
        h, w = augment.input_size
        self.batch_spec = BatchSpec(self.config.batch_size, (h, w, 3))
        self._columns: TableColumns | None = None
        self._identity: PlanIdentity | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def num_batches(self, world_size: int = 1, rank: int = 0) -> int:
        """Batches of ``rank`` per epoch (exact when nothing is skipped)."""
        per_rank = len(self.plan(rank, world_size))
        b = self.config.batch_size
        return per_rank // b if self.config.drop_last else -(-per_rank // b)

    def plan(self, rank: int = 0, world_size: int = 1) -> RankPlan:
        cfg = self.config
        return RankPlan.for_rows(
            self.rows,
            seed=cfg.seed,
            shuffle=cfg.shuffle,
            rank=rank,
            world_size=world_size,
            chunk_rows=self.execution.chunk_rows_for(cfg.batch_size),
            window_rows=cfg.shuffle_window,
        )

    def identity(self) -> PlanIdentity:
        """What this pipeline's orders and batches depend on besides epoch and ranks (made once: it hashes
        the listing), which a saved position must match (``raypipe.plan.position``)."""
        if self._identity is None:
            cfg, runs = self.config, self.plan().runs
            self._identity = PlanIdentity(
                rows=len(self.rows),
                listing=self.rows.digest(),
                shards=shard_layout_digest(runs.sizes if runs is not None else None),
                seed=cfg.seed,
                shuffle=cfg.shuffle,
                shuffle_window=cfg.shuffle_window,
                batch_size=cfg.batch_size,
                drop_last=cfg.drop_last,
            )
        return self._identity

    def stage_spec(self, epoch: int) -> StageSpec:
        ex = self.execution
        return StageSpec(
            kind=self.rows.kind,
            root=self.rows.root,
            augment=self.augment,
            decode=self.decode,
            seed=self.config.seed,
            epoch=epoch,
            image_column=self.rows.image_column,
            nice=ex.worker_nice,
            sched_idle=bool(ex.worker_sched_idle),  # None: off here
            settings=self.settings,
        )

    def budget(self, *, world_size: int = 1, reserved_cpus: float = 0.0) -> RankBudget:
        """This rank's share of the connected cluster (``raypipe.pipeline.budget``). ``reserved_cpus``
        (what the trainers and feeders hold) is taken from the tasks' nodes only where this process's
        node is one of them (``runs_tasks_here``): trainers on GPU nodes hold none of the CPU nodes'."""
        ex = self.execution
        cpus, store = eligible_resources(ex.resources)
        reserved_cpus = reserved_cpus if runs_tasks_here(ex.resources) else 0.0
        return self._rank_budget(cpus, reserved_cpus, world_size, store, self._chunk_bytes(world_size))

    def _chunk_bytes(self, world_size: int) -> int:
        """The images of the largest chunk a rank of ``world_size`` runs, in bytes."""
        h, w, c = self.batch_spec.image_shape
        return self.plan(0, world_size).max_chunk_rows * h * w * c

    def _rank_budget(self, cpus: float, reserved_cpus: float, world_size: int, store_bytes: int, chunk_bytes: int):
        ex = self.execution
        return rank_budget(
            eligible_cpus=cpus,
            reserved_cpus=reserved_cpus,
            world_size=world_size,
            cpus_per_task=ex.cpus_per_task,
            prefetch_chunks=ex.prefetch_chunks,
            num_tasks=ex.num_tasks,
            store_bytes=store_bytes,
            chunk_bytes=chunk_bytes,
        )

    def uses_ray(self) -> bool:
        """Whether this pipeline's tasks run on a Ray cluster (``ExecutionConfig.backend``)."""
        return runtime.runs_on_ray(self.execution.backend)

    def runs_ray_tasks(self) -> bool:
        """Whether its chunks are Ray tasks, whose results are Ray objects (else local or node workers'
        slabs of this process's memory)."""
        return self.uses_ray() and self.execution.backend != "nodes"

    def node_slots(self, *, rank: int, world_size: int, reserved_cpus: float) -> dict:
        """Where this rank's node workers run (``raypipe.workers.node.node_slots``) on the
        cluster as it is now; ``reserved_cpus`` are held on this process's node only."""
        import ray

        from raypipe.workers.node import eligible_nodes, node_slots

        ex = self.execution
        return node_slots(
            eligible_nodes(ex.resources),
            here=ray.get_runtime_context().get_node_id(),
            reserved_cpus=reserved_cpus,
            cpus_per_task=ex.cpus_per_task,
            rank=rank,
            world_size=world_size,
            workers=ex.num_tasks,
        )

    def local_budget(self, *, world_size: int = 1, reserved_cpus: float = 0.0) -> tuple[RankBudget, int, str]:
        """This rank's share of this machine for local workers: (budget, worker processes, the directory
        of ``shared_memory_dir``); the chunks in flight are sized by the room for their slabs
        (``slab_room``: the memory available, or that directory's free space). The machine's ranks share
        its cores (``LOCAL_WORLD_SIZE``, as torchrun sets it). The budget is computed as on a private
        local Ray (``budget``), and the workers are as many as such a Ray would run at once: one per
        ``cpus_per_task`` of the rank's cores, the trainer's ``reserved_cpus`` not taken from them (it
        holds no Ray CPU either), rounded to the nearest whole number as on Ray (``tasks_for_share``), at most
        the chunks in flight. In a process on Ray (a feeder, a training worker) the cores are at most
        those its node declares to Ray: ``connect(num_cpus=2)`` on a larger machine runs two."""
        ex = self.execution
        chunk_bytes = self._chunk_bytes(world_size)
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        cpus = local_cpus()
        declared = runtime.node_cpus()
        if declared is not None:
            cpus = max(1, min(cpus, int(round(declared))))
        wanted = (ex.num_tasks or cpus) + ex.prefetch_chunks
        directory, free = shared_memory_dir(2 * wanted * chunk_bytes)
        free = slab_room(free)
        budget = self._rank_budget(cpus, reserved_cpus, ranks_here, free, chunk_bytes)
        if ex.num_tasks is not None:
            count = ex.num_tasks
        else:
            count = min(budget.in_flight, tasks_for_share(cpus / ranks_here, ex.cpus_per_task))
        return budget, count, directory

    def columns(self) -> TableColumns:
        """The listing's columns as each chunk's rows are taken from them (``take(idx)``), made once:
        about the table's own bytes (``raypipe.sources.table.TableColumns``)."""
        if self._columns is None:
            self._columns = self.rows.columns()
        return self._columns

    def stream(self, span: RankSpan | None = None, *, segments=None) -> ChunkStream:
        """The chunks of ``span``'s rank (default: the only one) for its epochs ``start_epoch`` … ``end_epoch``
        (exclusive; None: no end); ``segments``: the positions of ``start_epoch``'s order to run (None:
        the rank's slice)."""
        span = span or RankSpan()
        if self.execution.backend == "auto":
            self.columns()  # made once here: the copy below shares them
            decided = consumer_pipeline(self)  # on a cluster joined: node workers, or Ray tasks
            if decided is not self:
                return decided.stream(span, segments=segments)
        world_size, reserved_cpus = span.world_size, span.reserved_cpus
        ex = self.execution
        elastic = None
        if ex.backend == "nodes":
            workers, budget = self._node_workers(span)
            if workers.elastic:
                elastic = ElasticWidth(workers, bounds_for(ex))
        elif self.uses_ray():
            options: dict = {"num_cpus": ex.cpus_per_task}
            if ex.resources:
                options["resources"] = dict(ex.resources)

            def budget() -> RankBudget:  # asked once the cluster is up, then again as it changes
                check_task_fits(ex)
                return self.budget(world_size=world_size, reserved_cpus=reserved_cpus)

            workers = RayTasks(options)
        else:
            local, count, directory = self.local_budget(world_size=world_size, reserved_cpus=reserved_cpus)
            workers = LocalWorkers.shared(count, directory, prefetch_chunks=ex.prefetch_chunks)

            def budget() -> RankBudget:
                return local

        return ChunkStream(
            self.columns(),
            self.plan(span.rank, world_size),
            self.stage_spec,
            budget,
            workers,
            start_epoch=span.start_epoch,
            end_epoch=span.end_epoch,
            segments=segments,
            elastic=elastic,
        )

    def _node_workers(self, span: RankSpan):
        """``backend="nodes"``: this process's ``NodeWorkers`` for this placement, and the rank's budget
        (its workers are those its slots give, the chunks in flight those and ``prefetch_chunks``)."""
        import ray

        from raypipe.workers.node import NodeWorkers

        runtime.wait_connected()  # a connect(wait=False) under way (``raypipe run``) finishes first
        if not ray.is_initialized():
            raise RuntimeError("backend='nodes' runs on a Ray cluster: call raypipe.connect() (or ray.init) first")
        ex = self.execution
        check_task_fits(ex)

        def slots() -> dict:
            return self.node_slots(rank=span.rank, world_size=span.world_size, reserved_cpus=span.reserved_cpus)

        key = (
            tuple(sorted(ex.resources.items())),
            ex.cpus_per_task,
            ex.num_tasks,
            span.rank,
            span.world_size,
            span.reserved_cpus,
            ex.elastic,
            ex.min_cpus,
            ex.max_cpus,
        )
        here = ray.get_runtime_context().get_node_id()
        directory = shared_memory_dir(0)[0]

        def make() -> NodeWorkers:
            # elastic: from the rank's share of the nodes there are, within its bounds
            width = start_width(sum(s.workers for s in slots().values()), bounds_for(ex)) if ex.elastic else None
            return NodeWorkers(
                slots,
                here,
                directory,
                resources=ex.resources,
                task_cpus=ex.cpus_per_task,
                prefetch_chunks=ex.prefetch_chunks,
                width=width,
            )

        pool = NodeWorkers.shared_for(key, make)

        def budget() -> RankBudget:
            workers = max(1, pool.count)
            return RankBudget(
                workers=workers,
                in_flight=workers + ex.prefetch_chunks,
                cpus=workers * ex.cpus_per_task,
                task_cpus=ex.cpus_per_task,
            )

        return pool, budget

    def epoch(self, epoch: int, *, rank: int = 0, world_size: int = 1) -> EpochRun:
        """One epoch on its own (``report`` once iterated)."""
        return EpochRun(self, epoch, rank=rank, world_size=world_size)
