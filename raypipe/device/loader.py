"""DeviceLoader: packed host batches in, normalised / erased / mixed device batches out.

The loader composes three small objects, each usable alone: :class:`Normalize` (always),
:class:`RandomErasing` and :class:`Mixup` (optional), with timm's names, and takes them built.
:func:`raypipe.device.factory.from_timm_args` builds them and the loader from timm's flat argument
names; it sits above the class it builds, as timm's ``create_*`` functions do, so this module imports
nothing from it.

A producer thread runs steps 1-5 for batches ahead of the consumer (``raypipe.device.producer``); the
consumer thread runs 6-8.
With ``prefetch=2`` (a ring of 3 host slots), these are the batches in flight while the trainer is
on batch 0::

    [consumer thread]   trains on b0 (its stream waited on b0's ready event, step 7)
    [queue, <= 2]       b1 [ready event], b2 [ready event]
    [side stream, GPU]  b2's normalise / erase / mix may still be running behind b2's H2D copy
    [producer thread]   b3: fetch (1), wait for slot 0's copy event (b0's H2D, long done), memcpy (2)

Steps, in the order a batch meets them:

1. fetch: ``next()`` on the source; split the batch into image / label / sample_id / pass-through and
   check it against the epoch's ``BatchSpec`` (fixed by the first batch).
2. stage: copy into the next host ring slot (pinned on CUDA) once that slot's previous copy is done.
3. transfer: issue the host -> device copies ``non_blocking`` on the side stream; record the slot's
   copy event.
4. transform: issue normalise, random erasing, mixup/cutmix on the side stream.
5. hand over: record the batch's ready event and put it on the queue (blocks when ``prefetch`` are
   waiting).
6. take: the consumer gets the next item; the time it blocks here is the data stall (``stats.wait_s``).
7. protect: the consumer's stream waits on the ready event; each tensor is ``record_stream``-ed on it.
8. yield: the batch goes to the training step.

The host-side work (fetch, memcpy into the ring) releases the GIL in numpy/torch; the device work is
only *issued* by the producer. On a CPU device the same chain runs with no stream, no pinning and no
events: values are identical to the CUDA path's up to kernel rounding (pixel-mode noise aside).

Randomness: per batch, erasing and mixup parameters come from a ``numpy.random.Generator`` seeded by
``(seed, rank, epoch, batch)`` on the producer thread - so a run is reproducible, ranks draw
differently (timm seeds each rank with ``seed + rank``), the parameters need no device sync, CPU and
CUDA draw the same boxes and lams, and a pass resumed at batch ``k`` (``load_state_dict``) draws what
an uninterrupted one draws from there. Pixel-mode noise comes from the loader's own ``torch.Generator``
on the device, reseeded from the same words each batch. Global RNG is never touched.

Position: ``state_dict()`` is the rank's position (``raypipe.plan.position``): the pass's epoch, the
trainer's count of batches, and where a source with ``state_dict(batches=…)`` (``EpochSource``, …) is
after them, so the batches the producer made ahead are made again after a resume, not lost.
"""

from __future__ import annotations

import atexit
import dataclasses
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from raypipe._values import check_int, fail
from raypipe.device.batch import LAYOUTS
from raypipe.device.erasing import RandomErasing
from raypipe.device.mixup import Mixup
from raypipe.device.normalize import Normalize
from raypipe.device.producer import END, BatchProducer, Failure, ProducerPass
from raypipe.device.staging import Staging
from raypipe.plan.position import Position, read_positions

__all__ = ["DeviceLoader", "LoaderStats"]

# Loaders whose producer thread may still run. A process that ends with a pass unfinished (a script
# that takes a few batches and exits without close()) would leave the daemon producer inside torch's
# C++ code while Python finalises, and the runtime aborts the process ("terminate called without an
# active exception", exit 134); the passes are stopped before that instead, each given a few seconds
# (a producer blocked in its source's next() cannot see the stop, and an exit should not hang on it).
_LIVE: weakref.WeakSet = weakref.WeakSet()
_EXIT_STOP_S = 5.0


