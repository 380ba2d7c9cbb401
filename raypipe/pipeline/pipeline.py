"""The Ray Data pipeline: rows → (any node) read + decode + augment → (consumer) exact batches.

One ``Pipeline`` per dataset and transform; ``pipeline.epoch(e)`` builds that epoch's Ray Dataset
and iterates it::

    shard rows     ray.data.from_blocks     map_batches(augment)            consumer (this process)
    perm(seed,e) ─▶ blocks of block_size ─▶ tasks or actor pool, any node ─▶ iter_batches ─▶ Packer ─▶ batches
    [rank::world]                            skip records travel along        EpochLedger counts every row

Sharding is by index (``perm[rank::world_size]``), so with N trainers each sample is in exactly
one rank's epoch: nothing padded, nothing dropped. Augmentation randomness is seeded by
``(seed, epoch, sample_id)``, so content does not depend on the number of workers, nodes or retries.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import ray

from raypipe._handoff import put_unless_stopped
from raypipe.config import DecodeConfig, EvalAugment, PipelineConfig, TrainAugment
from raypipe.pipeline.accounting import EpochLedger, EpochReport
from raypipe.pipeline.pack import BatchSpec, Packer
from raypipe.pipeline.prefetcher import stopping_prefetchers
from raypipe.pipeline.runahead import bound_run_ahead
from raypipe.runtime import pin_mmap_threshold, private_cluster
from raypipe.sources import SourceRows, open_source
from raypipe.stages.augment import AugmentStage, StageSpec, augment_block

__all__ = ["Pipeline", "EpochRun", "EpochSource", "Pace", "shard_indices"]

log = logging.getLogger(__name__)

_END = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


def shard_indices(n: int, *, seed: int, epoch: int, shuffle: bool, rank: int = 0, world_size: int = 1) -> np.ndarray:
    """Row indices this rank reads this epoch: a seeded permutation, dealt round-robin to ranks."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    order = np.random.default_rng([seed, epoch, 0x5EED]).permutation(n) if shuffle else np.arange(n)
    return order[rank::world_size]


def _node_fits(resources: dict, need: dict) -> bool:
    return all(resources.get(name, 0.0) >= amount for name, amount in need.items())


def check_task_fits(config: PipelineConfig) -> None:
    """An augmentation task that no node of the cluster can hold never starts: the epoch would wait
    without a word. On raypipe's private local cluster nothing more will join, so that is an error;
    on another cluster an autoscaler may still add such a node, so it is a warning."""
    need = {"CPU": config.cpus_per_actor, **dict(config.resources)}
    try:
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    except Exception:  # noqa: BLE001 - not connected: nothing to check against
        return
    if not nodes or any(_node_fits(r, need) for r in nodes):
        return
    largest = max(r.get("CPU", 0.0) for r in nodes)
    message = (
        f"no node of the cluster can run an augmentation task, which needs {need} (cpus_per_actor="
        f"{config.cpus_per_actor:g}, resources={dict(config.resources)}); the largest node has {largest:g} CPUs"
    )
    if private_cluster():
        raise ValueError(message)
    log.warning("%s: the epoch waits until such a node joins (an autoscaler may add one)", message)


def _cluster_cpus() -> int:
    try:
        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    except Exception:  # noqa: BLE001 - not connected yet
        return 1


