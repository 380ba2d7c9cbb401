"""A dataset plus its transform: what a rank's chunk stream is made from (its plan and stage; its workers
and budget are those of the backend that runs it, ``raypipe.pipeline.execution``). The consumer that turns
the stream into batches is ``epoch_source.EpochSource``.

    listing rows ─▶ RankPlan (plan/order.py) ─▶ ChunkStream (stream.py): tasks, in order ─────▶ EpochSource
    (sources/)      this rank's chunks           read + decode + augment on any node          Packer ─▶ batches
                    of every epoch                                                            EpochLedger counts

"""

from __future__ import annotations

import dataclasses
import logging

from raypipe.config import DecodeConfig, EvalAugment, ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline.backend import Decision, decide_here
from raypipe.pipeline.budget import RankBudget
from raypipe.pipeline.epoch_source import EpochRun
from raypipe.pipeline.execution import execution_for, local_budget, ray_budget
from raypipe.pipeline.pack import BatchSpec
from raypipe.pipeline.stream import ChunkStream
from raypipe.plan.order import RankPlan
from raypipe.plan.position import PlanIdentity, shard_layout_digest
from raypipe.plan.span import RankSpan
from raypipe.settings import Settings, current, use
from raypipe.sources import ListingOptions, open_source
from raypipe.sources.label_sets import label_width
from raypipe.sources.table import TableColumns
from raypipe.sources.transport.remote import reads_store_objects
from raypipe.stages.augment import StageSpec
from raypipe.stages.field_values import check_field_transforms
from raypipe.stages.mixture_stage import MixtureSpec

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
        field_transforms: ``{field: fn}``: a picklable callable the workers run on each good sample's
            value of that field (a tokenizer, a JSON parser); numbers or arrays of one shape come out
            packed as one array per batch (``raypipe.stages.field_values``).
        num_classes: a listing with several labels per image (``raypipe.sources.label_sets``): the
            width of each batch's multi-hot ``label`` (None: the listing's own count of classes).

    Raises:
        ValueError: a ``ray.data.Dataset`` with a backend that does not run Ray tasks; a field transform
            of a field the listing does not carry, or not callable; and, as the
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
        field_transforms: dict | None = None,
        num_classes: int | None = None,
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
        self.field_transforms = check_field_transforms(field_transforms, self.rows.fields)
        self.label_classes = label_width(self.rows, num_classes)
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

    def stage_spec(self, epoch: int) -> StageSpec | MixtureSpec:
        """What the workers run epoch ``epoch``'s chunks with (a mixture: one spec per part)."""
        parts = getattr(self.rows, "mixture_parts", None)
        if parts is not None:
            return MixtureSpec(tuple(self._part_spec(part, epoch) for part in parts))
        return self._part_spec(self.rows, epoch)

    def _part_spec(self, rows, epoch: int) -> StageSpec:
        ex = self.execution
        return StageSpec(
            kind=rows.kind,
            root=rows.root,
            augment=self.augment,
            decode=self.decode,
            seed=self.config.seed,
            epoch=epoch,
            image_column=rows.image_column,
            nice=ex.worker_nice,
            sched_idle=bool(ex.worker_sched_idle),  # None: off here
            settings=self.settings,
            fields=rows.fields,  # a mixture's part: its own
            field_transforms=tuple((name, fn) for name, fn in self.field_transforms if name in rows.fields),
            label_classes=self.label_classes,
        )

    def decide(self, *, told: str | None = None, needs_ray: bool = False, probe: bool = True) -> Decision:
        """Where this pipeline's tasks run, in this process (``raypipe.pipeline.backend.decide_backend``):
        ``told``, the connection that the process that connected told this one (a Ray worker's);
        ``needs_ray``, whether the caller needs Ray whatever runs the tasks; ``probe``, whether the other
        nodes' reach may be asked (on a cluster joined; without it, taken as reachable)."""
        return decide_here(self.execution, self.rows.kind, told=told, needs_ray=needs_ray, probe=probe)

    def uses_ray(self) -> bool:
        """Whether this pipeline's tasks run on a Ray cluster (``ExecutionConfig.backend``)."""
        return self.decide(probe=False).on_ray

    def runs_ray_tasks(self) -> bool:
        """Whether its chunks are Ray tasks, whose results are Ray objects (else local or node workers'
        slabs of this process's memory)."""
        return self.decide(probe=False).backend == "ray"

    def budget(self, *, world_size: int = 1, reserved_cpus: float = 0.0) -> RankBudget:
        """This rank's share of the connected cluster (``raypipe.pipeline.execution.ray_budget``)."""
        return ray_budget(self, world_size=world_size, reserved_cpus=reserved_cpus)

    def local_budget(self, *, world_size: int = 1, reserved_cpus: float = 0.0) -> tuple[RankBudget, int, str]:
        """This rank's share of this machine for local workers: (budget, worker processes, their slabs'
        directory) (``raypipe.pipeline.execution.local_budget``)."""
        return local_budget(self, world_size=world_size, reserved_cpus=reserved_cpus)

    def columns(self) -> TableColumns:
        """The listing's columns as each chunk's rows are taken from them (``take(idx)``), made once:
        about the table's own bytes (``raypipe.sources.table.TableColumns``)."""
        if self._columns is None:
            self._columns = self.rows.columns()
        return self._columns

    def stream(self, span: RankSpan | None = None, *, segments=None, decision: Decision | None = None) -> ChunkStream:
        """The chunks of ``span``'s rank (default: the only one) for its epochs ``start_epoch`` … ``end_epoch``
        (exclusive; None: no end); ``segments``: the positions of ``start_epoch``'s order to run (None:
        the rank's slice). ``decision``: the backend that runs them, where the caller decided it
        (a feeder, told its connection); by default decided here (``decide``)."""
        span = span or RankSpan()
        decision = decision or self.decide()
        run = execution_for(decision, self, span)
        return ChunkStream(
            self.columns(),
            self.plan(span.rank, span.world_size),
            self.stage_spec,
            run.budget,
            run.workers,
            start_epoch=span.start_epoch,
            end_epoch=span.end_epoch,
            segments=segments,
            elastic=run.elastic,
            backend=decision.backend,
        )

    def epoch(self, epoch: int, *, rank: int = 0, world_size: int = 1) -> EpochRun:
        """One epoch on its own (``report`` once iterated)."""
        return EpochRun(self, epoch, rank=rank, world_size=world_size)
