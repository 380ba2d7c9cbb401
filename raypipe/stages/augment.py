"""The read + decode + augment stage that the augmentation tasks run on every node.

``AugmentStage(spec)(batch)`` takes a block of source rows and returns the same rows with their
augmented images. A row that cannot become an image comes back with ``ok=False`` and its skip
reason instead of raising: one bad file never kills its block or drops its neighbours, and the
skip travels to the consumer, which is where it is counted (so a retried task cannot count twice).

Only a failure of the row's own data is a skip: the reads and the decoders raise ``SkipImage`` for
that. Any other exception (a bug in a transform, a failed import, ``MemoryError``) leaves the stage
as it is, fails the Ray task and so the epoch, with its own type, message and traceback.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from raypipe.config import DecodeConfig, EvalAugment, TrainAugment
from raypipe.kernels import SkipImage, build_transform
from raypipe.kernels.seeding import BlockRngs
from raypipe.settings import Settings, current
from raypipe.sources.fields import member_rows
from raypipe.sources.label_sets import LABELS, multi_hot
from raypipe.sources.reader import BlockReader
from raypipe.sources.transport.paths import DatasetRoot
from raypipe.sources.transport.remote import ReadOptions
from raypipe.stages.field_values import FieldRows

T = TypeVar("T")

__all__ = ["StageSpec", "AugmentStage", "augment_block", "stage_for", "OUTPUT_COLUMNS"]

OUTPUT_COLUMNS = ("image", "label", "sample_id", "ok", "reason", "detail", "path")


@dataclass(frozen=True)
class StageSpec:
    """Everything a worker needs to turn rows into images for one epoch (small and picklable)."""

    kind: str
    root: DatasetRoot
    augment: TrainAugment | EvalAugment
    decode: DecodeConfig
    seed: int
    epoch: int
    image_column: str = ""
    nice: int = 0  # niceness of the thread the stage runs on (PipelineConfig.worker_nice)
    sched_idle: bool = False  # that thread under Linux SCHED_IDLE (PipelineConfig.worker_sched_idle)
    # What the worker reads with (ReadOptions.from_settings): those of the process that made the spec,
    # so every worker reads as its consumer says, whatever the worker's own environment holds.
    settings: Settings = field(default_factory=current)
    fields: tuple[str, ...] = ()  # the listing's fields, carried into the block (raypipe.sources.fields)
    field_transforms: tuple[tuple[str, Callable], ...] = ()  # (field, picklable callable) run on each value
    label_classes: int = 0  # rows with label sets (raypipe.sources.label_sets): the multi-hot label's width

    @property
    def reuse_key(self) -> tuple:
        """What a cached stage must match to be reused (seed and epoch are swapped in per call)."""
        return (self.kind, self.root.root, self.root.uri, self.augment, self.decode, self.image_column)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        h, w = self.augment.input_size
        return (h, w, 3)

    def run(self, batch: dict[str, np.ndarray], out: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """This process's stage for the spec on ``batch`` (``augment_block``)."""
        return stage_for(self)(batch, out)

    def prepare(self) -> None:
        """Make this process's stage for the spec now (imports, transform, reader), before a chunk needs it."""
        stage_for(self)


def lower_priority(nice: int, sched_idle: bool = False) -> None:
    """Raise the calling thread's niceness to ``nice`` (never lowers it, which needs privileges) and,
    with ``sched_idle``, move it to Linux's SCHED_IDLE policy (any user may; there is no way back
    without privileges). Both are per thread on Linux, so only the caller is affected."""
    # A sandbox may refuse either call (seccomp): the stage then runs at the priority it has, with a
    # warning, rather than breaking the thread pool this runs in (every later block would fail).
    try:
        if nice > 0 and hasattr(os, "nice"):
            current = os.nice(0)
            if current < nice:
                os.nice(nice - current)
        if sched_idle and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as exc:
        wanted = f"niceness {nice}" + (" and SCHED_IDLE" if sched_idle else "")
        warnings.warn(
            f"raypipe: the augmentation thread could not take {wanted} ({exc}); it runs as it is",
            RuntimeWarning,
            stacklevel=2,
        )


# One thread per priority setting, per worker process: the stage's work runs there, so the worker's
# own (main) thread keeps its priority. Ray reuses worker processes for any later task or actor of
# the job; lowering the main thread's priority instead would hand it on to them, and it cannot be
# raised back without privileges.
_NICE_THREADS: dict[tuple[int, bool], ThreadPoolExecutor] = {}


def call_at_niceness(nice: int, fn: Callable[..., T], *args: Any, sched_idle: bool = False) -> T:
    """``fn(*args)`` on this process's thread at niceness ``nice`` (and SCHED_IDLE if asked); inline
    when neither lowers anything."""
    idle = sched_idle and hasattr(os, "SCHED_IDLE")
    if not idle and (nice <= 0 or not hasattr(os, "nice")):
        return fn(*args)
    key = (nice, idle)
    pool = _NICE_THREADS.get(key)
    if pool is None:
        name = f"raypipe-nice{nice}" + ("-idle" if idle else "")
        pool = _NICE_THREADS[key] = ThreadPoolExecutor(
            1, thread_name_prefix=name, initializer=lower_priority, initargs=(nice, idle)
        )
    return pool.submit(fn, *args).result()