class Pipeline:
    """A dataset plus its transform, ready to run epochs on the connected Ray cluster."""

    def __init__(
        self,
        source: str | SourceRows,
        augment: TrainAugment | EvalAugment,
        *,
        config: PipelineConfig | None = None,
        decode: DecodeConfig | None = None,
        content_digest: bool = False,
    ):
        pin_mmap_threshold()  # keep the consumer's RSS flat across epochs (see its docstring)
        self.rows = source if isinstance(source, SourceRows) else open_source(source)
        self.augment = augment
        self.config = config or PipelineConfig()
        self.decode = decode or DecodeConfig()
        self.content_digest = content_digest
        h, w = augment.input_size
        self.batch_spec = BatchSpec(self.config.batch_size, (h, w, 3))
        self._fit_checked = False  # check_fits done (travels with the pipeline to a feeder process)

    def __len__(self) -> int:
        return len(self.rows)

    def num_batches(self, world_size: int = 1) -> int:
        """Upper bound of batches per rank per epoch (exact when nothing is skipped)."""
        per_rank = -(-len(self.rows) // world_size)
        b = self.config.batch_size
        return per_rank // b if self.config.drop_last else -(-per_rank // b)

    def check_fits(self) -> None:
        """``check_task_fits`` for this pipeline's config, once (the first epoch's build, or a
        ``FeederSource`` before it ships the pipeline to its feeder)."""
        if not self._fit_checked:
            check_task_fits(self.config)
            self._fit_checked = True

    def num_workers(self) -> int:
        """Concurrent augmentation tasks (or actors): ``num_actors``, else cluster CPUs / cpus_per_actor."""
        return self.config.num_actors or max(1, int(_cluster_cpus() / self.config.cpus_per_actor))

    def stage_spec(self, epoch: int) -> StageSpec:
        return StageSpec(
            kind=self.rows.kind,
            root=self.rows.root,
            augment=self.augment,
            decode=self.decode,
            seed=self.config.seed,
            epoch=epoch,
            image_column=self.rows.image_column,
            nice=self.config.worker_nice,
            sched_idle=bool(self.config.worker_sched_idle),  # None: off here
        )

    def dataset(self, epoch: int, *, rank: int = 0, world_size: int = 1) -> tuple[ray.data.Dataset, int, int]:
        """This rank's augmented Ray Dataset for ``epoch``, the number of source rows in it and the rows
        per block it was cut into (``epoch_block_size``)."""
        cfg = self.config
        self.check_fits()
        idx = shard_indices(
            len(self.rows), seed=cfg.seed, epoch=epoch, shuffle=cfg.shuffle, rank=rank, world_size=world_size
        )
        table = self.rows.table.take(pa.array(idx, type=pa.int64()))
        cluster_workers = self.num_workers()
        size = self.epoch_block_size(len(idx), cluster_workers)
        blocks = [table.slice(i, size) for i in range(0, table.num_rows, size)]
        if not blocks:
            blocks = [table]
        # One object per block (from_arrow(list) hands all blocks to a single task: measured serial),
        # metadata taken here: from_arrow_refs runs a 1-CPU Ray task per block to read it, which queues
        # behind the current epoch's tasks while the next epoch warms up, and an ImageNet-size epoch
        # (5000 blocks) took 14.7 s to build that way, 5.2 s now (bench/NOTES.md, eleventh session).
        ds = ray.data.from_blocks(blocks)
        spec = self.stage_spec(epoch)
        # no more concurrent tasks than blocks (a small eval split is one block; Ray Data warns otherwise)
        workers = min(cluster_workers, len(blocks))
        common = dict(batch_size=size, batch_format="numpy", num_cpus=cfg.cpus_per_actor)
        if cfg.resources:
            common["resources"] = dict(cfg.resources)
        if cfg.compute == "actors":
            ds = ds.map_batches(
                AugmentStage,
                fn_constructor_kwargs={"spec": spec},
                compute=ray.data.ActorPoolStrategy(min_size=1, max_size=workers),
                **common,
            )
        else:
            ds = ds.map_batches(
                augment_block, fn_kwargs={"spec": spec}, compute=ray.data.TaskPoolStrategy(size=workers), **common
            )
        ctx = ds.context
        ctx.enable_progress_bars = False  # raypipe draws its own per-epoch progress
        # Bound how far an execution runs ahead of its consumer (the next epoch's warmed-up one above
        # all, which nothing reads until the current epoch ends): see raypipe.pipeline.runahead.
        bound_run_ahead(ctx)
        limits = ctx.execution_options.resource_limits
        cap = self.run_ahead_bytes(workers, block_size=size)
        ctx.execution_options.resource_limits = limits.copy(object_store_memory=min(limits.object_store_memory, cap))
        return ds, len(idx), size

    def run_ahead_bytes(self, workers: int | None = None, *, block_size: int | None = None) -> int:
        """Object store an epoch's execution may fill (``runahead.RunAheadCap`` holds its next task back
        beyond it): the consumer's prefetch window plus two blocks in flight per worker (one being
        written, one waiting to be fetched). ``workers``: ``num_workers()`` when already known;
        ``block_size``: the epoch's (default ``config.block_size``)."""
        h, w, c = self.batch_spec.image_shape
        cfg = self.config
        workers = self.num_workers() if workers is None else workers
        return (block_size or cfg.block_size) * h * w * c * (cfg.prefetch_blocks + 2 * workers)

    def epoch_block_size(self, rows: int, workers: int | None = None) -> int:
        """Rows per block for an epoch of ``rows`` rows on this rank: ``long_block_size`` when the blocks
        in flight at that size (prefetch window plus one per worker) are at most a quarter of the epoch,
        else ``block_size``. In a short epoch big blocks in flight are the whole epoch: the next
        epoch's execution then starts at once and its first blocks queue behind this one's (2000-image
        epochs at 256 rows: a warmed epoch's first batch waited up to 0.48 s instead of 0.01)."""
        cfg = self.config
        workers = self.num_workers() if workers is None else workers
        if rows >= 4 * cfg.long_block_size * (cfg.prefetch_blocks + workers):
            return cfg.long_block_size
        return cfg.block_size

    def epoch(self, epoch: int, *, rank: int = 0, world_size: int = 1) -> EpochRun:
        return EpochRun(self, epoch, rank=rank, world_size=world_size)


class EpochRun:
    """One epoch's batches (iterate once); ``report`` holds the accounting when it has ended.

    Its Ray execution runs on a background thread that queues finished blocks. ``prestart()`` starts
    that early, so the fixed start-up cost of a Ray Data execution (about a second here) overlaps the
    previous epoch's tail. Timing (``seconds``, ``first_batch_s``) counts from when iteration starts.
    """

    def __init__(self, pipeline: Pipeline, epoch: int, *, rank: int = 0, world_size: int = 1):
        self.pipeline = pipeline
        self.epoch = epoch
        self.rank = rank
        self.world_size = world_size
        self.report: EpochReport | None = None
        self.block_rows = pipeline.config.block_size  # this epoch's, once its dataset is built
        self.build_s = 0.0  # how long building its dataset took (the next epoch's will take as long)
        self._rows_seen = 0  # rows of the blocks the consumer has taken so far
        self._started = False
        self._expected = 0
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, pipeline.config.prefetch_blocks))
        self._stop = threading.Event()
        self._opened = threading.Event()
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return self.pipeline.num_batches(self.world_size)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self._started:
            raise RuntimeError("an EpochRun is iterated once; call pipeline.epoch(e) again")
        self._started = True
        return self._run()

    def _pump(self) -> None:
        """Thread body: run this epoch's Ray execution and queue its blocks for the consumer.

        The Ray Data iterator is created, read and closed on this one thread, never handed between
        threads, and the bounded queue keeps at most ``prefetch_blocks`` finished blocks waiting.
        """
        with stopping_prefetchers():  # Ray Data leaves one parked thread per iterator otherwise
            self._pump_blocks()

    def _pump_blocks(self) -> None:
        blocks = None
        try:
            t0 = time.perf_counter()
            ds, self._expected, self.block_rows = self.pipeline.dataset(
                self.epoch, rank=self.rank, world_size=self.world_size
            )
            self.build_s = time.perf_counter() - t0
            self._opened.set()
            # prefetch_batches=0: Ray Data hands out each block as soon as it is done. With a window of
            # w it first waits for w blocks, then fetches the next one before yielding each, so w + 1
            # blocks must finish before the first is seen (w=4: a cold epoch's first batch after
            # 0.58-0.75 s instead of 0.38-0.40, the epoch no shorter; bench/epoch_startup.py
            # --block-sizes). The bounded queue this thread fills keeps prefetch_blocks blocks fetched
            # ahead of the consumer instead.
            blocks = iter(ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=0))
            for block in blocks:
                if not self._put(block):
                    return
            self._put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._opened.set()
            self._put(_Failure(e))
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()

    def _put(self, item) -> bool:
        return put_unless_stopped(self._queue, item, self._stop)

    def prestart(self) -> None:
        """Start this epoch's Ray execution now, in the background (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._pump, name=f"raypipe-epoch-{self.epoch}", daemon=True)
            self._thread.start()

    def cancel(self) -> None:
        """Stop the background execution (the consumer stopped early or the run was dropped)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _block_stream(self) -> Iterator[dict[str, np.ndarray]]:
        try:
            while True:
                item = self._next_item()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            self.cancel()

    def _next_item(self):
        """The next queued block; a wait of over ``STALL_WARN_S`` is logged (a read that never returns, a
        worker stuck), once per such wait: otherwise the epoch would stall without a word."""
        try:
            return self._queue.get(timeout=STALL_WARN_S)
        except queue.Empty:
            log.warning(
                "epoch %d: no block for %.0f s (%d of %d rows so far): a read that does not return (a hung "
                "network mount?), a stuck worker, or no node able to run the augmentation tasks",
                self.epoch, STALL_WARN_S, self._rows_seen, self._expected,
            )  # fmt: skip
            return self._queue.get()

    def _run(self, on_progress=None) -> Iterator[dict[str, np.ndarray]]:
        p, cfg = self.pipeline, self.pipeline.config
        t0 = time.perf_counter()
        self.prestart()
        self._opened.wait()  # the shard is built: the number of rows this epoch is known
        ledger = self._ledger()
        blocks = self._block_stream()
        packer = Packer(p.batch_spec, drop_last=cfg.drop_last)
        first = None
        # 1. Blocks stream in from Ray (prefetched); 2. skips are recorded; 3. good rows are packed.
        for block in blocks:
            ledger.record_block(block)
            self._rows_seen += len(block["ok"])
            if on_progress is not None:
                on_progress(self._rows_seen, self._expected)
            for batch in packer.add(block):
                ledger.record_batch(batch)
                first = first if first is not None else time.perf_counter() - t0
                yield batch
        for batch in packer.flush():
            ledger.record_batch(batch)
            first = first if first is not None else time.perf_counter() - t0
            yield batch
        for ids in packer.dropped_ids:
            ledger.record_dropped(ids)
        elapsed = time.perf_counter() - t0
        self.report = ledger.finish(elapsed, first if first is not None else elapsed)

    def _ledger(self) -> EpochLedger:
        p, cfg = self.pipeline, self.pipeline.config
        return EpochLedger(
            epoch=self.epoch,
            expected=self._expected,
            with_content=p.content_digest,
            max_skip_ratio=cfg.max_skip_ratio,
            max_skips=cfg.max_skips,
        )


