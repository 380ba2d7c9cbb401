"""EpochSource: what a trainer iterates. Each ``iter()`` is the rank's next epoch, taken from one chunk
stream that spans the run (so an epoch starts as soon as the previous one's last batch is out), packed
into exact batches and accounted for; ``state_dict()`` is the rank's position (``raypipe.plan.position``).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from raypipe.config import PipelineConfig
from raypipe.pipeline.accounting import EpochLedger, EpochReport
from raypipe.pipeline.metrics import NULL, RunMetrics, metrics_for
from raypipe.pipeline.pack import BatchSpec, Packer
from raypipe.pipeline.stream import Chunk, ChunkStream
from raypipe.plan.order import RankPlan
from raypipe.plan.position import PlanIdentity, Position, read_positions, remaining_after
from raypipe.plan.span import RankSpan

__all__ = ["ChunkSource", "EpochSource", "EpochRun"]

log = logging.getLogger(__name__)


class ChunkSource(Protocol):
    """What an ``EpochSource`` reads from: a rank's plan and its chunk stream, with the batches' shape and
    the checks they get. ``raypipe.pipeline.pipeline.Pipeline`` is one; declared here so that this module
    needs nothing of the class that makes the stream (``Pipeline.epoch`` makes an ``EpochRun``)."""

    config: PipelineConfig
    content_digest: bool
    batch_spec: BatchSpec

    def plan(self, rank: int = 0, world_size: int = 1) -> RankPlan: ...

    def num_batches(self, world_size: int = 1, rank: int = 0) -> int: ...

    def identity(self) -> PlanIdentity: ...

    def stream(self, span: RankSpan | None = None, *, segments=None, decision=None) -> ChunkStream: ...


@dataclasses.dataclass(frozen=True)
class _Resume:
    """A loaded position: its epoch, this rank's ranges of positions, the batches counted before them."""

    epoch: int
    segments: list
    batches: int


class _Cursor:
    """Where a rank is in the epoch it reads: its position ranges (``segments``) and, for the last batches
    out, the position after each one's last row (``after[k]``: after batch ``k``). A resumed epoch's
    batches are numbered after the ``batches`` taken before the resume, as the trainer counts them."""

    KEPT = 256  # batches remembered: a consumer that runs ahead (prefetch) asks for one it holds

    def __init__(self, epoch: int, segments, batches: int = 0):
        self.epoch, self.segments = epoch, [tuple(s) for s in segments]
        self.batches, self.done = batches, False
        self.after: collections.OrderedDict[int, int] = collections.OrderedDict()
        self.after[batches] = self.segments[0][0] if self.segments else 0

    def out(self, position: int) -> None:
        self.batches += 1
        self.after[self.batches] = position
        if len(self.after) > self.KEPT:
            self.after.popitem(last=False)