class AugmentStage:
    """A chunk of rows in, their images (or skip records) out. ``augment_block`` keeps one per worker
    process for each ``StageSpec.reuse_key``."""

    def __init__(self, spec: StageSpec):
        self.spec = spec
        self.transform = build_transform(spec.augment, spec.decode)
        self.reader = BlockReader(
            spec.root, spec.kind, spec.image_column, options=ReadOptions.from_settings(spec.settings)
        )

    def __call__(self, batch: dict[str, np.ndarray], out: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """``out``: where the images go (``(rows, *image_shape)`` uint8; e.g. shared memory), else a new array."""
        return call_at_niceness(self.spec.nice, self._augment, batch, out, sched_idle=self.spec.sched_idle)

    def _augment(self, batch: dict[str, np.ndarray], out: np.ndarray | None) -> dict[str, np.ndarray]:
        cpu_at = time.thread_time()  # the stage's CPU on this thread: the rank's metrics show it per image
        n = len(batch["sample_id"])
        if out is None:  # every row is written below: transformed, or zeroed when skipped
            images = np.empty((n, *self.spec.image_shape), dtype=np.uint8)
        elif out.shape != (n, *self.spec.image_shape) or out.dtype != np.uint8:
            raise ValueError(f"out: {out.dtype} {out.shape}, expected uint8 {(n, *self.spec.image_shape)}")
        else:
            images = out
        ok = np.zeros(n, dtype=bool)
        reason = np.full(n, "", dtype=object)
        detail = np.full(n, "", dtype=object)
        shown = np.full(n, "", dtype=object)
        errors = batch.get("error")
        rngs = BlockRngs(self.spec.seed, self.spec.epoch, batch["sample_id"])  # = sample_rng per row, cheaper
        # the whole block's reads at once: remote requests overlap (and with this loop's decoding: a row
        # still in flight is a Future), a Parquet row group is read once per block
        read, fields = self._read(batch)
        for i in range(n):
            try:
                if errors is not None and errors[i]:
                    why, _, more = str(errors[i]).partition(": ")
                    raise SkipImage(why, more)
                if fields is not None:
                    fields.value(i)
                data = read[i]
                if isinstance(data, Future):
                    data = data.result()
                if isinstance(data, SkipImage):
                    raise data
                self.transform(data, rngs.get(i), out=images[i])
                ok[i] = True
            except SkipImage as e:  # this row's data is bad; anything else fails the epoch
                reason[i], detail[i] = e.reason, e.detail
            if not ok[i]:
                images[i] = 0  # as a new array's: a skipped row's image is black whatever the transform left
                shown[i] = self.reader.describe(batch, i)
            elif fields is not None and self.spec.field_transforms:  # outside the try: never a skip
                fields.transform(i, self.reader.describe(batch, i))
        extra = {"fields": fields.finish(ok)} if fields is not None else {}
        return {
            "image": images,
            "label": self._labels(batch),
            "sample_id": np.asarray(batch["sample_id"], dtype=np.int64),
            "ok": ok,
            "reason": reason,
            "detail": detail,
            "path": shown,
            "cpu_s": time.thread_time() - cpu_at,
            **extra,
        }

    def _labels(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Each row's label: its class id, or (rows with label sets) its multi-hot row, uint8."""
        if not self.spec.label_classes:
            return np.asarray(batch["label"], dtype=np.int64)
        return multi_hot(batch[LABELS], self.spec.label_classes)

    def _read(self, batch: dict[str, np.ndarray]) -> tuple[list, FieldRows | None]:
        """The rows' image bytes (or Futures, or skips) and their fields (None: none asked). A
        WebDataset's field members are read in the same call as the images, so in the same requests;
        rows that come with their image bytes (a window read once) have their members read here."""
        names, n = self.spec.fields, len(batch["sample_id"])
        transforms = dict(self.spec.field_transforms)
        if not names:
            return self.reader.read_block(batch, wait=False), None
        if self.spec.kind != "webdataset":
            return self.reader.read_block(batch, wait=False), FieldRows(batch, names, {}, transforms)
        if "bytes" in batch:
            read = self.reader.read_block(batch, wait=False)
            members = self.reader.read_block(member_rows(batch, names, images=False), wait=False)
        else:
            both = self.reader.read_block(member_rows(batch, names, images=True), wait=False)
            read, members = both[:n], both[n:]
        by_name = {name: members[j * n : (j + 1) * n] for j, name in enumerate(names)}
        return read, FieldRows(batch, names, by_name, transforms)


# Stateless entry point for task-based compute: Ray reuses worker processes, so caching the stage
# per process keeps the transform's set-up off the per-block path without an actor pool per epoch.
_STAGES: dict[tuple, AugmentStage] = {}


def augment_block(batch: dict[str, np.ndarray], spec, out: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """A chunk's block: ``spec`` (a ``StageSpec``, or a mixture's ``MixtureSpec``) runs it."""
    return spec.run(batch, out)


def stage_for(spec: StageSpec) -> AugmentStage:
    """This process's stage for ``spec``, made on first use (imports, transform, reader)."""
    stage = _STAGES.get(spec.reuse_key)
    # The same bucket and prefix may be read through another filesystem (another endpoint or
    # credentials) by a later pipeline of the same job: its stage reads through its own. (pyarrow
    # filesystems compare by their options but do not hash, so they are checked here, not keyed.)
    # Likewise a spec that carries other settings (another pipeline's, made after they changed): its
    # stage reads with its own.
    if (
        stage is None
        or not _same_filesystem(stage.spec.root.filesystem, spec.root.filesystem)
        or stage.spec.settings != spec.settings
    ):
        if len(_STAGES) > 8:
            _STAGES.clear()
        stage = _STAGES[spec.reuse_key] = AugmentStage(spec)
    stage.spec = spec  # same transform and reader; this epoch's seed
    return stage


def _same_filesystem(a, b) -> bool:
    if a is None or b is None:
        return a is b
    try:
        return a is b or bool(a.equals(b))
    except Exception:  # noqa: BLE001 - a filesystem that cannot compare itself: a stage of its own
        return False