# How long before an epoch's end the next one's Ray execution starts, on top of the rows in flight: a
# new execution needs ~1.1 s from start to its first block on 2 cores (0.1-0.25 s to build, the rest
# queued behind the old epoch's tasks and computing). Until the tenth session the pace this is turned
# into rows with was wrong (see Pace) and every warm-up after the first started at the epoch's first
# block, so the figures that chose 1 s measured that. With the pace fixed, 20,000-image epochs: the next
# execution starts ~3 s before the end and its first batch is waiting (bench/epoch_startup.py
# --timeline 1). The run-ahead cap (Pipeline.run_ahead_bytes) bounds how far it gets.
WARM_LEAD_S = 1.0

# How long the consumer waits for an epoch's next block before it logs that the epoch is stalled. A
# block is seconds of work at most on a busy cluster; a cold start (workers importing) takes ~4 s here.
STALL_WARN_S = 300.0


class Pace:
    """Rows per second over the last ``window_s`` of (time, rows seen) updates; None until the updates
    span a whole window.

    Not the epoch's average: a warmed-up epoch starts with blocks already done, taken in a burst (1,500
    rows in a few ms), which made the average so high that the next epoch was warmed up at once and ran
    beside the whole current one.
    """

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._marks: deque[tuple[float, int]] = deque()

    def update(self, now: float, seen: int) -> float | None:
        marks = self._marks
        marks.append((now, seen))
        while len(marks) > 2 and now - marks[1][0] >= self.window_s:
            marks.popleft()  # the second-oldest still spans the window
        t0, seen0 = marks[0]
        return (seen - seen0) / (now - t0) if now - t0 >= self.window_s else None