class EpochSource:
    """A re-iterable view of a pipeline for one rank: each ``iter()`` runs the next epoch.

    All epochs come from one ``ChunkStream`` (started at the first ``iter()``), so the next epoch's
    chunks are already being made while this one's last batches are read. ``set_epoch(e)`` moves to
    epoch ``e`` (a new stream there, when it is not the next one anyway); stopping an epoch part way
    drops the stream, and the next ``iter()`` starts a new one at the next epoch. An ``iter()`` past
    ``end_epoch`` raises ``ValueError``.

    ``state_dict()`` is the rank's position (after the batches it yielded, or after ``batches`` of them
    in the epoch it reads); ``load_state_dict(state)`` makes the next ``iter()`` go on from there, on
    the same or, given every rank's state, another number of ranks (``raypipe.plan.position``).
    A resumed epoch counts its batches on from the state's, so a position saved after a resume is
    saved and resumed the same way.

    Args:
        pipeline: what the chunks come from (a ``Pipeline``).
        span: the rank's ``RankSpan``, or its fields as keywords (``rank``, ``world_size``,
            ``start_epoch``, ``end_epoch``, ``reserved_cpus``). Its ``end_epoch`` (None: open-ended)
            keeps the workers from starting epochs that will not be read; its ``reserved_cpus``, the
            CPUs its trainer (and feeder) hold, are left out of the rank's share (``budget``).
        decision: the backend that runs its chunks (``raypipe.pipeline.backend.Decision``), where the
            caller decided it (a feeder); None: each stream decides in this process.

    Raises:
        ValueError: an invalid span field (named), a ``span`` that is not a ``RankSpan``, or both
            ``span`` and keywords.
        TypeError: a keyword that is not a ``RankSpan`` field.
    """

    def __init__(self, pipeline: ChunkSource, *, span: RankSpan | None = None, decision=None, **keywords):
        self.pipeline = pipeline
        self.decision = decision
        self.span = span = RankSpan.of(span, **keywords)
        self.rank = span.rank
        self.world_size = span.world_size
        self.next_epoch = span.start_epoch
        self.end_epoch = span.end_epoch
        self.reports: list[EpochReport] = []
        self.epoch_rows = len(pipeline.plan(span.rank, span.world_size))
        self._stream: ChunkStream | None = None
        self._stream_epoch: int | None = None  # the epoch the stream's next chunk belongs to
        self._resume: _Resume | None = None  # where the next iter() starts, after load_state_dict
        self._cursor: _Cursor | None = None
        self.chunk: Chunk | None = None  # the chunk whose rows are being packed (a batch may be a view of it)
        self.metrics: RunMetrics = NULL  # taken in the process that iterates, when a stream starts

    def __len__(self) -> int:
        return self.pipeline.num_batches(self.world_size, self.rank)

    def set_epoch(self, epoch: int) -> None:
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None  # a resumed position belongs to its own epoch
        self.next_epoch = epoch

    @property
    def last_report(self) -> EpochReport | None:
        return self.reports[-1] if self.reports else None

    def state_dict(self, batches: int | None = None) -> dict:
        """This rank's position (``raypipe.plan.position.Position.as_dict()``): after the batches it has
        yielded in the epoch it reads, or after ``batches`` of them (a consumer that reads ahead gives the
        count it used). Once the epoch has ended, no ``batches`` is the next epoch's start, and its last
        batch's count is that epoch with nothing left: a consumer that has not seen the end yet resumes in
        it, at its end."""
        identity, cursor = self.pipeline.identity(), self._cursor
        fresh = self.pipeline.plan(self.rank, self.world_size).segments
        if self._resume is not None:
            epoch, remaining, done = self._resume.epoch, self._resume.segments, self._resume.batches
        elif cursor is None or (cursor.done and batches is None):
            epoch, remaining, done = self.next_epoch, fresh, 0
        else:
            done = cursor.batches if batches is None else batches
            if done not in cursor.after:
                raise ValueError(
                    f"the position after batch {done} of epoch {cursor.epoch} is not known (batches "
                    f"{min(cursor.after)} … {max(cursor.after)} are)"
                )
            epoch, remaining = cursor.epoch, remaining_after(cursor.segments, cursor.after[done])
        return Position(
            epoch=epoch,
            batches=done,
            rank=self.rank,
            world_size=self.world_size,
            remaining=tuple(remaining),
            plan=identity,
        ).as_dict()

    def load_state_dict(self, state) -> None:
        """Go on from ``state`` at the next ``iter()``: this rank's own position, or the list of every rank's
        (any number of ranks), as any loader saved it (``read_positions``); another plan's is refused
        (``StateMismatchError``)."""
        saved = read_positions(state)
        segments = saved.segments(self.pipeline.identity(), rank=self.rank, world_size=self.world_size)
        self.close()
        self._cursor = None
        self.next_epoch = saved.epoch
        self._resume = _Resume(saved.epoch, segments, saved.batches)

    def close(self) -> None:
        """Cancel the chunks in flight (epochs started ahead that will not be read). Idempotent."""
        if self._stream is not None:
            self._stream.close()
        self._stream, self._stream_epoch = None, None

    def _stream_at(self, epoch: int, segments) -> ChunkStream:
        if self._stream is None or self._stream_epoch != epoch or segments is not None:
            self.close()
            span = dataclasses.replace(self.span, start_epoch=epoch)
            self._stream = self.pipeline.stream(span, segments=segments, decision=self.decision)
            self._stream_epoch = epoch
        return self._stream

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        epoch = self.next_epoch
        if self.end_epoch is not None and epoch >= self.end_epoch:
            raise ValueError(f"epoch {epoch} is past end_epoch={self.end_epoch}")
        self.next_epoch += 1
        resume, self._resume = self._resume, None
        resumed = resume is not None and resume.epoch == epoch
        segments = resume.segments if resumed else self.pipeline.plan(self.rank, self.world_size).segments
        # state_dict() speaks of this epoch from here; a resumed one numbers its batches after those before it
        self._cursor = _Cursor(epoch, segments, resume.batches if resumed else 0)
        return self._epoch(self._cursor, resumed)

    def _epoch(self, cursor: _Cursor, resumed: bool) -> Iterator[dict[str, np.ndarray]]:
        p, cfg, epoch = self.pipeline, self.pipeline.config, cursor.epoch
        t0 = time.perf_counter()
        # a resumed epoch's stream starts at its segments; else the one running (or a fresh slice's)
        stream = self._stream_at(epoch, cursor.segments if resumed else None)
        ledger = EpochLedger(
            epoch=epoch,
            expected=sum(hi - lo for lo, hi in cursor.segments),
            with_content=p.content_digest,
            max_skip_ratio=cfg.max_skip_ratio,
            max_skips=cfg.max_skips,
        )
        packer = Packer(p.batch_spec, drop_last=cfg.drop_last)
        if not self.metrics.enabled:  # taken here, in the process that iterates; Ray may be up since the last
            self.metrics = metrics_for(getattr(getattr(p, "settings", None), "run_name", ""), self.rank)
        metrics = stream.metrics = self.metrics
        metrics.epoch_started(epoch, cursor.batches)
        first = None
        finished = False
        try:
            # 1. Chunks arrive in order; 2. skips are recorded; 3. good rows are packed into batches,
            # each batch's end noted as a position of the order (the rank's position, ``state_dict``).
            for chunk in stream:
                if chunk.epoch != epoch:
                    raise RuntimeError(f"chunk of epoch {chunk.epoch} while reading epoch {epoch} (stream out of step)")
                if chunk.block is not None:
                    self.chunk = chunk
                    ledger.record_block(chunk.block)
                    metrics.block(chunk.block)
                    for batch in packer.add(chunk.block):
                        ledger.record_batch(batch)
                        metrics.batch(len(batch["sample_id"]))
                        cursor.out(chunk.start + packer.last_row + 1)
                        first = first if first is not None else time.perf_counter() - t0
                        yield batch
                    # its batches are out: not held here while the next chunk is awaited, so its slab
                    # goes back as soon as the consumer lets go of them
                    self.chunk = batch = None
                last = chunk.last
                chunk = None
                if last:
                    break
            end = cursor.segments[-1][1] if cursor.segments else 0
            for batch in packer.flush():
                ledger.record_batch(batch)
                metrics.batch(len(batch["sample_id"]))
                cursor.out(end)
                first = first if first is not None else time.perf_counter() - t0
                yield batch
            for ids in packer.dropped_ids:
                ledger.record_dropped(ids)
            elapsed = time.perf_counter() - t0
            self.reports.append(ledger.finish(elapsed, first if first is not None else elapsed))
            metrics.flush(stream.gauges)  # the counters equal the epoch's report at its end
            self._stream_epoch = epoch + 1
            cursor.done = True
            finished = True
        finally:
            self.chunk = None
            if not finished:  # stopped part way or failed: the stream's position is lost
                metrics.flush()  # what it counted happened
                self.close()


class EpochRun:
    """One epoch of a pipeline (iterate once: a second ``iter()`` raises ``RuntimeError``); ``report``
    holds its accounting once it has ended. ``Pipeline.epoch(e)`` makes one.

    Args:
        pipeline: what the chunks come from (a ``Pipeline``).
        epoch: the epoch.
        rank, world_size: which rank's share of it.

    Raises:
        ValueError: an invalid ``rank``, ``world_size`` or ``epoch`` (named; ``epoch`` as
            ``start_epoch``).
    """

    def __init__(self, pipeline: ChunkSource, epoch: int, *, rank: int = 0, world_size: int = 1):
        self.epoch = epoch
        self._source = EpochSource(pipeline, rank=rank, world_size=world_size, start_epoch=epoch, end_epoch=epoch + 1)
        self._started = False

    @property
    def report(self) -> EpochReport | None:
        return self._source.last_report

    def __len__(self) -> int:
        return len(self._source)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self._started:
            raise RuntimeError("an EpochRun is iterated once; call pipeline.epoch(e) again")
        self._started = True
        try:
            yield from self._source
        finally:
            self._source.close()
