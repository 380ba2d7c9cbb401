"""The rank's single execution: every epoch's chunks, run as tasks, handed out in order.

One ``ChunkStream`` spans a rank's whole run. It walks the epochs' chunks (``order.RankPlan``) in
order and keeps at most ``in_flight`` of them submitted as tasks, each reading, decoding and
augmenting one chunk: Ray tasks on any node of the cluster (``RayTasks``), or, for a run that is not
connected to Ray, worker processes of this machine (``raypipe.workers.local.LocalWorkers``), which take the
same chunks in the same order, so the batches are the same. The consumer takes the results strictly
in submission order::

    submitted:  e0c0 e0c1 e0c2 e0c3 | e1c0 e1c1        (in_flight = 6: the window)
    running:         e0c1 e0c2 e0c3   e1c0             (workers = 4)
    consumer:   e0c0 ─▶ Packer ─▶ batches              (takes e0c1 next, then submits e1c2)

So an epoch boundary is just the next chunk: epoch e+1's first chunks are already running while
epoch e's last ones are packed, with no start-up between epochs. The window bounds everything at
once: the object store a rank may fill (``in_flight`` chunks), how far the workers run ahead of the
consumer, and how long a slow chunk can hold the others (they finish and wait; nothing new starts).
Taking results in order also makes batch composition a function of the seed alone.

Before the workers are up (``raypipe.connect(wait=False)`` still starting Ray, or the local workers
still starting), the consumer runs the next chunk's stage itself, in this process: the same function
on the same rows, so the same output, and the trainer has its first batches while the workers start
(which begins once the first chunk's batches are out, so that the two do not share the cores). Once
they are up, such a stream sends as many set-up tasks as it runs tasks at once (each imports the
kernels and builds the transform and reader in the worker process it lands on) and goes on making
chunks here until they are done, rather than waiting idle on workers that are still starting; the
chunks that are left then go to the workers as above. A piece longer than a chunk (the first pieces
of a whole-window source double from ``chunk_rows``; those of a Parquet file in a store share one
read of their window made here: ``raypipe.pipeline.window_read``) is the exception: before the
consumer makes it, the chunks after it go to the workers (local ones queue them while they start,
Ray's once it is up), so workers that come up meanwhile take them instead of waiting for the
consumer's long piece.

Why plain Ray tasks and not a Ray Data execution: a Ray Data ``Dataset`` plans one input task per
block before it starts (milliseconds each: a hundred epochs of an ImageNet shard cost minutes up
front), and its iterator hands blocks out in completion order, so a stalled block would let the
consumer hold back an unbounded number of the next epoch's. Tasks submitted in order against a
window have neither problem, and need nothing beyond Ray's public core API.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from raypipe.pipeline.budget import RankBudget
from raypipe.pipeline.elastic import ElasticWidth
from raypipe.pipeline.metrics import NULL, RunMetrics
from raypipe.pipeline.window_read import WindowRead
from raypipe.plan.order import WHOLE_SHARD_KINDS, EpochChunks, RankPlan
from raypipe.sources.table import TableColumns
from raypipe.stages.augment import augment_block, stage_for
from raypipe.workers.protocol import Workers

__all__ = ["Chunk", "ChunkStream", "STALL_WARN_S"]

log = logging.getLogger(__name__)

# How long the consumer waits for the next chunk before it says so (and goes on waiting): a chunk is
# seconds of work; longer means a read that does not return, or no node able to run the task.
STALL_WARN_S = 120.0
# How often the rank's budget is taken again from the cluster: an autoscaler adds (or removes) nodes
# while a run goes on, and the rank's share should follow them.
BUDGET_REFRESH_S = 30.0


@dataclass(frozen=True)
class _Todo:
    """A chunk to run: its epoch, index in the epoch, whether it ends the epoch, the position of its first
    row, its rows, and the read it shares with the other pieces of its window (None: it reads its own)."""

    epoch: int
    index: int
    last: bool
    start: int
    idx: np.ndarray
    window: WindowRead | None = None


@dataclass(frozen=True)
class Chunk:
    """One finished chunk: ``block`` is its rows (images and skip records), ``last`` ends its epoch,
    ``start`` the position of its first row in the epoch's order (row ``j`` is at ``start + j``).
    ``ref``: the Ray object ``block`` was read from (zero-copy), for another process on the node to
    read too; None where the chunk is no Ray object (local workers, made in this process)."""

    epoch: int
    index: int
    last: bool
    rows: int
    block: dict[str, np.ndarray]
    ref: object | None = None
    start: int = 0


class ChunkStream:
    """Epochs ``start_epoch``, ``start_epoch + 1``, … (up to ``end_epoch``, or without end) of one
    rank, as an in-order iterator of ``Chunk``. ``close()`` drops what is in flight."""

    def __init__(
        self,
        columns: TableColumns,
        plan: RankPlan,
        spec_for_epoch,
        budget: Callable[[], RankBudget],
        workers: Workers,
        *,
        start_epoch: int = 0,
        end_epoch: int | None = None,
        segments=None,
        elastic: ElasticWidth | None = None,
        backend: str = "local",
    ):
        self._columns = columns
        self._plan = plan
        self._spec_for_epoch = spec_for_epoch
        self._budget_fn = budget
        self.budget: RankBudget | None = None  # taken from the cluster once it is up
        self._budget_at = 0.0
        self._workers = workers
        self._elastic = elastic  # the width following the consumer's demand; None: the budget's
        self.backend = backend  # what makes its chunks, as the metrics name it
        self.metrics: RunMetrics = NULL  # the consumer's (``EpochSource`` sets it)
        self._setting_up: list | None = None  # the workers' set-up tasks, once they are up
        self.workers_set_up = False
        self.local_chunks = 0  # chunks this process made itself (cluster starting, workers setting up)
        self._pending: collections.deque = collections.deque()  # (epoch, index, last, start, rows, ref)
        self._todo = self._chunks(start_epoch, end_epoch, segments)
        self._held: _Todo | None = None  # the next chunk, taken from _todo but not sent yet
        self._closed = False

    def _chunks(self, start: int, end: int | None, segments) -> Iterator[_Todo]:
        """Each chunk to run: ``segments`` (positions of the order; None: the rank's slice) for the first
        epoch, the rank's slice for the others."""
        epoch = start
        while end is None or epoch < end:
            # the first epoch's first window ramps: nothing runs ahead of the first
            chunks = self._plan.chunks(epoch, ramp=epoch == start, segments=segments if epoch == start else None)
            window = self._window_read(epoch, chunks) if chunks.ramp and self._share_reads(epoch) else None
            for i in range(len(chunks)):
                yield _Todo(
                    epoch,
                    i,
                    i == len(chunks) - 1,
                    int(chunks.bounds[i, 0]),
                    chunks[i],
                    window if i < chunks.ramp else None,
                )
            if not len(chunks):
                yield _Todo(epoch, 0, True, 0, np.empty(0, np.int64))
            epoch += 1

    def _share_reads(self, epoch: int) -> bool:
        """Whether a window's pieces share one read: where each piece's own read would fetch the whole
        window from a store again (Parquet: a row group is read whole). A remote tar shard's piece
        fetches its own members, about once already; a local file read again is a copy from the page
        cache, which costs what handing its bytes over costs, and runs on the workers in parallel
        rather than here first (docs/performance.md)."""
        spec = self._spec_for_epoch(epoch)
        return spec.kind in WHOLE_SHARD_KINDS and not spec.root.is_local

    def _window_read(self, epoch: int, chunks: EpochChunks) -> WindowRead:
        """The read that ``chunks``' first ``ramp`` pieces share (one window), made in this process with
        the stage's reader when the first of them is taken."""
        lo, hi = int(chunks.bounds[0, 0]), int(chunks.bounds[chunks.ramp - 1, 1])

        def read(rows, wait):
            return stage_for(self._spec_for_epoch(epoch)).reader.read_block(rows, wait=wait)

        return WindowRead(lo, lambda: self._columns.take(chunks.order.take(lo, hi)), read)

    def _rows(self, item: _Todo) -> dict[str, np.ndarray]:
        if item.window is not None:
            return item.window.piece(item.start, item.start + len(item.idx))
        return self._columns.take(item.idx)

    def _next_todo(self, *, wait: bool) -> _Todo | None:
        """The next chunk to run (None: no more); with ``wait=False`` also None while the next one is a
        piece whose bytes are still coming (a later call sends it)."""
        if self._held is None:
            self._held = next(self._todo, None)
        item = self._held
        if (
            item is not None
            and not wait
            and item.window is not None
            and not item.window.ready(item.start, item.start + len(item.idx))
        ):
            return None
        self._held = None
        return item

    def _refresh_budget(self) -> None:
        if self.budget is None or time.monotonic() - self._budget_at > BUDGET_REFRESH_S:
            self.budget, self._budget_at = self._budget_fn(), time.monotonic()
            self._workers.size_tasks(self.budget.task_cpus)

    def _submit(self) -> None:
        self._refresh_budget()
        while len(self._pending) < self.budget.in_flight:
            # a piece whose bytes are still coming waits while there is a chunk to hand out before it
            item = self._next_todo(wait=not self._pending)
            if item is None:
                return
            if len(item.idx):
                ref = self._workers.submit(self._rows(item), self._spec_for_epoch(item.epoch))
            else:
                ref = None  # an empty epoch (a rank with no rows): nothing to run
            asked = time.monotonic()
            self._pending.append((item.epoch, item.index, item.last, item.start, len(item.idx), asked, ref))

    def __iter__(self) -> Iterator[Chunk]:
        return self

    def __next__(self) -> Chunk:
        if self._closed:
            raise StopIteration
        if not self._pending and self._make_here():
            return self._run_here()
        self._submit()
        if not self._pending:
            raise StopIteration
        epoch, index, last, start, n, asked, ref = self._pending.popleft()
        block = self._wait(ref, epoch, index) if ref is not None else None
        self._observe(n)
        if self.metrics.enabled and ref is not None:
            self.metrics.chunk(self.backend, time.monotonic() - asked)
            self.metrics.tick(self.gauges)
        self._submit()  # refill the window before the consumer starts on this chunk
        return Chunk(epoch, index, last, n, block, self._workers.shared_ref(ref) if ref is not None else None, start)

    def _make_here(self) -> bool:
        """Whether the consumer makes the next chunk itself: while the workers start and then, for a
        stream that began so, until the workers' set-up tasks are done (see the module's doc)."""
        if self._workers.starting():
            return True
        if self.workers_set_up or not self.local_chunks:
            return False
        if self._setting_up is None:
            self._refresh_budget()
            spec = self._spec_for_epoch(0)  # any epoch's: a stage is reused across epochs
            self._setting_up = self._workers.set_up(spec, self.budget.workers)
        if not self._workers_ready():
            return True
        for task in self._setting_up:  # a stage that cannot be set up fails here, with its own error
            self._workers.get(task)
        self.workers_set_up = True
        return False

    def _workers_ready(self) -> bool:
        return self._workers.all_done(self._setting_up)

    def _run_here(self) -> Chunk:
        if self.local_chunks:
            # The consumer is back for more: the previous chunk's batches are out, so the workers'
            # start may take the cores now (before, it would share them with the first batch).
            self._workers.release_start()
        item = self._next_todo(wait=True)
        if item is None:
            raise StopIteration
        epoch, index, last, start, idx = item.epoch, item.index, item.last, item.start, item.idx
        if (
            len(idx) > self._plan.chunk_rows
            and self.local_chunks
            and (self._workers.queues_while_starting or not self._workers.starting())
        ):
            # A piece longer than a chunk (a whole-window stream's first pieces) while the workers
            # start or set up: they take the chunks after it as soon as they can, instead of idling
            # until the consumer is done with it; the consumer then waits on theirs.
            self._submit()
        block = None
        if len(idx):
            # At the trainer's own priority: nothing else of raypipe's runs yet to make room for.
            spec = dataclasses.replace(self._spec_for_epoch(epoch), nice=0, sched_idle=False)
            began = time.monotonic()
            block = augment_block(self._rows(item), spec)
            self.local_chunks += 1
            made = time.monotonic() - began
            self.metrics.chunk("here", made)
            self.metrics.waited(made)  # the consumer's own chunk: its trainer waits for it as for any other
        return Chunk(epoch, index, last, len(idx), block, start=start)

    def _observe(self, images: int) -> None:
        """An elastic stream's observation: ``images`` handed out, the chunks running and ready ahead."""
        if self._elastic is None:
            return
        refs = [p[-1] for p in self._pending if p[-1] is not None]
        ready = sum(self._workers.all_done([r]) for r in refs)
        if self._elastic.note(images=images, running=len(refs) - ready, ready=ready):
            self._budget_at = -BUDGET_REFRESH_S  # the width changed: the window follows it now

    def gauges(self) -> dict[str, float]:
        """The rank's width as the metrics show it (read once per metrics interval): the workers it
        wants, those running and those waiting for a node, and the chunks finished ahead of the consumer."""
        refs = [p[-1] for p in self._pending if p[-1] is not None]
        figures = {"raypipe_chunks_ready_ahead": sum(self._workers.all_done([r]) for r in refs)}
        workers = self.budget.workers if self.budget is not None else 0
        running = getattr(self._workers, "ready_workers", None)
        figures["raypipe_workers_running"] = running() if running is not None else workers
        figures["raypipe_width_wanted"] = self._elastic.wanted if self._elastic is not None else workers
        figures["raypipe_workers_pending"] = getattr(self._workers, "pending_launchers", 0)
        return figures

    def _wait(self, ref, epoch: int, index: int) -> dict[str, np.ndarray]:
        waited, warn_at = 0.0, STALL_WARN_S
        metrics = self.metrics
        while True:
            # an elastic stream observes in slices while it waits: a long wait is the demand it acts on;
            # the metrics' gauges too, once per their interval
            step = STALL_WARN_S if self._elastic is None else min(STALL_WARN_S, self._elastic.tick_s)
            step = min(step, metrics.interval_s) if metrics.enabled else step
            began = time.monotonic()
            done = self._workers.wait(ref, step)
            if metrics.enabled:
                metrics.waited(time.monotonic() - began)
                if not done:
                    metrics.tick(self.gauges)
            if self._elastic is not None:
                self._elastic.waited(time.monotonic() - began)
                if not done:
                    self._observe(0)
                    self._submit()  # a wider window asks for its chunks now
            if done:
                return self._workers.get(ref)
            waited += step
            if waited < warn_at:
                continue
            warn_at += STALL_WARN_S
            log.warning(
                "epoch %d, chunk %d: not done after %.0f s (%s): a read that does not return (a hung mount or "
                "object store?), a stuck worker, or no node able to run the task; still waiting",
                epoch,
                index,
                waited,
                self.budget.describe(),
            )

    def close(self) -> None:
        """Drop the chunks in flight (local workers' queued ones are cancelled; Ray tasks finish and
        their results go) and stop. Returns at once."""
        self._closed = True
        pending, self._pending = self._pending, collections.deque()
        for *_, ref in pending:
            if ref is not None:
                self._workers.cancel(ref)