class EpochSource:
    """A re-iterable view of a pipeline for one rank: each ``iter()`` runs the next epoch.

    Hand it to one long-lived ``DeviceLoader`` (one side stream for the whole run). Call
    ``set_epoch(e)`` to resume at epoch ``e``; ``reports`` keeps every finished epoch's accounting.
    With ``warm_next`` the next epoch's Ray execution starts while this one's last blocks are in
    flight and ``warm_lead_s`` before its end at its current pace, hiding Ray Data's per-execution
    start-up (plus the time this epoch's dataset took to build); ``end_epoch`` stops that after the
    last epoch.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        rank: int = 0,
        world_size: int = 1,
        start_epoch: int = 0,
        end_epoch: int | None = None,
        warm_next: bool = True,
        warm_lead_s: float = WARM_LEAD_S,
    ):
        self.pipeline = pipeline
        self.rank = rank
        self.world_size = world_size
        self.next_epoch = start_epoch
        self.end_epoch = end_epoch  # no warm-up past this epoch (a job that knows its length)
        self.warm_next = warm_next
        self.current: EpochRun | None = None
        self.reports: list[EpochReport] = []
        self._upcoming: EpochRun | None = None
        cfg = pipeline.config
        # Rows still to come when the last blocks are in flight: the prefetch window plus one per worker
        # (blocks of the current epoch's size), plus what the consumer takes in ``warm_lead_s`` at this
        # epoch's pace (see WARM_LEAD_S).
        self._blocks_in_flight = cfg.prefetch_blocks + pipeline.num_workers()
        self.warm_lead_s = float(warm_lead_s)
        self._pace = Pace(window_s=max(self.warm_lead_s, 0.5))

    def set_epoch(self, epoch: int) -> None:
        self.next_epoch = epoch

    def close(self) -> None:
        """Stop a warmed-up next epoch that will not be read (its Ray execution is released)."""
        if self._upcoming is not None:
            self._upcoming.cancel()
        self._upcoming = None

    def __len__(self) -> int:
        return self.pipeline.num_batches(self.world_size)

    def _make(self, epoch: int) -> EpochRun:
        return self.pipeline.epoch(epoch, rank=self.rank, world_size=self.world_size)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        epoch = self.next_epoch
        if self._upcoming is not None and self._upcoming.epoch != epoch:
            self.close()  # set_epoch moved on: the warmed-up run is for another epoch
        run = self._upcoming or self._make(epoch)
        self._upcoming = None
        self.current = run
        self.next_epoch += 1
        run._started = True
        self._pace = Pace(self._pace.window_s)
        yield from run._run(on_progress=self._maybe_warm_next if self.warm_next else None)
        self.reports.append(run.report)

    def _maybe_warm_next(self, seen: int, expected: int, now: float | None = None) -> None:
        """Near the end of an epoch (its last blocks in flight), start the next epoch's execution."""
        if self.end_epoch is not None and self.next_epoch >= self.end_epoch:
            return
        rate = self._pace.update(time.perf_counter() if now is None else now, seen)
        current = self.current
        # The next epoch's dataset takes about as long to build as this one's did (seconds for an
        # ImageNet-size shard: one object per block), before its execution even starts.
        lead_s = self.warm_lead_s + (current.build_s if current is not None else 0.0)
        lead_rows = lead_s * rate if rate is not None else 0.0
        block = current.block_rows if current is not None else self.pipeline.config.block_size
        if self._upcoming is None and expected - seen <= block * self._blocks_in_flight + lead_rows:
            self._upcoming = self._make(self.next_epoch)
            self._upcoming.prestart()

    @property
    def last_report(self) -> EpochReport | None:
        return self.reports[-1] if self.reports else None