@atexit.register
def _stop_live_passes() -> None:
    for loader in list(_LIVE):
        loader._stop(loader._active, timeout_s=min(loader.close_timeout_s, _EXIT_STOP_S))


@dataclass
class LoaderStats:
    """Per-epoch counters (reset when an epoch starts). ``wait_s``: time the consumer was blocked."""

    epoch: int = 0
    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclasses.dataclass
class _Pass:
    """One pass over the source: its epoch, the batches the trainer took (resumed ones counted), and
    whether it ran to its end."""

    epoch: int
    taken: int
    finished: bool = False


class DeviceLoader:
    """Wrap an iterable of packed batches; yield them on ``device`` normalised, optionally erased and mixed.

    Batches are dicts (``image`` uint8 NHWC/NCHW numpy or torch, ``label`` int, ``sample_id`` int,
    other keys passed through) or ``(image, label, ...)`` tuples such as a torch DataLoader with timm's
    ``fast_collate`` yields. Output has the same structure: ``image`` NCHW in ``normalize``'s dtype
    (float32 on CPU, float16 on CUDA unless ``Normalize(dtype=...)`` says otherwise; channels_last
    unless ``Normalize(channels_last=False)``), ``label`` int64 class indices or, with ``mixup``,
    float32 soft targets (N, num_classes); ``sample_id`` int64 on the device. Normalise, erase and mix
    run in timm's order. ``loader.mixup_enabled = False`` stops mixing from the next batch produced
    (timm's ``--mixup-off-epoch``); targets stay soft (smoothed one-hot), as timm's. The first pass is
    the source's next epoch where it says one (``EpochSource``, ``FeederSource``), else 0 (``set_epoch``
    moves both).

    Args:
        source: the batches (an iterable; ``len()`` is its length).
        device: "cpu" or "cuda[:n]".
        normalize: a :class:`Normalize` (default: ImageNet mean/std, the device's dtype).
        erasing: a :class:`RandomErasing` or None (as is one whose probability is 0).
        mixup: a :class:`Mixup` or None.
        prefetch: batches ready ahead of the consumer (>= 1); the host ring has ``prefetch + 1`` slots.
        pin_memory: pinned host slots on CUDA (truly asynchronous copies); no effect on CPU.
        layout: "auto" detects NHWC/NCHW from the channel count; declare it for ambiguous shapes.
        seed, rank: random draws per batch from ``(seed, rank, epoch, batch)``; ``rank=None`` takes
            ``torch.distributed``'s rank when it is initialised, else 0.
        close_timeout_s: how long stopping a pass waits for the producer thread.

    Raises:
        ValueError: an invalid argument, naming it (a device other than CPU or CUDA, or CUDA
            unavailable; a part of the wrong type; an unknown layout; ``prefetch`` < 1; ``seed`` or
            ``rank`` < 0).

    >>> src = [{"image": np.zeros((2, 4, 4, 3), np.uint8), "label": np.array([0, 1])}]
    >>> with DeviceLoader(src) as loader:
    ...     [(tuple(b["image"].shape), b["image"].dtype) for b in loader]
    [((2, 3, 4, 4), torch.float32)]
    """

    def __init__(
        self,
        source: Iterable,
        *,
        device: str | torch.device = "cpu",
        normalize: Normalize | None = None,
        erasing: RandomErasing | None = None,
        mixup: Mixup | None = None,
        prefetch: int = 2,
        pin_memory: bool = True,
        layout: str = "auto",
        seed: int = 0,
        rank: int | None = None,
        close_timeout_s: float = 30.0,
    ) -> None:
        self.device = _device(device)
        self.normalize = Normalize() if normalize is None else normalize
        for name, value, cls in (
            ("normalize", self.normalize, Normalize),
            ("erasing", erasing, RandomErasing),
            ("mixup", mixup, Mixup),
        ):
            if value is not None and not isinstance(value, cls):
                fail(name, value, f"expected a raypipe.device.{cls.__name__} (or None)")
        self.erasing = erasing if erasing is not None and erasing.enabled else None
        self.mixup = mixup
        self.img_dtype = self.normalize.dtype_on(self.device)
        if layout not in LAYOUTS:
            fail("layout", layout, f"expected one of {LAYOUTS}")
        self.layout = layout
        self.prefetch = check_int("prefetch", prefetch, 1)
        if not isinstance(pin_memory, bool):
            fail("pin_memory", pin_memory, "expected True or False")
        self.seed = check_int("seed", seed, 0)
        self.rank = _default_rank() if rank is None else check_int("rank", rank, 0)
        self.source = source
        self.close_timeout_s = float(close_timeout_s)
        self.stats = LoaderStats()
        self.last_wait_s = 0.0
        self._mixup_enabled = mixup is not None
        self._next_epoch = _source_epoch(source)
        self._first_batch = 0  # the next pass's first batch number (a resumed pass starts past 0)
        self._pass: _Pass | None = None  # the pass under way, or the last one
        self._staging = Staging(self.device, self.prefetch + 1, pin_memory=pin_memory)
        self._noise = torch.Generator(device=self.device)  # pixel-mode erasing noise, on the device
        self._active: ProducerPass | None = None
        self._closed = False
        _LIVE.add(self)

    # -- public surface ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.source)  # TypeError when the source has no length, like any unsized iterable

    @property
    def mixup_enabled(self) -> bool:
        """Whether batches are mixed; False when the loader has no ``Mixup``. Settable, as timm's."""
        return self._mixup_enabled

    @mixup_enabled.setter
    def mixup_enabled(self, value: bool) -> None:
        self._mixup_enabled = bool(value) and self.mixup is not None

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (passes count up from 0 otherwise), e.g. after a resume: its
        draws are seeded with it, and a source that has ``set_epoch`` (``EpochSource``, ``FeederSource``)
        is moved there too, so the batches and the draws belong to the same epoch."""
        epoch = check_int("epoch", epoch, 0)
        if epoch != self._next_epoch:
            self._first_batch = 0  # a loaded position belongs to its own epoch
        self._next_epoch = epoch
        move = getattr(self.source, "set_epoch", None)
        if move is not None:
            move(epoch)

    @property
    def next_epoch(self) -> int:
        """The epoch the next pass (``iter()``) runs."""
        return self._next_epoch

    def state_dict(self) -> dict:
        """The position to resume from (``raypipe.plan.position.Position.as_dict()``): the epoch, the
        batches the trainer has taken in it, and where the source is after them (its position, where it
        has one; else the epoch and the count only)."""
        if self._pass is not None and not self._pass.finished:
            epoch, batches = self._pass.epoch, self._pass.taken
            source = _source_state(self.source, batches)
        else:  # between passes: the next one from its start (or from a loaded position)
            epoch, batches = self._next_epoch, self._first_batch
            source = _source_state(self.source, None)
        if source is None:
            return Position(epoch=epoch, batches=batches).as_dict()
        position = Position.from_dict(source)
        if position.epoch != epoch:
            raise ValueError(
                f"this DeviceLoader's pass is epoch {epoch} and its source is in epoch {position.epoch}: "
                "set_epoch(e) on the loader moves both"
            )
        return position.with_batches(batches).as_dict()

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Make the next pass go on from ``state``: this rank's own position, or the list of every rank's
        (a run resumed on another number of ranks; the source re-splits what is left, ``EpochSource``),
        as any raypipe loader saved it (``raypipe.plan.position.read_positions``)."""
        saved = read_positions(state)
        if saved.placed:
            load = getattr(self.source, "load_state_dict", None)
            if load is None:
                raise ValueError(
                    f"the state holds a source position, and the source {type(self.source).__name__} "
                    "has no load_state_dict"
                )
            load(saved.as_state())
        self._stop(self._active)
        self._pass = None
        self._next_epoch = saved.epoch
        self._first_batch = saved.batches

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("DeviceLoader is closed")
        self._stop(self._active)  # a new pass ends an unfinished previous one
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        first, self._first_batch = self._first_batch, 0
        self._pass = _Pass(epoch, first)
        self.stats, self.last_wait_s = LoaderStats(epoch=epoch), 0.0
        return self._consume(epoch, first)

    def close(self) -> None:
        """Stop the producer thread, wait for pending copies, free the ring, and close the source if it
        has a ``close()`` (e.g. an ``EpochSource`` with a warmed-up next epoch). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop(self._active)
        self._staging.close()
        close_source = getattr(self.source, "close", None)
        if callable(close_source):
            close_source()

    def __enter__(self) -> DeviceLoader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- consumer side ----------------------------------------------------------------------------

    def _consume(self, epoch: int, first: int) -> Iterator[Any]:
        # The thread starts with the first next(): an iterator never advanced holds no thread.
        self._stop(self._active)
        ep = self._active = ProducerPass(self.prefetch)
        this_pass = self._pass
        producer = BatchProducer(
            normalize=self.normalize,
            erasing=self.erasing,
            mixup=self.mixup,
            layout=self.layout,
            img_dtype=self.img_dtype,
            seed=self.seed,
            rank=self.rank,
            staging=self._staging,
            noise=self._noise,
            mixup_on=lambda: self._mixup_enabled,  # read per batch: a switch from the trainer lands mid-pass
        )
        ep.thread = threading.Thread(
            target=producer.run,
            args=(self.source, ep, epoch, first),
            name=f"raypipe-device-loader-{id(self):x}",
            daemon=True,
        )
        ep.thread.start()
        try:
            while True:
                # 6. take the next ready batch; the time blocked here is the data stall
                start = time.perf_counter()
                item = self._take(ep)
                self.last_wait_s = time.perf_counter() - start
                self.stats.wait_s += self.last_wait_s
                if item is END:
                    this_pass.finished = True
                    return
                if isinstance(item, Failure):
                    raise item.exc  # carries the producer-side traceback (source frames included)
                out, event, tensors, n = item
                # 7. the consumer's stream waits for the batch; its memory is protected until used
                self._staging.hand_over(event, tensors)
                self.stats.batches += 1
                self.stats.samples += n
                this_pass.taken += 1
                # 8. hand it to the training step
                yield out
        finally:
            self._stop(ep)

    def _take(self, ep: ProducerPass) -> Any:
        """The pass's next item; a pass ended from outside (a new pass, ``close()``) raises instead of
        waiting forever for a producer that has gone."""
        while True:
            if ep.stop.is_set():
                why = "the loader was closed" if self._closed else "a new pass (iter(loader)) ended it"
                raise RuntimeError(f"this DeviceLoader pass cannot continue: {why}")
            try:
                return ep.queue.get(timeout=0.2)
            except queue.Empty:
                continue

    def _stop(self, ep: ProducerPass | None, timeout_s: float | None = None) -> None:
        if ep is None or ep.thread is None:
            return
        ep.stop.set()
        while True:  # unblock a producer waiting on a full queue; drop what it made
            try:
                ep.queue.get_nowait()
            except queue.Empty:
                break
        if ep.thread is not threading.current_thread():
            timeout_s = self.close_timeout_s if timeout_s is None else timeout_s
            ep.thread.join(timeout_s)
            if ep.thread.is_alive():
                warnings.warn(
                    f"DeviceLoader producer did not stop within {timeout_s}s "
                    "(source blocked in next()?); it is a daemon thread and will not keep the process alive",
                    RuntimeWarning,
                    stacklevel=3,
                )
        if self._active is ep:
            self._active = None


def _source_state(source: Any, batches: int | None) -> dict | None:
    """The source's position after ``batches`` of its current epoch (None: its own count), where it has
    one."""
    state_dict = getattr(source, "state_dict", None)
    if state_dict is None:
        return None
    return state_dict() if batches is None else state_dict(batches=batches)


def _source_epoch(source: Any) -> int:
    """The epoch a source reads next, where it says (``next_epoch``), else 0."""
    epoch = getattr(source, "next_epoch", 0)
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0 else 0


def _device(device: str | torch.device) -> torch.device:
    try:
        out = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r}: {exc}") from None
    if out.type == "cuda":
        if not torch.cuda.is_available():
            fail("device", device, "CUDA is not available on this machine")
        if out.index is None:
            out = torch.device("cuda", torch.cuda.current_device())
    elif out.type != "cpu":
        fail("device", device, "expected a 'cpu' or 'cuda[:n]' device")
    return out


def _default_rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
